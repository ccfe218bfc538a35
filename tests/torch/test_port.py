"""Porting on torch (``unifiedamp.porting``): a torch constructor call's config follows
torch's own trajectory over a forced-overflow sequence with a real optimizer; native_call's
keyword arguments build a real scaler that reads back the same config; from_native keeps a
live scaler's state mid-run; the natives table holds the installed signatures. FSDP's
ShardedGradScaler needs a process group: it trains in a process of its own."""

from __future__ import annotations

import json
import pathlib

import pytest

torch = pytest.importorskip("torch")

from port_runs import KINDS, check_installed_signatures, hexes, reference, torch_run  # noqa: E402

from unifiedamp import spec  # noqa: E402
from unifiedamp.porting import config_from_call, from_native, native_call  # noqa: E402
from unifiedamp.spec import ScalerConfig, ScalerState  # noqa: E402


def test_the_table_holds_the_installed_signatures():
    # Positional order and defaults as inspect reads them from the installed torch (paddle's
    # and Keras's classes: tests/paddle/test_port.py, tests/keras/test_port.py).
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    classes = {"torch.amp.GradScaler": torch.amp.GradScaler,
               "torch.cuda.amp.GradScaler": torch.cuda.amp.GradScaler,
               "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler": ShardedGradScaler}
    assert check_installed_signatures(classes) == 3


TORCH_CALLS = [
    (("cpu", 1024.0, 3.0, 0.25, 3), {}),
    (("cpu",), {"init_scale": 512.0, "growth_interval": 2}),
    ((), {"device": "cpu", "growth_interval": 4, "backoff_factor": 0.125, "init_scale": 4096.0}),
]


@pytest.mark.parametrize(("args", "kwargs"), TORCH_CALLS)
def test_torch_call_config_follows_torchs_own_trajectory(args, kwargs):
    config, notes = config_from_call("torch.amp.GradScaler", args, kwargs)
    assert "device='cpu'" in notes[0]
    scales, _, _ = torch_run(torch.amp.GradScaler(*args, **kwargs), KINDS)
    assert hexes(scales) == reference(config, KINDS)


def test_torch_cuda_amp_defaults_and_no_device():
    config, notes = config_from_call("torch.cuda.amp.GradScaler", (1024.0, 3.0), {})
    assert config == ScalerConfig(1024.0, 3.0)
    assert not any("device" in n for n in notes)


# A process group of one rank, in a process of its own (one per process; ranks are
# processes): FSDP's scaler trains there, with the loop the other tests use.
SHARDED = """
import json, os, sys
sys.path.insert(0, {support!r})
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from port_runs import torch_run
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("gloo", rank=0, world_size=1)
args, kinds = json.loads({payload!r})
native = ShardedGradScaler(*args)
scales, _, _ = torch_run(native, kinds)
print(json.dumps([native._backoff_factor, native._growth_factor, scales]))
dist.destroy_process_group()
"""


def test_sharded_grad_scaler_takes_backoff_before_growth(run_python):
    args = ["cpu", 1024.0, 0.25, 3.0, 3]  # backoff 0.25, growth 3.0 in FSDP's order
    config, _ = config_from_call("torch.distributed.fsdp.ShardedGradScaler", tuple(args))
    assert (config.backoff_factor, config.growth_factor) == (0.25, 3.0)
    support = pathlib.Path(__file__).resolve().parents[1] / "support"
    proc = run_python(SHARDED.format(support=str(support), payload=json.dumps([args, KINDS])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    backoff, growth, scales = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (backoff, growth) == (0.25, 3.0)
    assert hexes(scales) == reference(config, KINDS)


@pytest.mark.parametrize("config", [ScalerConfig(1024.0, 3.0, 0.25, 3), ScalerConfig(),
                                    ScalerConfig(8.0, enabled=False)])
def test_torch_native_call_round_trips_through_a_real_scaler(config):
    kwargs, problems = native_call(config, "torch")
    assert problems == []
    back = from_native(torch.amp.GradScaler("cpu", **kwargs))
    assert back.backend == "torch"
    assert back.config == (config if config.enabled else ScalerConfig(enabled=False))


def test_torch_native_call_rounds_the_factors_so_torchs_kernel_follows_the_spec():
    # torch multiplies by the float64 factor it is given: 1.1 and 0.3 unrounded make every
    # growth and backoff drift from the spec's float32 product.
    config = ScalerConfig(1024.0, 1.1, 0.3, 1)
    kwargs, problems = native_call(config, "torch")
    assert problems == []
    assert (kwargs["growth_factor"], kwargs["backoff_factor"]) == (spec.f32(1.1), spec.f32(0.3))
    scales, _, _ = torch_run(torch.amp.GradScaler("cpu", **kwargs), KINDS)
    assert hexes(scales) == reference(config, KINDS)


def test_torch_from_native_keeps_state_mid_run():
    native = torch.amp.GradScaler("cpu", 1024.0, 2.0, 0.5, 3)
    _, model, opt = torch_run(native, "FFIFF")  # mid-interval: growth tracker 2
    ours = from_native(native)
    assert ours.state == ScalerState(512.0, 2, 0)
    assert str(ours._scale.device) == "cpu"
    a, _, _ = torch_run(native, KINDS, model, opt)
    b, _, _ = torch_run(ours, KINDS)
    assert hexes(a) == hexes(b)
    moved = from_native(native, backend="numpy")
    assert (moved.backend, moved.state, moved.config) == ("numpy", ours.state, ours.config)
