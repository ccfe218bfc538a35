"""The work the torch backend adds per training iteration, counted next to torch's own
``torch.amp.GradScaler`` in the same process: every aten op dispatched (on CPU each is one
kernel; on a GPU the same ops are the launches a launch-bound step pays for), and on a CUDA
device the work the GPU runs, from the profiler (the compiled rule included)."""

from __future__ import annotations

import collections
import contextlib

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import CUDA, CountOps  # noqa: E402

import unifiedamp as ua  # noqa: E402

EXTENDED = {"hysteresis": 2, "min_scale": 1.0}


class CountDeviceWork:
    """Counts what a CUDA device runs while active (kernels, copies, fills), by name, from
    the profiler. Unlike CountOps it leaves torch.compile working: the compiled rule (one
    kernel, replayed as a CUDA graph) is what a CUDA update runs."""

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        self._profile = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        self._profile.__enter__()
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self._profile.__exit__(*exc)
        device = torch.autograd.DeviceType.CUDA
        # User annotations (an optimizer step's range) are device events, not device work.
        self.ops = collections.Counter(
            event.name for event in self._profile.events()
            if event.device_type == device and not getattr(event, "is_user_annotation", False))


def ops_per_iteration(make_scaler, fused: bool, poison_at: int | None = None,
                      iterations: int = 4, device: str = "cpu",
                      counter=CountOps) -> list[collections.Counter[str]]:
    """The ops of each iteration of a float16 autocast step of a 4-layer MLP with AdamW:
    zero_grad, forward, scaled backward, step, update."""
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), fused=fused, foreach=None if fused else True)
    scaler = make_scaler()
    x = torch.randn(8, 16).to(device)
    counts = []
    for i in range(iterations):
        inputs = x.clone()
        if i == poison_at:
            inputs[0, 0] = float("inf")
        # Not the first: it creates the optimizer's state (and on CUDA compiles the rule).
        with counter() if i else contextlib.nullcontext(CountOps()) as count:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.float16):
                loss = model(inputs).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        counts.append(count.ops)
    return counts


def native(device: str = "cpu"):
    return lambda: torch.amp.GradScaler(device, init_scale=1024.0)


def ours(**config):
    return lambda: ua.GradScaler(1024.0, backend="torch", **config)


def _extra(theirs: collections.Counter, mine: collections.Counter) -> str:
    return f"ours - native: {dict(mine - theirs)}, native - ours: {dict(theirs - mine)}"


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_torch_expressible_config_adds_no_op_per_iteration(fused):
    theirs = ops_per_iteration(native(), fused)
    mine = ops_per_iteration(ours(), fused)
    for i in range(1, len(mine)):  # the first is not counted
        extra = sum(mine[i].values()) - sum(theirs[i].values())
        # At most 2 is the bound we promise; torch 2.13 gives -2 on both paths (unscale_,
        # or the fused path's check, leaves out torch's copies of inv_scale and found_inf
        # onto their own device; the fused path's two counters are paid for by the two ops
        # torch's own step() spends on copying the flag and the scale), so -2 is held here.
        assert extra <= -2, f"iteration {i}: {extra} ops over native; {_extra(theirs[i], mine[i])}"


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_a_skipped_iteration_costs_what_natives_costs(fused):
    theirs = ops_per_iteration(native(), fused, poison_at=2)
    mine = ops_per_iteration(ours(), fused, poison_at=2)
    extra = sum(mine[2].values()) - sum(theirs[2].values())
    assert extra <= -2, _extra(theirs[2], mine[2])


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_extended_rule_runs_as_few_tensor_ops(fused, record_property):
    """Hysteresis 2 and min_scale, which torch's kernel cannot run: the rule as tensor ops
    on the scale's device (no host sync). Counted on CPU: 14 ops over native, with either
    optimizer (with a fused one, the skip counters take the place of the two ops torch's
    step() spends on copying the flag and the scale)."""
    theirs = ops_per_iteration(native(), fused)
    mine = ops_per_iteration(ours(**EXTENDED), fused)
    extra = sum(mine[-1].values()) - sum(theirs[-1].values())
    record_property("extended_rule_extra_ops", extra)
    assert extra <= 14, _extra(theirs[-1], mine[-1])


@CUDA
@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("config, bound", [({}, 2), (EXTENDED, 4)],
                         ids=["torch-expressible", "extended"])
def test_cuda_work_per_iteration_stays_within_natives_plus(fused, config, bound):
    """On CUDA: at most native + 2 kernels (and copies) per iteration for the
    torch-expressible config, native + 4 for the extended rule (its compiled kernel
    replayed as a graph, and the flag copied into it)."""
    from unifiedamp.backends.torch import _rule

    # Ours first: were a later profiler session in the process to lose records, the
    # bias would be against ours, never in its favour.
    mine = ops_per_iteration(ours(**config), fused, device="cuda", counter=CountDeviceWork)
    theirs = ops_per_iteration(native("cuda"), fused, device="cuda", counter=CountDeviceWork)
    # The profiler saw the step (forward, backward and AdamW are dozens of kernels) ...
    assert sum(theirs[-1].values()) >= 30 and sum(mine[-1].values()) >= 30, (theirs, mine)
    if config:  # ... and the extended rule ran compiled, not as its ~16 tensor ops
        assert _rule._compiled_ok[(ua.spec.ScalerConfig(1024.0, **config), "cuda")]
    extra = sum(mine[-1].values()) - sum(theirs[-1].values())
    assert extra <= bound, _extra(theirs[-1], mine[-1])


@pytest.fixture
def compiled_rule_on_cpu(monkeypatch):
    """The compiled rule, which runs on CUDA by default, on the CPU (inductor's C++)."""
    from unifiedamp.backends.torch import _rule

    monkeypatch.setattr(_rule, "COMPILED_RULE_DEVICES", {"cpu", "cuda"})
    return _rule


@pytest.mark.parametrize("config", [
    {"hysteresis": 2, "min_scale": 64.0, "growth_interval": 3},
    {"growth_factor": 1.5, "backoff_factor": 0.7, "max_scale": 4096.0, "growth_interval": 2},
], ids=["hysteresis-min", "factors-max"])
def test_compiled_rule_follows_the_spec_step_by_step(config, compiled_rule_on_cpu):
    """What CUDA runs for the tensor-op rule: the rule compiled into one kernel (Triton
    there, inductor's C++ here), which must give the spec's bits."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = ua.GradScaler(1024.0, backend="torch", **config)
    expected = ua.spec.ScalerState(1024.0)
    for step in range(30):
        poisoned = step % 5 in (3, 4) or step in (20, 21, 22)
        x = torch.full((2, 8), float("inf") if poisoned else 1.0)
        scaler.scale(model(x).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        expected = ua.spec.update(scaler.config, expected, poisoned)
        assert scaler.state == expected, f"step {step}: {scaler.state} != {expected}"
    assert compiled_rule_on_cpu._compiled_ok[(scaler.config, "cpu")]
