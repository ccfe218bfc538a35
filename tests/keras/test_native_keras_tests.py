"""Keras's own tests of ``keras.optimizers.LossScaleOptimizer`` (``loss_scale_optimizer_test.py``,
shipped inside the installed keras), run in process with the class they test replaced by
:class:`SpecLossScaleOptimizer`: the wrapper is a drop-in for the native class. The tests that
fail by design are listed in :data:`DIFFERENCES`, each with its reason, as
docs/backends/keras.md lists them.
"""

from __future__ import annotations

import importlib
import unittest

import pytest

NATIVE_TESTS = "keras.src.optimizers.loss_scale_optimizer_test"

#: Keras's tests the wrapper fails by design: test name -> why (docs/backends/keras.md,
#: "Keras's own tests").
DIFFERENCES = {
    "test_serialization": "get_config() holds one key more, scaler_config (the whole rule)",
}


def _native_case() -> type[unittest.TestCase]:
    return importlib.import_module(NATIVE_TESTS).LossScaleOptimizerTest


def _names() -> list[str]:
    return list(unittest.TestLoader().getTestCaseNames(_native_case()))


@pytest.mark.parametrize("name", _names())
def test_keras_own_test_passes_with_the_wrapper(name, monkeypatch):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    monkeypatch.setattr(importlib.import_module(NATIVE_TESTS), "LossScaleOptimizer",
                        SpecLossScaleOptimizer)
    result = unittest.TestResult()
    _native_case()(name).run(result)
    failures = [text for _, text in result.errors + result.failures]
    if result.skipped and not failures:
        pytest.skip(f"Keras skips it on this backend: {result.skipped[0][1]}")
    if name in DIFFERENCES:
        assert failures, f"{name} passes now: drop it from DIFFERENCES and the docs"
    else:
        assert not failures, "\n".join(failures)


def test_the_differences_are_keras_tests_and_documented():
    import pathlib

    assert set(DIFFERENCES) <= set(_names())
    page = pathlib.Path(__file__).parents[2] / "docs" / "backends" / "keras.md"
    for name in DIFFERENCES:
        assert f"| `{name}` |" in page.read_text(encoding="utf-8"), name
