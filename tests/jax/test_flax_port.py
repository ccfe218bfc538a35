"""Flax's ``DynamicScale`` as a port source and target, with the real Flax.

Its row in the natives' table against the installed class; a Flax-scaled run saved with
``flax.serialization`` (msgpack) and resumed under unifiedamp's JAX scaler through
``unifiedamp port-state``, bit-exact to the spec from the saved state; a unifiedamp run
written back and resumed under Flax; a live ``DynamicScale`` through ``from_native`` and
``to_dynamic_scale``; an Orbax checkpoint's entry. Flax grows when ``fin_steps ==
growth_interval``, one finite step later than the spec with the same number: each conversion
gives the spec config ``growth_interval + 1`` (and Flax's clamp as ``max_scale``), and each
test checks that both runs, resumed under the other framework, are the same bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import jax.numpy as jnp  # noqa: E402
from flax import serialization  # noqa: E402
from flax.training.dynamic_scale import DynamicScale  # noqa: E402
from port_runs import check_installed_signatures  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.porting import (  # noqa: E402
    config_from_call,
    dynamic_scale_kwargs,
    from_native,
    load_file,
    native_call,
    port_state_file,
    save_file,
    to_dynamic_scale,
)
from unifiedamp.spec import ScalerConfig, ScalerState  # noqa: E402

FLAX = "flax.training.dynamic_scale.DynamicScale"
F32_MAX = float(np.finfo(np.float32).max)
# Factors that are not powers of two: a scale that left float32 anywhere shows in its bits.
FIELDS = {"growth_factor": 1.5, "backoff_factor": 0.7, "growth_interval": 3}
PARAMS = {"w": jnp.ones(3)}


def loss_fn(params, x):
    return (params["w"] * x).sum()


@jax.jit
def flax_step(dynamic_scale, x):
    # Flax's examples' idiom: the wrapper returns the new scaler and is_fin.
    dynamic_scale, is_fin, _, _ = dynamic_scale.value_and_grad(loss_fn)(PARAMS, x)
    return dynamic_scale, is_fin


def inputs(flags):
    return [jnp.float32(1.0 if f == "F" else jnp.inf) for f in flags]


def run_flax(dynamic_scale, flags, eager=False):
    scales = []
    for x in inputs(flags):
        if eager:
            dynamic_scale = dynamic_scale.value_and_grad(loss_fn)(PARAMS, x)[0]
        else:
            dynamic_scale = flax_step(dynamic_scale, x)[0]
        scales.append(spec.f32_bits(float(dynamic_scale.scale)))
    return scales, dynamic_scale


@jax.jit
def ua_step(scaler, x):
    # The JAX backend's idiom: scale the loss, differentiate, unscale, update.
    grads = jax.grad(lambda p: scaler.scale(loss_fn(p, x)))(PARAMS)
    _, finite = scaler.unscale(grads)
    return scaler.update(finite)


def run_ua(scaler, flags):
    scales = []
    for x in inputs(flags):
        scaler = ua_step(scaler, x)
        scales.append(spec.f32_bits(scaler.get_scale()))
    return scales


def run_spec(config, state, flags):
    scales = []
    for f in flags:
        state = spec.update(config, state, f == "I")
        scales.append(spec.f32_bits(state.scale))
    return scales


def port_state(*args):
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", *map(str, args)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_row_is_the_installed_class_and_ports_its_defaults():
    assert check_installed_signatures({FLAX: DynamicScale}) == 1
    config, notes = config_from_call(FLAX)
    defaults = DynamicScale()
    assert config == ScalerConfig(defaults.scale, defaults.growth_factor, defaults.backoff_factor,
                                  defaults.growth_interval, min_scale=float(defaults.minimum_scale))
    assert "default: minimum_scale=1.1754943508222875e-38 (min_scale=1.1754943508222875e-38)" \
        in notes
    kwargs, problems = native_call(ScalerConfig(hysteresis=2, max_scale=8.0), FLAX)
    assert problems == [f"{FLAX} cannot express hysteresis=2 (it hard-codes 1): "
                        "unifiedamp's jax backend can: ua.GradScaler(..., backend='jax')",
                        f"{FLAX} cannot express max_scale=8.0 (it hard-codes None): "
                        "unifiedamp's jax backend can: ua.GradScaler(..., backend='jax')"]
    # What native_call writes builds the class with the same fields.
    kwargs, _ = native_call(config, FLAX)
    assert DynamicScale(**kwargs) == defaults


def test_a_flax_msgpack_checkpoint_resumes_under_unifiedamp_bit_exact(tmp_path):
    # Train under Flax, one overflow, then save the whole train state as Flax's examples do.
    dynamic_scale = DynamicScale(**FIELDS, scale=1024.0)
    _, dynamic_scale = run_flax(dynamic_scale, "FFIFF")
    saved = tmp_path / "checkpoint.msgpack"
    saved.write_bytes(serialization.to_bytes(
        {"step": 5, "params": PARAMS, "dynamic_scale": dynamic_scale}))

    resumed = tmp_path / "resumed.msgpack"
    out = port_state(saved, "--to", "canonical", "-o", resumed,
                     "--config", json.dumps(FIELDS))
    assert "entry 'dynamic_scale', flax form" in out
    assert "growth_interval=4: DynamicScale(growth_interval=3) grows when fin_steps == 3" in out
    assert "The resumed run continues Flax's trajectory" in out
    checkpoint = load_file(resumed)
    assert checkpoint["step"] == 5
    np.testing.assert_array_equal(checkpoint["params"]["w"], PARAMS["w"])
    # The config with DynamicScale's trajectory: one more step per growth, its clamp as
    # max_scale, its default floor of 2**-126 (not given), its current scale as init_scale.
    config = ScalerConfig(float(dynamic_scale.scale), 1.5, 0.7, 4, min_scale=2.0**-126,
                          max_scale=F32_MAX)
    assert checkpoint["dynamic_scale"]["config"] == config.to_dict()

    # The whole train state restores into a template holding unifiedamp's scaler.
    template = {"step": 0, "params": PARAMS, "dynamic_scale": ua.GradScaler(backend="jax")}
    restored = serialization.from_bytes(template, resumed.read_bytes())
    scaler = restored["dynamic_scale"]
    state = ScalerState(float(dynamic_scale.scale), int(dynamic_scale.fin_steps), 0)
    assert spec.f32_bits(scaler.get_scale()) == spec.f32_bits(state.scale)

    flags = "FFFFIFFFFFFFF"
    got = run_ua(scaler, flags)
    assert got == run_spec(config, state, flags)
    # Continuing with Flax instead gives the same bits.
    template_flax = {"step": 0, "params": PARAMS, "dynamic_scale": DynamicScale(**FIELDS)}
    flax_again = serialization.from_bytes(template_flax, saved.read_bytes())["dynamic_scale"]
    flax_scales, _ = run_flax(flax_again, flags)
    assert flax_scales == got
    # With growth_interval=3 kept as it is, the spec would grow a step sooner.
    assert run_spec(config.replace(growth_interval=3), state, flags) != got


def test_a_unifiedamp_run_resumes_under_flax(tmp_path):
    # 110 backs off to 77, and 77 * 0.7 rounds to another float32 from float64 (53.9000015)
    # than as a float32 product (53.8999977): Flax's first update below shows which.
    config = ScalerConfig(110.0, **FIELDS, min_scale=0.5)
    scaler = ua.GradScaler(**config.to_dict(), backend="jax")
    for x in inputs("FFIF"):
        scaler = ua_step(scaler, x)
    saved = tmp_path / "scaler.json"
    save_file(scaler.state_dict(), saved)
    written = tmp_path / "dynamic_scale.msgpack"
    out = port_state(saved, "--to", "flax", "-o", written)
    assert "into DynamicScale(**{'growth_factor': 1.5, 'backoff_factor': 0.7, " \
        "'growth_interval': 2, 'scale': 110.0, 'minimum_scale': 0.5})" in out

    dynamic_scale = serialization.from_bytes(DynamicScale(**dynamic_scale_kwargs(config)),
                                             written.read_bytes())
    live = to_dynamic_scale(scaler)
    state = ScalerState(scaler.get_scale(), 1, 0)
    for restored in (dynamic_scale, live):
        assert spec.f32_bits(float(restored.scale)) == spec.f32_bits(state.scale)
        assert int(restored.fin_steps) == 1 and restored.minimum_scale == 0.5
        # Eagerly, as a restored float32 leaf multiplies in float32 (a Python float would
        # round the first product from float64).
        scales, _ = run_flax(restored, "IFFFFIFF", eager=True)
        assert scales == run_spec(config, state, "IFFFFIFF")


def test_from_native_reads_a_live_dynamic_scale_and_runs_the_spec():
    _, dynamic_scale = run_flax(DynamicScale(**FIELDS, scale=1024.0), "FFIF")
    scaler = from_native(dynamic_scale)
    state = ScalerState(float(dynamic_scale.scale), int(dynamic_scale.fin_steps), 0)
    assert scaler.backend == "jax"
    assert scaler.config == ScalerConfig(state.scale, 1.5, 0.7, 4, min_scale=2.0**-126,
                                         max_scale=F32_MAX)
    flags = "FFFFIFFFF"
    assert run_ua(scaler, flags) == run_spec(scaler.config, state, flags) \
        == run_flax(dynamic_scale, flags)[0]
    back = to_dynamic_scale(scaler)
    assert (back.growth_interval, int(back.fin_steps)) == (3, int(dynamic_scale.fin_steps))
    assert run_flax(back, flags)[0] == run_flax(dynamic_scale, flags)[0]


def test_a_config_flax_cannot_hold_is_refused_naming_it(tmp_path):
    scaler = ua.GradScaler(1024.0, hysteresis=2, backend="jax")
    with pytest.raises(ValueError, match="DynamicScale cannot hold hysteresis=2"):
        to_dynamic_scale(scaler)
    saved = tmp_path / "scaler.json"
    save_file(scaler.state_dict(), saved)
    with pytest.raises(ValueError, match="the flax form cannot carry hysteresis=2"):
        port_state_file(saved, tmp_path / "out.msgpack", to="flax")
    assert not (tmp_path / "out.msgpack").exists()


@pytest.mark.filterwarnings("ignore:Sharding info not provided:UserWarning")
def test_an_orbax_checkpoint_entry_converts(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    _, dynamic_scale = run_flax(DynamicScale(**FIELDS, scale=1024.0), "FFIFF")
    path = tmp_path / "orbax"
    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(path, {"params": PARAMS,
                             "dynamic_scale": serialization.to_state_dict(dynamic_scale)})
    result = port_state_file(path, to="canonical", config=ScalerConfig(**FIELDS),
                             config_fields=tuple(FIELDS))
    assert result["key"] == "dynamic_scale" and result["from"] == "flax"
    assert result["state"] == {"scale": float(dynamic_scale.scale),
                               "growth_tracker": int(dynamic_scale.fin_steps),
                               "hysteresis_tracker": 0}
    # Into a new Orbax folder through the command, the rest of the checkpoint kept.
    out = port_state(path, "--to", "canonical", "-o", tmp_path / "resumed",
                     "--config", json.dumps(FIELDS))
    assert "the rest of the checkpoint kept" in out and "continues Flax's trajectory" in out
    restored = ocp.PyTreeCheckpointer().restore(tmp_path / "resumed")
    np.testing.assert_array_equal(restored["params"]["w"], PARAMS["w"])
    scaler = ua.GradScaler(backend="jax").restore(restored["dynamic_scale"])
    assert scaler.state == ScalerState(float(dynamic_scale.scale), 2, 0)
    assert scaler.config.growth_interval == 4
    # An existing folder is not replaced (that would delete it before the new one is whole).
    with pytest.raises(ValueError, match="exists: an Orbax checkpoint is written to a new"):
        port_state_file(path, tmp_path / "resumed", to="canonical")
    assert ocp.PyTreeCheckpointer().restore(tmp_path / "resumed")["dynamic_scale"] \
        == restored["dynamic_scale"]
