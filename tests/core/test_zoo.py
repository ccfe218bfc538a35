"""The zoo's adapters of jmp, Keras 3 and Paddle list their differences from the spec, each
naming a test of the suite (the adapters driving the real scalers: ``test_zoo.py`` in
tests/jax, tests/keras and tests/paddle)."""

from __future__ import annotations

import importlib

import pytest

from unifiedamp import spec
from unifiedamp.conformance.contract import ScalerContract
from unifiedamp.conformance.zoo import Difference

MODULES = ("jmp_loss_scale", "keras_loss_scale_optimizer", "paddle_grad_scaler")


@pytest.mark.parametrize("module", MODULES)
def test_every_difference_names_a_test_of_the_suite(module: str) -> None:
    differences = importlib.import_module(f"unifiedamp.conformance.zoo.{module}").DIFFERENCES
    vectors = {v.name for v in spec.VECTORS}
    assert differences, f"{module} lists no differences"
    for test_id, difference in differences.items():
        name, _, param = test_id.partition("[")
        assert callable(getattr(ScalerContract, name, None)), f"{test_id}: no such test"
        assert not param or param.rstrip("]") in vectors, f"{test_id}: no such vector"
        assert isinstance(difference, Difference)
        assert all(len(field) > 20 for field in difference), f"{test_id}: a field is empty"
