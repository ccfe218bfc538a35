"""The zoo's adapters of jmp and Flax drive the real ``jmp.DynamicLossScale`` and
``flax.training.dynamic_scale.DynamicScale``; Flax's snippets show its causes.

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


def test_flax_steps_the_real_dynamic_scale() -> None:
    """Flax's scaler through the adapter, eager and jitted: one growth period is
    growth_interval + 1 finite steps, and a skipped step changes no parameter."""
    pytest.importorskip("flax", reason=ZOO["flax"].install)
    from flax.training.dynamic_scale import DynamicScale

    from unifiedamp.conformance.zoo.flax_dynamic_scale import FlaxDynamicScale

    adapter = FlaxDynamicScale()
    for iterate in (adapter.iterate, adapter.compiled_iterate):
        handle = adapter.new(ScalerConfig(1024.0, growth_interval=2))
        before = adapter.snapshot(handle)
        handle = iterate(handle, "I")
        assert type(handle[0]) is DynamicScale
        assert (float(handle[0].scale), int(handle[0].fin_steps)) == (512.0, 0)
        assert _bits(adapter.snapshot(handle)) == _bits(before), "the inf step was not skipped"
        seen = []
        for _ in range(3):
            handle = iterate(handle, "F")
            seen.append((float(handle[0].scale), int(handle[0].fin_steps)))
        # fin_steps == growth_interval grows: on the third finite step, not the second.
        assert seen == [(512.0, 1), (512.0, 2), (1024.0, 0)], iterate
        assert _bits(adapter.snapshot(handle)) != _bits(before), "the finite steps changed nothing"

    # One scaler for two optimizers: a NaN in either skips both.
    handle = adapter.new(ScalerConfig(8.0), optimizers=2)
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "FN")
    assert float(handle[0].scale) == 4.0
    assert _bits(adapter.snapshot(handle)) == _bits(before)


def test_flax_first_update_is_float64_eagerly_and_its_floor_is_the_smallest_normal() -> None:
    pytest.importorskip("flax", reason=ZOO["flax"].install)
    from unifiedamp.conformance.zoo.flax_dynamic_scale import FlaxDynamicScale

    adapter = FlaxDynamicScale()
    config = ScalerConfig(77.0, backoff_factor=0.7)
    eager = adapter.iterate(adapter.new(config), "I")
    jitted = adapter.compiled_iterate(adapter.new(config), "I")
    assert float(eager[0].scale) == float(np.float32(77.0 * 0.7)) == 53.900001525878906
    assert float(jitted[0].scale) == float(np.float32(77.0) * np.float32(0.7))
    # Both are float32 arrays from then on: the second backoff multiplies in float32.
    eager = adapter.iterate(eager, "I")
    assert float(eager[0].scale) == float(np.float32(53.900001525878906) * np.float32(0.7))

    # min_scale=None leaves Flax's default floor, 2**-126; a min_scale is minimum_scale.
    handle = adapter.new(ScalerConfig(2.0**-125))
    assert handle[0].minimum_scale == 2.0**-126
    handle = adapter.iterate(adapter.iterate(handle, "I"), "I")
    assert float(handle[0].scale) == 2.0**-126
    handle = adapter.iterate(adapter.new(ScalerConfig(4.0, min_scale=3.0)), "I")
    assert (handle[0].minimum_scale, float(handle[0].scale)) == (3.0, 3.0)


def test_flax_saves_loads_and_reconfigures_its_fields() -> None:
    pytest.importorskip("flax", reason=ZOO["flax"].install)
    from unifiedamp.conformance.zoo.flax_dynamic_scale import FlaxDynamicScale

    adapter = FlaxDynamicScale()
    handle = adapter.new(ScalerConfig(64.0, 3.0, 0.25, 4, min_scale=2.0))
    handle = adapter.iterate(adapter.iterate(adapter.iterate(handle, "I"), "F"), "F")
    saved = json.loads(json.dumps(adapter.save(handle)))
    assert (saved["scale"], saved["growth_tracker"], saved["config"]["growth_factor"],
            saved["config"]["min_scale"]) == (16.0, 2, 3.0, 2.0)
    loaded = adapter.load(adapter.new(ScalerConfig()), saved)
    assert (float(loaded[0].scale), int(loaded[0].fin_steps), loaded[0].growth_factor,
            loaded[0].backoff_factor, loaded[0].growth_interval, loaded[0].minimum_scale) == (
        16.0, 2, 3.0, 0.25, 4, 2.0)
    with pytest.raises(ValueError, match="hysteresis_tracker=1"):
        adapter.load(loaded, {**saved, "hysteresis_tracker": 1})

    # A lowered interval keeps fin_steps (2) and the scale; 3 != 1, so no growth follows.
    changed = adapter.reconfigure(loaded, {"growth_interval": 1})
    assert (changed[0].growth_interval, int(changed[0].fin_steps), float(changed[0].scale)) == (
        1, 2, 16.0)
    changed = adapter.iterate(changed, "F")
    assert (float(changed[0].scale), int(changed[0].fin_steps)) == (16.0, 3)
    with pytest.raises(ValueError, match="hysteresis"):
        adapter.reconfigure(loaded, {"hysteresis": 2})


def test_flax_snippets_show_their_causes() -> None:
    pytest.importorskip("flax", reason=ZOO["flax"].install)
    from zoo_snippets import run_snippets

    lines = run_snippets(["flax"])
    assert "grows_one_step_late.py" in lines
    assert all(line.startswith("flax DynamicScale") for line in lines.values()), lines
