"""The zoo's torch-based adapters drive the real third-party scalers: torch's own
GradScaler and ShardedGradScaler, DeepSpeed's DynamicLossScaler and Megatron-core's
DynamicGradScaler. Each check looks at the real object after the adapter's steps."""

from __future__ import annotations

import json
import warnings

import pytest

from unifiedamp.conformance.zoo import ZOO
from unifiedamp.spec import ScalerConfig

INSTALL = "pip install 'unifiedamp[zoo]'"


def _need(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed ({INSTALL})")


@pytest.fixture(scope="module", autouse=True)
def _no_group_left_behind():
    # The sharded and DeepSpeed adapters start a one-process group; the torch backend's
    # tests in this process must not find it.
    yield
    from unifiedamp.conformance.zoo.torch_grad_scaler import release_process_group

    release_process_group()


def _steps(adapter, handle, kinds: str) -> list[float]:
    return [adapter.read(adapter.iterate(handle, kind)).scale for kind in kinds]


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("cls", ["TorchAmpGradScaler", "ShardedGradScaler"])
def test_torch_adapters_drive_the_real_scaler(cls):
    _need("torch")
    from unifiedamp.conformance.zoo import torch_grad_scaler as module

    adapter = getattr(module, cls)()
    handle = adapter.new(ScalerConfig(1024.0, growth_interval=2))
    real = handle.scaler
    assert type(real).__name__ in ("GradScaler", "ShardedGradScaler")
    adapter.iterate(handle, "F")
    before = adapter.snapshot(handle)
    adapter.iterate(handle, "I")
    assert real.get_scale() == 512.0 and real.state_dict()["_growth_tracker"] == 0
    after = adapter.snapshot(handle)
    assert all((a == b).all() for a, b in zip(before, after, strict=True)), "inf step taken"
    assert _steps(adapter, handle, "FF") == [512.0, 1024.0]


def test_torch_set_config_goes_through_its_setters_and_refuses_the_rest():
    _need("torch")
    from unifiedamp.conformance.zoo.torch_grad_scaler import TorchAmpGradScaler

    adapter = TorchAmpGradScaler()
    handle = adapter.new(ScalerConfig(8.0, growth_interval=5))
    adapter.reconfigure(handle, {"growth_interval": 2, "backoff_factor": 0.25})
    assert handle.scaler.get_growth_interval() == 2
    assert handle.scaler.get_backoff_factor() == 0.25
    with pytest.raises(ValueError, match="cannot change hysteresis"):
        adapter.reconfigure(handle, {"hysteresis": 2})
    with pytest.raises(ValueError, match="no hysteresis=2"):
        adapter.new(ScalerConfig(8.0, hysteresis=2))
    assert "growth_factor" in adapter.expresses(ScalerConfig(8.0, growth_factor=1.0))


def test_torch_state_dict_is_converted_both_ways():
    _need("torch")
    from unifiedamp.conformance.zoo.torch_grad_scaler import TorchAmpGradScaler

    adapter = TorchAmpGradScaler()
    config = ScalerConfig(64.0, 3.0, 0.25, 4)
    handle = adapter.new(config)
    _steps(adapter, handle, "IFF")
    saved = json.loads(json.dumps(adapter.save(handle)))
    assert saved["format"] == "unifiedamp.GradScaler" and saved["config"] == config.to_dict()
    assert (saved["scale"], saved["growth_tracker"]) == (16.0, 2)
    other = adapter.load(adapter.new(ScalerConfig()), saved)
    assert other.scaler.state_dict() == {"scale": 16.0, "growth_factor": 3.0,
                                         "backoff_factor": 0.25, "growth_interval": 4,
                                         "_growth_tracker": 2}
    assert _steps(adapter, other, "FF") == [16.0, 48.0]
    disabled = adapter.new(ScalerConfig(enabled=False))
    with pytest.raises(ValueError, match="keeps no state"):
        adapter.save(disabled)


# ---------------------------------------------------------------- DeepSpeed


def test_deepspeed_adapters_drive_the_real_scaler_and_differ_by_consecutive_hysteresis():
    _need("deepspeed")
    from unifiedamp.conformance.zoo.deepspeed_loss_scaler import (
        DeepSpeedConsecutiveLossScaler,
        DeepSpeedLossScaler,
    )

    config = ScalerConfig(1024.0, growth_interval=100, hysteresis=2)
    scales = {}
    for cls in (DeepSpeedLossScaler, DeepSpeedConsecutiveLossScaler):
        adapter = cls()
        handle = adapter.new(config)
        assert type(handle.scaler).__name__ == "DynamicLossScaler"
        assert handle.scaler.consecutive_hysteresis is cls.consecutive_hysteresis
        scales[cls.consecutive_hysteresis] = _steps(adapter, handle, "IIFI")
        assert handle.scaler.cur_iter == 4
    # The finite step refills the hysteresis only with consecutive_hysteresis=True.
    assert scales == {False: [1024.0, 512.0, 512.0, 256.0],
                      True: [1024.0, 512.0, 512.0, 512.0]}


def test_deepspeed_skips_overflow_steps_grows_late_and_raises_at_its_floor():
    _need("deepspeed")
    from unifiedamp.conformance.zoo.deepspeed_loss_scaler import DeepSpeedLossScaler

    adapter = DeepSpeedLossScaler()
    handle = adapter.new(ScalerConfig(4.0, growth_interval=1, min_scale=2.0))
    before = adapter.snapshot(handle)
    assert _steps(adapter, handle, "N") == [2.0]
    assert all((a == b).all() for a, b in zip(before, adapter.snapshot(handle), strict=True))
    # stable_interval = cur_iter - last_overflow_iter - 1 is 0 on the first finite step.
    assert _steps(adapter, handle, "FF") == [2.0, 4.0]
    assert _steps(adapter, handle, "I") == [2.0]
    with pytest.raises(Exception, match="already at minimum"):
        adapter.iterate(handle, "I")


# ---------------------------------------------------------------- Megatron-core


def test_megatron_adapter_drives_the_real_scaler_and_round_trips_its_state():
    _need("megatron.core")
    from unifiedamp.conformance.zoo.megatron_grad_scaler import MegatronDynamicGradScaler

    adapter = MegatronDynamicGradScaler()
    config = ScalerConfig(1024.0, growth_interval=3, hysteresis=2)
    handle = adapter.new(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.optimizer.grad_scaler import DynamicGradScaler
    assert isinstance(handle.scaler, DynamicGradScaler)
    # Only a growth refills Megatron's hysteresis: 'IFI' backs off on the second inf.
    assert _steps(adapter, handle, "IFI") == [1024.0, 1024.0, 512.0]
    assert handle.scaler._hysteresis_tracker == 0
    saved = json.loads(json.dumps(adapter.save(handle)))
    assert (saved["scale"], saved["growth_tracker"], saved["hysteresis_tracker"]) == (512.0, 0, 2)
    other = adapter.load(adapter.new(ScalerConfig(8.0)), saved)
    assert other.scaler.state_dict()["hysteresis_tracker"] == 0
    assert other.scaler.growth_interval == 3 and other.scaler.scale.item() == 512.0
    assert _steps(adapter, other, "I") == [256.0]


def test_the_zoo_lists_these_columns():
    for name in ("torch", "torch-sharded", "deepspeed", "deepspeed-consecutive", "megatron"):
        module, _, cls = ZOO[name].target.partition(":")
        assert ZOO[name].install == INSTALL
        assert hasattr(__import__(module, fromlist=[cls]), cls)
