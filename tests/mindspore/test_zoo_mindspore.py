"""The zoo's adapter of MindSpore drives the real ``mindspore.amp.DynamicLossScaler``.

Each check looks at the native objects after the adapter's steps (the scaler's Parameters,
the optimizers' Parameters, the class), so an adapter that fell back on this project's own
scalers, or skipped the native calls, fails.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from unifiedamp.conformance.zoo import ZOO
from unifiedamp.spec import ScalerConfig


def _bits(arrays: list[np.ndarray]) -> list[bytes]:
    return [np.asarray(a).tobytes() for a in arrays]


def _native(handle) -> tuple[float, int]:
    return (float(handle[0].scale_value.asnumpy()), int(handle[0].counter.asnumpy()))


def test_mindspore_steps_the_real_dynamic_loss_scaler() -> None:
    mindspore = pytest.importorskip("mindspore", reason=ZOO["mindspore"].install)
    from unifiedamp.conformance.zoo.mindspore_loss_scaler import MindSporeDynamicLossScaler

    adapter = MindSporeDynamicLossScaler()
    handle = adapter.new(ScalerConfig(1024.0, growth_interval=2))
    assert type(handle[0]) is mindspore.amp.DynamicLossScaler
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "N")
    assert _native(handle) == (512.0, 0)
    assert _bits(adapter.snapshot(handle)) == _bits(before), "the NaN step was taken"
    seen = []
    for _ in range(3):
        handle = adapter.iterate(handle, "F")
        seen.append(_native(handle))
    # counter == scale_window - 1 grows: on the second finite step, as the spec.
    assert seen == [(512.0, 1), (1024.0, 0), (1024.0, 1)]
    assert _bits(adapter.snapshot(handle)) != _bits(before), "the finite steps did nothing"

    # One scaler for two optimizers: an inf in either skips both.
    handle = adapter.new(ScalerConfig(8.0), optimizers=2)
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "FI")
    assert _native(handle) == (4.0, 0)
    assert _bits(adapter.snapshot(handle)) == _bits(before)

    # The floor of 1: from 2, two overflows give 1 and 1.
    handle = adapter.iterate(adapter.iterate(adapter.new(ScalerConfig(2.0)), "I"), "I")
    assert _native(handle) == (1.0, 0)


def test_mindspore_runs_integer_powers_of_two_and_reloads_its_parameters() -> None:
    pytest.importorskip("mindspore", reason=ZOO["mindspore"].install)
    from unifiedamp.conformance.contract import fit
    from unifiedamp.conformance.zoo.mindspore_loss_scaler import MindSporeDynamicLossScaler

    adapter = MindSporeDynamicLossScaler()
    assert fit(adapter, ScalerConfig(growth_factor=4.0)).backoff_factor == 0.25
    assert fit(adapter, ScalerConfig(growth_factor=3.0)) is None
    with pytest.raises(ValueError, match="scale_value=0.5"):
        adapter.new(ScalerConfig(0.5))
    handle = adapter.new(ScalerConfig(64.0, 4.0, 0.25, 3))
    for kind in "IFF":
        handle = adapter.iterate(handle, kind)
    saved = json.loads(json.dumps(adapter.save(handle)))
    assert (saved["scale"], saved["growth_tracker"], saved["config"]["growth_factor"]) == (
        16.0, 2, 4.0)
    loaded = adapter.load(adapter.new(ScalerConfig()), saved)
    assert (*_native(loaded), loaded[0].scale_factor, loaded[0].scale_window) == (16.0, 2, 4, 3)
    loaded = adapter.iterate(loaded, "F")
    assert _native(loaded) == (64.0, 0)
    with pytest.raises(ValueError, match="hysteresis_tracker=1"):
        adapter.load(loaded, {**saved, "hysteresis_tracker": 1})


def test_mindspore_snippets_show_their_causes() -> None:
    pytest.importorskip("mindspore", reason=ZOO["mindspore"].install)
    from zoo_snippets import run_snippets

    lines = run_snippets(["mindspore"])
    assert sorted(lines) == ["counts_modulo_the_interval.py", "floor_of_1.py"]
    assert all(line.startswith("mindspore DynamicLossScaler") for line in lines.values())
