"""The zoo's adapter of jmp drives the real ``jmp.DynamicLossScale``.

Each check looks at the native object after the adapter's steps (its scale, its
parameters, the class it is), so an adapter that fell back on this project's own
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


def test_jmp_steps_the_real_dynamic_loss_scale() -> None:
    jmp = pytest.importorskip("jmp", reason=ZOO["jmp"].install)
    from unifiedamp.conformance.zoo.jmp_loss_scale import JmpDynamicLossScale

    adapter = JmpDynamicLossScale()
    handle = adapter.new(ScalerConfig(1024.0, growth_interval=2))
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "I")
    assert type(handle[0]) is jmp.DynamicLossScale
    assert float(handle[0].loss_scale) == 512.0 and int(handle[0].counter) == 0
    assert _bits(adapter.snapshot(handle)) == _bits(before), "the inf step was not skipped"
    handle = adapter.iterate(adapter.iterate(handle, "F"), "F")
    assert float(handle[0].loss_scale) == 1024.0 and int(handle[0].counter) == 0
    assert _bits(adapter.snapshot(handle)) != _bits(before), "the finite steps changed nothing"

    # One loss scale for two optimizers: an inf in either skips both.
    handle = adapter.new(ScalerConfig(8.0), optimizers=2)
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "FI")
    assert float(handle[0].loss_scale) == 4.0
    assert _bits(adapter.snapshot(handle)) == _bits(before)


def test_jmp_floor_holds_eagerly_and_is_lost_under_jit() -> None:
    """The documented difference, seen on jmp's own object: tree_flatten drops the floor."""
    pytest.importorskip("jmp", reason=ZOO["jmp"].install)
    from unifiedamp.conformance.zoo.jmp_loss_scale import JmpDynamicLossScale

    adapter = JmpDynamicLossScale()
    config = ScalerConfig(4.0, min_scale=1.5)
    eager = adapter.iterate(adapter.iterate(adapter.new(config), "I"), "I")
    assert float(eager[0].loss_scale) == 1.5 and float(eager[0].min_loss_scale) == 1.5
    jitted = adapter.compiled_iterate(adapter.compiled_iterate(adapter.new(config), "I"), "I")
    assert float(jitted[0].loss_scale) == 1.0 and float(jitted[0].min_loss_scale) == 1.0


def test_jmp_runs_one_factor_and_reloads_its_fields() -> None:
    pytest.importorskip("jmp", reason=ZOO["jmp"].install)
    from unifiedamp.conformance.contract import fit
    from unifiedamp.conformance.zoo.jmp_loss_scale import JmpDynamicLossScale

    adapter = JmpDynamicLossScale()
    assert fit(adapter, ScalerConfig(growth_factor=4.0)).backoff_factor == 0.25
    assert fit(adapter, ScalerConfig(growth_factor=3.0)) is None  # 1/3 rounds differently
    with pytest.raises(ValueError, match="hysteresis=2"):
        adapter.new(ScalerConfig(hysteresis=2))
    handle = adapter.new(ScalerConfig(64.0, 4.0, 0.25, 3))
    handle = adapter.iterate(adapter.iterate(adapter.iterate(handle, "F"), "F"), "F")
    assert float(handle[0].loss_scale) == 256.0
    handle = adapter.iterate(handle, "F")
    saved = json.loads(json.dumps(adapter.save(handle)))
    assert (saved["scale"], saved["growth_tracker"], saved["config"]["growth_factor"]) == (
        256.0, 1, 4.0)
    loaded = adapter.load(adapter.new(ScalerConfig()), saved)
    assert (float(loaded[0].loss_scale), int(loaded[0].counter), loaded[0].factor,
            loaded[0].period) == (256.0, 1, 4.0, 3)
