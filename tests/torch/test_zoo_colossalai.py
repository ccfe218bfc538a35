"""The zoo's Colossal-AI adapter drives the real DynamicGradScaler inside its fp16 optimizer.

The adapter opens a one-rank process group, which would make the torch backend's tests in
this process all-reduce: everything that builds a scaler runs once, in the module's
``probe`` fixture, which ends the group before any test reads its findings.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from unifiedamp.conformance.zoo import ZOO
from unifiedamp.conformance.zoo.colossalai_grad_scaler import ColossalAIDynamicGradScaler
from unifiedamp.spec import ScalerConfig

pytest.importorskip("colossalai", reason=f"needs Colossal-AI: {ZOO['colossalai'].install}")


def _run(adapter, config, steps):
    """``steps`` iterations of a new handle: the handle, the state and whether the
    parameters or Adam's state changed after each."""
    h = adapter.new(ScalerConfig(**config))
    states, stepped = [], []
    for kind in steps:
        before = adapter.snapshot(h)
        h = adapter.iterate(h, kind)
        after = adapter.snapshot(h)
        stepped.append(len(after) != len(before)
                       or any(not np.array_equal(x, y, equal_nan=True)
                              for x, y in zip(before, after, strict=False)))
        s = adapter.read(h)
        states.append([s.scale, s.growth_tracker, s.hysteresis_tracker])
    return h, states, stepped


def _probe() -> dict:
    """What the tests below check, from runs of the adapter; every handle (and what in it
    holds the process group) is gone when this returns."""
    a = ColossalAIDynamicGradScaler()
    out = {}
    h, _, _ = _run(a, {"init_scale": 1024.0}, "")
    scaler = h[0].mixed_precision.grad_scaler
    out["scaler"] = f"{type(scaler).__module__}.{type(scaler).__qualname__}"
    out["optimizer"] = f"{type(h[0]).__module__}.{type(h[0]).__qualname__}"

    # hysteresis 2, interval 3: the documented counter that neither a backoff nor an F resets.
    out["hysteresis"] = _run(a, {"init_scale": 1024.0, "growth_interval": 3, "hysteresis": 2},
                             "IFIIFFF")[1:]

    # The growth step divides by the new scale: Adam's first moment is 0.1 * the gradient.
    moments = {}
    for interval in (1, 2):
        h, _, _ = _run(a, {"init_scale": 1024.0, "growth_interval": interval}, "F")
        state = h[0].optim.state[h[1].weight]
        moments[interval] = float(state["exp_avg"].flatten()[0])
    out["moments"] = moments

    h, _, _ = _run(a, {"init_scale": 1024.0, "growth_interval": 4, "hysteresis": 2,
                       "min_scale": 2.0}, "FFI")
    saved = json.loads(json.dumps(a.save(h)))
    out["saved"] = saved
    resumed = a.load(a.new(ScalerConfig()), saved)
    s = a.read(resumed)
    out["resumed"] = [s.scale, s.growth_tracker, resumed[2].to_dict()]
    return out


@pytest.fixture(scope="module")
def probe() -> dict:
    """The probe's findings, once per module (per xdist worker that runs its tests), with
    the one-rank group the adapter opened ended, checked, before any test runs."""
    import torch.distributed as dist

    from unifiedamp.conformance.adapters.torch import PINNING_MODULES, destroy_process_group

    # Imported after the group starts, these would hold it past its end.
    for module in PINNING_MODULES:
        importlib.import_module(module)
    opened = not dist.is_initialized()
    try:
        findings = _probe()
    except BaseException:
        if opened and dist.is_initialized():
            dist.destroy_process_group()
        raise
    if opened:
        destroy_process_group()  # raises if anything the probe built still holds the group
    return findings


def test_the_adapter_builds_colossalais_fp16_optimizer_and_scaler(probe: dict) -> None:
    assert probe["scaler"] == ("colossalai.amp.naive_amp.grad_scaler.dynamic_grad_scaler."
                               "DynamicGradScaler")
    assert probe["optimizer"] == ("colossalai.amp.naive_amp.mixed_precision_optimizer."
                                  "MixedPrecisionOptimizer")


def test_overflows_skip_and_back_off_with_colossalais_hysteresis_counter(probe: dict) -> None:
    # I F I I F F F, hysteresis 2, interval 3: the F leaves the counter at 1, so the
    # second I backs off (the spec would not), and so does the third; FFF grows.
    states, stepped = probe["hysteresis"]
    assert [s[0] for s in states] == [1024.0, 1024.0, 512.0, 256.0, 256.0, 256.0, 512.0]
    assert [s[1] for s in states] == [0, 1, 0, 0, 1, 2, 0]
    assert all(s[2] is None for s in states)
    assert stepped == [False, True, False, False, True, True, True]


def test_the_growth_step_is_unscaled_with_the_grown_scale(probe: dict) -> None:
    # d(loss)/d(weight) = 1/16; Adam's exp_avg after one step is 0.1 of the gradient.
    assert probe["moments"][2] == pytest.approx(0.1 / 16)
    assert probe["moments"][1] == pytest.approx(0.1 / 32)


def test_state_dict_carries_the_scale_and_factors_but_no_counter(probe: dict) -> None:
    saved = probe["saved"]
    # FFI with hysteresis 2: one overflow counted, growth counter reset; neither is carried.
    assert saved["scale"] == 1024.0 and saved["growth_tracker"] == 0
    assert saved["hysteresis_tracker"] == 0
    assert saved["config"]["hysteresis"] == 2 and saved["config"]["min_scale"] == 2.0
    scale, growth, config = probe["resumed"]
    assert (scale, growth) == (1024.0, 0)
    assert config == saved["config"]


def test_expresses_names_what_the_constructor_asserts() -> None:
    adapter = ColossalAIDynamicGradScaler()
    assert adapter.expresses(ScalerConfig()) is None
    assert "growth_factor > 1" in adapter.expresses(ScalerConfig(growth_factor=1.0))
    assert "backoff_factor < 1" in adapter.expresses(ScalerConfig(backoff_factor=1.0))
    assert "min_scale <= init_scale" in adapter.expresses(ScalerConfig(4.0, min_scale=8.0))
    assert "dynamic" in adapter.expresses(ScalerConfig(dynamic=False))
    with pytest.raises(ValueError, match="backoff_factor < 1"):
        adapter.new(ScalerConfig(backoff_factor=1.0))


def test_importing_the_adapter_does_not_import_colossalai(run_python) -> None:
    proc = run_python("import sys, unifiedamp.conformance.zoo.colossalai_grad_scaler\n"
                      "print('colossalai' in sys.modules, 'torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_an_inf_on_one_rank_backs_off_every_rank() -> None:
    # Only the config of the handle is read: no process group opens in this process.
    config = ScalerConfig(1024.0, growth_interval=2)
    states = ColossalAIDynamicGradScaler().distributed_iterate((None, None, config), ["F", "I"])
    assert [tuple(s) for s in states] == [(512.0, 0, None), (512.0, 0, None)]
    states = ColossalAIDynamicGradScaler().distributed_iterate((None, None, config), ["F", "F"])
    assert [tuple(s) for s in states] == [(1024.0, 1, None), (1024.0, 1, None)]
