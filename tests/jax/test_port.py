"""Porting on JAX (``unifiedamp.porting``) through jmp: a jmp call's config follows jmp's own
``adjust`` over a forced-overflow sequence down to its floor; native_call's keyword arguments
build a real jmp loss scale, from_native keeps its state as unifiedamp's jax scaler, and the
problem line about jmp's floor under ``jit`` is true; jmp's static and no-op scales."""

from __future__ import annotations

import pytest

jmp = pytest.importorskip("jmp")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from port_runs import KINDS, hexes, reference  # noqa: E402

from unifiedamp.porting import config_from_call, from_native, native_call  # noqa: E402
from unifiedamp.spec import ScalerConfig, ScalerState  # noqa: E402


def jmp_run(loss_scale, kinds: str):
    scales = []
    for kind in kinds:
        loss_scale = loss_scale.adjust(jnp.asarray(kind == "F"))
        scales.append(float(loss_scale.loss_scale))
    return scales, loss_scale


JMP_CALLS = [((2.0**10,), {"period": 3}), ((2.0**10, 0, 3, 4), {}),
             ((2.0,), {"period": 4, "min_loss_scale": 0.5})]


@pytest.mark.parametrize(("args", "kwargs"), JMP_CALLS)
def test_jmp_call_config_follows_jmps_own_trajectory(args, kwargs):
    arrays = tuple(jnp.float32(a) if isinstance(a, float) else a for a in args)
    config, _ = config_from_call("jmp.DynamicLossScale", arrays, kwargs)
    kinds = KINDS + "IIIIII"  # down to the floor
    scales, _ = jmp_run(jmp.DynamicLossScale(*arrays, **{
        k: jnp.float32(v) if k == "min_loss_scale" else v for k, v in kwargs.items()}), kinds)
    assert hexes(scales) == reference(config, kinds)


def test_jmp_round_trip_state_and_the_jit_floor():
    config = ScalerConfig(1024.0, growth_interval=3, min_scale=0.5)
    kwargs, problems = native_call(config, "jmp")
    assert "drops min_loss_scale=0.5" in problems[0]
    native = jmp.DynamicLossScale(jnp.float32(kwargs["loss_scale"]), period=kwargs["period"],
                                  factor=int(kwargs["factor"]),
                                  min_loss_scale=jnp.float32(kwargs["min_loss_scale"]))
    assert from_native(native).config == config
    _, native = jmp_run(native, "FFIFF")
    ours = from_native(native)
    assert ours.backend == "jax" and ours.state == ScalerState(512.0, 2, 0)
    a, _ = jmp_run(native, KINDS)
    b = []
    for kind in KINDS:
        ours = ours.update(jnp.asarray(kind == "F"))
        b.append(ours.get_scale())
    assert hexes(a) == hexes(b)
    # The problem line is true: through jit, jmp's floor is 1.0 again.
    low = jmp.DynamicLossScale(jnp.float32(1.0), min_loss_scale=jnp.float32(0.5))
    assert float(low.adjust(jnp.asarray(False)).loss_scale) == 0.5
    jitted = jax.jit(lambda s: s.adjust(jnp.asarray(False)))(low)
    assert float(jitted.loss_scale) == 1.0


def test_jmp_static_and_noop():
    static = from_native(jmp.StaticLossScale(jnp.float32(128.0)))
    assert static.config == ScalerConfig(128.0, dynamic=False) and static.get_scale() == 128.0
    assert not from_native(jmp.NoOpLossScale()).is_enabled()
