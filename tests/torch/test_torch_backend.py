"""The PyTorch backend: what is specific to torch (the shared contract runs in
test_conformance_builtin.py)."""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import inspect
import json
import pathlib
import pickle
import random
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.backends.torch import TorchGradScaler, _compat  # noqa: E402
from unifiedamp.conformance.adapters.torch import run_ranks  # noqa: E402

pytestmark = pytest.mark.framework("torch")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def mlp(device="cpu", seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4)).to(device)


def batch(device="cpu", seed=1, poison=None):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    if poison is not None:
        x[0, 0] = poison
    return x.to(device), y.to(device)


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


class CountHostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts aten._local_scalar_dense: what .item(), bool() and float() of a tensor run,
    i.e. every point where Python waits for the device's value."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


class RecordOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------- direct mapping


def test_it_is_a_real_torch_grad_scaler_and_detected_from_torch_objects():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for scaler in (ua.GradScaler(backend="torch"), ua.GradScaler(backend=opt),
                   ua.GradScaler(backend=torch.ones(1))):
        assert isinstance(scaler, torch.amp.GradScaler) and isinstance(scaler, ua.GradScaler)
        assert type(scaler) is TorchGradScaler


def test_with_only_torch_imported_detection_picks_torch(run_python):
    proc = run_python("import torch, unifiedamp as ua; print(type(ua.GradScaler()).__name__)")
    assert proc.stdout.strip() == "TorchGradScaler", proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="measures the CPU-only behaviour")
def test_never_silently_disabled_on_cpu_unlike_torchs_default():
    with pytest.warns(UserWarning, match="CUDA is not available"):
        assert torch.amp.GradScaler().is_enabled() is False  # torch's default device "cuda"
    scaler = ua.GradScaler(backend="torch")
    assert scaler.is_enabled()
    assert scaler.scale(torch.ones(())).item() == 65536.0


def test_expressible_configs_run_torchs_kernels_and_others_the_tensor_rule():
    def ops_of(**config):
        scaler = ua.GradScaler(1024.0, backend="torch", **config)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler.scale(loss_of(model, *batch())).backward()
        with RecordOps() as rec:
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        return scaler, rec.ops

    native, ops = ops_of()
    assert native.uses_native_update
    assert "_amp_foreach_non_finite_check_and_unscale_" in ops and "_amp_update_scale_" in ops
    for config in ({"hysteresis": 2}, {"min_scale": 1.0}, {"max_scale": 1e6},
                   {"growth_factor": 1.0}, {"backoff_factor": 1.0}, {"dynamic": False}):
        custom, ops = ops_of(**config)
        assert not custom.uses_native_update
        assert "_amp_update_scale_" not in ops, config
        assert "_amp_foreach_non_finite_check_and_unscale_" in ops


@pytest.mark.parametrize("seed", range(3))
def test_default_config_matches_torch_amp_grad_scaler_step_by_step(seed):
    rng = random.Random(seed)
    kinds = "".join(rng.choice("FFFI") for _ in range(60))
    ours = ua.GradScaler(256.0, 2.0, 0.5, 3, backend="torch")
    native = torch.amp.GradScaler("cpu", 256.0, 2.0, 0.5, 3)
    for step, kind in enumerate(kinds, 1):
        for scaler in (ours, native):
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x, y = batch(poison=float("inf") if kind == "I" else None)
            scaler.scale(loss_of(model, x, y)).backward()
            scaler.step(opt)
            scaler.update()
        assert spec.f32_hex(ours.get_scale()) == spec.f32_hex(native.get_scale()), f"step {step}"
        assert ours._get_growth_tracker() == native._get_growth_tracker(), f"step {step}"


# ---------------------------------------------------------------- the workflow


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
}


def train(make_opt, device, scaler=None, steps=6, clip=None, accumulate=1):
    model = mlp(device)
    opt = make_opt(model.parameters())
    for step in range(steps):
        for micro in range(accumulate):
            loss = loss_of(model, *batch(device, seed=10 * step + micro)) / accumulate
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_finite_training_with_the_scaler_equals_training_without_it(name, device):
    # Powers of two scale and unscale exactly, so every parameter must be bitwise
    # the same as without a scaler: unscale_ then clip_grad_norm_, accumulation too.
    for scaler_config in ({"init_scale": 1024.0}, {"init_scale": 1024.0, "hysteresis": 2,
                                                    "min_scale": 1.0}):
        for kwargs in ({}, {"clip": 0.5}, {"accumulate": 2}):
            plain = train(OPTIMIZERS[name], device, **kwargs)
            scaler = ua.GradScaler(backend="torch", growth_interval=2, **scaler_config)
            scaled = train(OPTIMIZERS[name], device, scaler=scaler, **kwargs)
            for a, b in zip(plain, scaled, strict=True):
                assert torch.equal(a, b), (name, scaler_config, kwargs)
            assert scaler.num_skipped_steps == 0 and scaler.get_scale() == 8192.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw_fused", "sgd_foreach"])
def test_inf_step_is_skipped_and_leaves_params_and_optimizer_state(name, device):
    model = mlp(device)
    opt = OPTIMIZERS[name](model.parameters())
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(loss_of(model, *batch(device))).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    params = copy.deepcopy(list(model.parameters()))
    state = copy.deepcopy(opt.state_dict())
    scaler.scale(loss_of(model, *batch(device, poison=float("nan")))).backward()
    assert scaler.step(opt) is None
    scaler.update()
    assert scaler.last_step_skipped is True
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters(), strict=True))
    after = opt.state_dict()["state"]
    for key, value in state["state"].items():
        for field, tensor in value.items():
            assert torch.equal(tensor, after[key][field]), (key, field)
    assert scaler.get_scale() == 512.0
    assert (scaler.num_steps, scaler.num_skipped_steps) == (2, 1)


def test_two_optimizers_two_losses_inf_in_either_backs_off_once():
    for poisoned in (0, 1):
        a, b = mlp(seed=0), mlp(seed=1)
        opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.Adam(b.parameters())
        scaler = ua.GradScaler(1024.0, growth_interval=1, backend="torch")
        losses = [loss_of(m, *batch(poison=float("inf") if i == poisoned else None))
                  for i, m in enumerate((a, b))]
        for loss in scaler.scale(losses):  # a list of losses scales in one call
            loss.backward()
        before = [[p.detach().clone() for p in m.parameters()] for m in (a, b)]
        for opt in (opt_a, opt_b):
            scaler.step(opt)
        scaler.update()
        for i, m in enumerate((a, b)):  # each optimizer skips on its own
            same = all(torch.equal(x, y) for x, y in zip(before[i], m.parameters(),
                                                          strict=True))
            assert same is (i == poisoned), i
        assert scaler.get_scale() == 512.0  # one backoff for the iteration
        assert scaler.last_step_skipped and (scaler.num_steps, scaler.num_skipped_steps) == (1, 1)


def test_dict_of_named_losses_is_scaled():
    scaler = ua.GradScaler(4.0, backend="torch")
    out = scaler.scale({"a": torch.tensor(1.0), "b": [torch.tensor(2.0, dtype=torch.float16)]})
    assert out["a"].item() == 4.0 and out["b"][0].dtype == torch.float16
    with pytest.raises(ValueError, match="outputs must be a Tensor or a list/tuple/dict"):
        scaler.scale(3.0)


def test_named_tuple_of_losses_keeps_its_type_in_scale_and_unscale():
    from typing import NamedTuple

    class Losses(NamedTuple):
        main: torch.Tensor
        aux: torch.Tensor

    scaler = ua.GradScaler(4.0, backend="torch")
    out = scaler.scale(Losses(torch.tensor(1.0), torch.tensor(0.5)))
    assert type(out) is Losses and (out.main.item(), out.aux.item()) == (4.0, 2.0)
    grads, finite = scaler.unscale(Losses(torch.tensor(8.0), torch.tensor(float("inf"))))
    assert type(grads) is Losses and grads.main.item() == 2.0 and not bool(finite)


def test_torchs_kernel_runs_the_float32_factors():
    """torch's kernel takes the factors as doubles; unrounded, 3.0 * 1.1 and 3.3 * 0.9
    round to other float32 bits than the spec's f32(scale * f32(factor))."""
    scaler = ua.GradScaler(3.0, growth_factor=1.1, backoff_factor=0.9, growth_interval=1,
                           backend="torch")
    assert scaler.uses_native_update
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    expected = spec.ScalerState(3.0)
    for step, poisoned in enumerate([False, True]):
        scaler.scale(loss_of(model, *batch(poison=float("inf") if poisoned else None))).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        expected = spec.update(scaler.config, expected, poisoned)
        assert scaler.state == expected, f"step {step}: {scaler.state} != {expected}"


def test_update_with_new_scale_float_or_tensor():
    scaler = ua.GradScaler(1024.0, growth_interval=5, backend="torch")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(loss_of(model, *batch())).backward()
    scaler.step(opt)
    scaler.update()
    scaler.update(8.0)
    assert scaler.state == spec.ScalerState(8.0, 1, 0)
    scaler.update(torch.tensor([0.1], dtype=torch.float64))
    assert scaler.get_scale() == spec.f32(0.1)
    for bad, exc in [(0.0, ValueError), (float("nan"), ValueError), ("8", TypeError),
                     (torch.ones(2), TypeError), (torch.ones(1, requires_grad=True), TypeError),
                     (torch.ones(1, dtype=torch.int32), TypeError)]:
        with pytest.raises(exc, match="new_scale must be"):
            scaler.update(bad)
    assert scaler.get_scale() == spec.f32(0.1)


def test_sparse_gradients_are_unscaled_and_checked():
    for poison in (None, float("inf")):
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)
        scaler = ua.GradScaler(1024.0, backend="torch")
        out = emb(torch.tensor([1, 2, 2]))
        weight = torch.ones(3, 3)
        if poison is not None:
            weight[0, 0] = poison
        scaler.scale((out * weight).sum()).backward()
        assert emb.weight.grad.is_sparse
        scaler.unscale_(opt)
        if poison is None:
            assert torch.equal(emb.weight.grad.to_dense()[2], torch.full((3,), 2.0))
        scaler.step(opt)
        scaler.update()
        assert scaler.last_step_skipped is (poison is not None)


def test_fp16_gradients_get_torchs_error_with_the_fix():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = ua.GradScaler(backend="torch")
    scaler.scale(p.float().sum()).backward()
    with pytest.raises(ValueError, match=r"^Attempting to unscale FP16 gradients\. Keep the "
                                         r"parameters .* in float32"):
        scaler.step(opt)


def _gradient_kinds(poison: float | None, sparse_dtype: torch.dtype = torch.float32
                    ) -> tuple[list[torch.nn.Parameter], torch.Tensor]:
    """Parameters whose gradients cover what unscale_ splits on: float32 and bfloat16,
    a sparse one with a duplicate index (float16 for ``sparse_dtype=torch.float16``, which
    the fused path's check coalesces first), one that requires grad (backward with
    create_graph), and one with no gradient; and the loss."""
    torch.manual_seed(0)
    dense = torch.nn.Parameter(torch.randn(4, 3))
    bf16 = torch.nn.Parameter(torch.randn(5, dtype=torch.bfloat16))
    emb = torch.nn.Embedding(6, 2, sparse=True).to(sparse_dtype)
    unused = torch.nn.Parameter(torch.ones(2))
    weight = torch.ones(3)
    if poison is not None:
        weight[1] = poison
    loss = ((dense * weight).square().sum() + bf16.float().sum()
            + emb(torch.tensor([1, 2, 2])).float().sum())
    return [dense, bf16, emb.weight, unused], loss


@pytest.mark.parametrize("poison", [None, float("inf"), float("nan")])
@pytest.mark.parametrize("verb", ["unscale_", "fused check"])
def test_unscale_gives_torchs_gradients_and_flag_bit_for_bit(poison, verb):
    """unscale_ and the fused path's check (torch's, written out) against
    torch.amp.GradScaler's on the same gradients: the same bits in every gradient (a
    float16 sparse one coalesced in the check, as torch does), the same found_inf, grad
    mode off (a create_graph gradient requires grad)."""
    results = []
    for scaler in (torch.amp.GradScaler("cpu", init_scale=1024.0),
                   ua.GradScaler(1024.0, backend="torch", device="cpu")):
        params, loss = _gradient_kinds(
            poison, torch.float32 if verb == "unscale_" else torch.float16)
        opt = torch.optim.SGD(params, lr=0.1)
        scaler.scale(loss).backward(create_graph=True)
        assert params[0].grad.requires_grad
        assert not params[2].grad.is_coalesced()
        if verb == "unscale_":
            scaler.unscale_(opt)
        else:
            scaler._check_inf_per_device(opt)
        found = scaler._per_optimizer_states[id(opt)]["found_inf_per_device"]
        grads = [p.grad.to_dense() if p.grad is not None and p.grad.is_sparse else p.grad
                 for p in params]
        bits = {2: torch.int16, 4: torch.int32}
        results.append(([None if g is None else g.detach().view(bits[g.element_size()]).tolist()
                         for g in grads],
                        {d: f.item() for d, f in found.items()}, params[2].grad.is_coalesced(),
                        [None if p.grad is None else type(p.grad.grad_fn).__name__
                         for p in params]))
    assert results[1] == results[0]


def test_unscale_refuses_as_torch_does_and_changes_no_gradient():
    params, loss = _gradient_kinds(None)
    half = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    half.grad = torch.ones(2, dtype=torch.float16)
    opt = torch.optim.SGD([*params, half], lr=0.1)
    scaler = ua.GradScaler(1024.0, backend="torch", device="cpu")
    scaler.scale(loss).backward()
    before = [None if p.grad is None else p.grad.clone() for p in opt.param_groups[0]["params"]]
    with pytest.raises(ValueError, match="^Attempting to unscale FP16 gradients"):
        scaler.unscale_(opt)
    after = [None if p.grad is None else p.grad for p in opt.param_groups[0]["params"]]
    for a, b in zip(before, after, strict=True):
        assert (a is None and b is None) or torch.equal(a.to_dense(), b.to_dense())
    assert not opt.param_groups[0]["params"][2].grad.is_coalesced()
    opt.param_groups[0]["params"].pop()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) has already been called on this "
                                           r"optimizer since the last update\(\)\.$"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) is being called after step\(\)\.$"):
        scaler.unscale_(opt)


def test_no_inf_checks_keep_torchs_sentence_and_say_the_cause_and_the_fix():
    # torch's own step() asserts "No inf checks were recorded for this optimizer." when no
    # parameter has a gradient (here: zero_grad between backward and step); its update()
    # "... prior to update." when nothing was checked. Both start as torch's do.
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    native, ours = torch.amp.GradScaler("cpu"), ua.GradScaler(backend="torch", device="cpu")
    messages = []
    for scaler in (native, ours):
        scaler.scale(loss_of(model, *batch())).backward()
        opt.zero_grad()  # too early: nothing left to check
        with pytest.raises(AssertionError) as step_error:
            scaler.step(opt)
        with pytest.raises(AssertionError) as update_error:
            scaler.update()
        messages.append((str(step_error.value), str(update_error.value)))
    (native_step, native_update), (step, update) = messages
    assert isinstance(step_error.value, ua.NoInfChecksError)
    assert step.startswith(native_step + " None of its parameters has a gradient")
    assert "call scaler.scale(loss).backward() before scaler.step(optimizer)" in step
    assert "not between the backward pass and step()" in step
    assert update.startswith(native_update + " Nothing checked the gradients")
    assert "call scaler.step(optimizer) (or scaler.unscale_(optimizer)) before " \
           "scaler.update()" in update


def test_fp16_gradients_with_a_fused_optimizer_are_supported():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    opt = torch.optim.Adam([p], lr=0.1, fused=True)
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(p.float().sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert not scaler.last_step_skipped and p.dtype == torch.float16 and p[0].item() < 1


def test_bfloat16_gives_one_warning_that_scaling_is_unnecessary():
    scaler = ua.GradScaler(backend="torch")
    with pytest.warns(UserWarning, match="Loss scaling is unnecessary with bfloat16") as record:
        scaler.scale(torch.ones((), dtype=torch.bfloat16))
        scaler.scale(torch.ones((), dtype=torch.bfloat16))
    assert len([w for w in record if "bfloat16" in str(w.message)]) == 1
    other = ua.GradScaler(backend="torch")
    model = mlp()
    with pytest.warns(UserWarning, match="unnecessary with bfloat16"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            other.scale(loss_of(model, *batch()))
    with pytest.warns(UserWarning, match="unnecessary with bfloat16"):
        ua.GradScaler(backend="torch").scale({"main": torch.ones((), dtype=torch.bfloat16)})


# ---------------------------------------------------------------- host syncs


def host_reads_per_step(make_opt, scaler_factory, steps=4):
    def run(use_scaler):
        model = mlp()
        opt = make_opt(model.parameters())
        scaler = scaler_factory() if use_scaler else None
        x, y = batch()
        loss_of(model, x, y).backward()  # warm: optimizer state exists
        opt.step()
        with CountHostReads() as counter:
            for _ in range(steps):
                opt.zero_grad()
                loss = loss_of(model, x, y)
                if scaler:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
        return counter.count

    return (run(True) - run(False)) / steps


@pytest.mark.parametrize("config", [{}, {"hysteresis": 2, "min_scale": 1.0}])
def test_host_reads_added_by_the_scaler_per_step(config):
    def factory():
        return ua.GradScaler(1024.0, backend="torch", **config)

    # Plain optimizers: exactly one read per step, Python deciding whether to step.
    assert host_reads_per_step(OPTIMIZERS["adam"], factory) == 1
    assert host_reads_per_step(OPTIMIZERS["sgd"], factory) == 1
    # Fused optimizers skip on the device: no read at all.
    assert host_reads_per_step(OPTIMIZERS["adamw_fused"], factory) == 0
    assert host_reads_per_step(OPTIMIZERS["sgd_fused"], factory) == 0


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("config", [{"backoff_factor": 0.5}, {"backoff_factor": 0.01},
                                    {"backoff_factor": 1e-10},
                                    {"backoff_factor": 0.5, "hysteresis": 2}],
                         ids=["0.5", "0.01", "1e-10", "hysteresis-2"])
def test_backing_off_into_an_unscalable_scale_skips_finite_steps(config, fused):
    """From a normal scale, overflows back off below MIN_UNSCALABLE, where the spec skips
    even finite steps (1 / scale is inf). The device check for it is skipped while the
    host can bound the scale away from there: the bound must hold step by step."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), fused=fused)
    scaler = ua.GradScaler(1e-30, growth_interval=3, backend="torch",
                           max_consecutive_skips=None, **config)
    expected = spec.ScalerState(spec.f32(1e-30))
    for step in range(90):
        poisoned = step < 80 and step % 7 != 6  # mostly overflows, a finite step now and then
        found = poisoned or spec.unscale_overflows(expected.scale)
        scaler.scale(loss_of(model, *batch(seed=step, poison=float("inf") if poisoned
                                           else None))).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        expected = spec.update(scaler.config, expected, found)
        assert scaler.last_step_skipped == found, f"step {step}: skipped != {found}"
        assert scaler.state == expected, f"step {step}: {scaler.state} != {expected}"
    assert spec.unscale_overflows(expected.scale)  # the run did reach the region


@pytest.mark.parametrize("config", [{"backoff_factor": 0.5}, {"backoff_factor": 1e-10}],
                         ids=["0.5", "1e-10"])
def test_functional_unscale_finds_inf_at_an_unscalable_scale(config):
    """The functional unscale(grads) raises the spec's extra inf too, once the host can
    no longer bound the scale above MIN_UNSCALABLE."""
    model = mlp()
    scaler = ua.GradScaler(1e-30, growth_interval=3, backend="torch",
                           max_consecutive_skips=None, **config)
    expected = spec.ScalerState(spec.f32(1e-30))
    for step in range(60):
        poisoned = step < 50 and step % 7 != 6
        found = poisoned or spec.unscale_overflows(expected.scale)
        loss = loss_of(model, *batch(seed=step, poison=float("inf") if poisoned else None))
        grads = torch.autograd.grad(scaler.scale(loss), list(model.parameters()))
        _, finite = scaler.unscale(grads)
        assert bool(finite) == (not found), f"step {step}: finite != {not found}"
        scaler.update()
        expected = spec.update(scaler.config, expected, found)
        assert scaler.state == expected, f"step {step}: {scaler.state} != {expected}"
    assert spec.unscale_overflows(expected.scale)  # the run did reach the region


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_update_counts_a_functional_check_next_to_an_optimizers(fused):
    """An iteration that steps an optimizer on finite gradients and also unscales other
    gradients functionally: an inf in the latter is a skip for update()."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), fused=fused)
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(loss_of(model, *batch())).backward()
    scaler.step(opt)
    _, finite = scaler.unscale([torch.tensor([1.0, float("inf")])])
    scaler.update()
    assert not bool(finite) and scaler.get_scale() == 512.0


def test_functional_unscale_of_several_dtypes_counts_one_inf_for_the_rule():
    """float32 and float64 gradients both inf: one inf check of the update, whatever the
    number of (device, dtype) groups the kernel ran on (hysteresis counts it once)."""
    models = [mlp(), mlp(seed=1).double()]
    scaler = ua.GradScaler(1024.0, hysteresis=2, growth_interval=2, backend="torch")
    expected = spec.ScalerState(1024.0)
    for found in (True, False, True, True, False, False):
        poison = float("inf") if found else None
        loss = sum(loss_of(m, *(t.to(m[0].weight.dtype) for t in batch(poison=poison)))
                   for m in models)
        params = [p for m in models for p in m.parameters()]
        _, finite = scaler.unscale(torch.autograd.grad(scaler.scale(loss), params))
        scaler.update()
        expected = spec.update(scaler.config, expected, found)
        assert bool(finite) is not found and scaler.state == expected, (scaler.state, expected)


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
def test_functional_unscale_keeps_the_graph_of_gradients_that_have_one(enabled):
    """A gradient penalty (docs/recipes/penalty.md): the gradients of
    autograd.grad(scaler.scale(loss), params, create_graph=True), unscaled by unscale(),
    stay differentiable, as on JAX, MLX and Keras. A detached copy would leave the penalty
    out of the parameters' gradients without an error."""
    model = mlp()
    scaler = ua.GradScaler(1024.0, backend="torch", enabled=enabled)
    params = list(model.parameters())
    x, y = batch()

    def penalty_grads(unscale):
        scaled = torch.autograd.grad(scaler.scale(loss_of(model, x, y)), params,
                                     create_graph=True)
        unscaled = unscale(scaled)
        penalty = sum(g.pow(2).sum() for g in unscaled)
        return [g.detach() for g in unscaled], torch.autograd.grad(penalty, params)

    inv_scale = 1.0 / scaler.get_scale()
    by_hand = penalty_grads(lambda scaled: [g * inv_scale for g in scaled])
    via_unscale = penalty_grads(lambda scaled: scaler.unscale(scaled)[0])
    for a, b in zip([*by_hand[0], *by_hand[1]], [*via_unscale[0], *via_unscale[1]],
                    strict=True):
        assert torch.equal(a, b)
    # The checks still count: finite gradients, one growth-free update.
    scaler.update()
    assert scaler.get_scale() == (1024.0 if enabled else 1.0)


def test_collapse_check_reads_the_device_once_per_period():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = ua.GradScaler(1024.0, backend="torch", max_consecutive_skips=10)
    reads = []
    for _ in range(20):
        with CountHostReads() as counter:
            scaler.scale(loss_of(model, *batch())).backward()
            scaler.step(opt)
            scaler.update()
        reads.append(counter.count)
        opt.zero_grad()
    # At the end of a period: the scale and, counted on the device (fused steps), the
    # run of skips; nothing in between.
    assert reads == [0] * 9 + [2] + [0] * 9 + [2]


def test_fused_optimizer_receives_grad_scale_and_found_inf():
    seen = {}

    class Spy(torch.optim.AdamW):
        def step(self, closure=None):
            seen["grad_scale"] = self.grad_scale.clone()
            seen["found_inf"] = self.found_inf.clone()
            return super().step(closure)

    model = mlp()
    opt = Spy(model.parameters(), fused=True)
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(loss_of(model, *batch(poison=float("inf")))).backward()
    scaler.step(opt)
    scaler.update()
    assert seen["grad_scale"].item() == 1024.0 and seen["found_inf"].item() == 1.0
    assert scaler.last_step_skipped and scaler.num_skipped_steps == 1


class _OldStyleFused(torch.optim.AdamW):
    """A fused optimizer with torch's deprecated ``grad_scaler`` keyword: the scaler passes
    itself instead of ``grad_scale``/``found_inf``."""

    def step(self, closure=None, grad_scaler=None):
        self.got_scaler = grad_scaler
        return super().step(closure)


def _fused_run(make_scaler, case: str):
    """Two iterations (the second with an inf) of ``case`` through a fused AdamW: the
    weights' bits, the state, what was raised or warned, the attributes left behind."""
    model = mlp()
    cls = _OldStyleFused if case == "grad_scaler_kwarg" else torch.optim.AdamW
    opt = cls(model.parameters(), lr=0.1, fused=True)
    scaler = make_scaler()
    raised = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for poison in (None, float("inf")):
            scaler.scale(loss_of(model, *batch(poison=poison))).backward()
            if case == "unscale_first":
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            if case == "own_grad_scale":
                opt.grad_scale = torch.tensor(0.5)
            try:
                scaler.step(opt, closure=lambda: 0.0) if case == "closure" else scaler.step(opt)
                if case == "twice":
                    scaler.step(opt)
            except RuntimeError as exc:
                raised.append(str(exc))
            try:  # nothing checked (closure, grad_scaler keyword): both refuse to update
                scaler.update()
            except AssertionError as exc:
                raised.append(str(exc))
            opt.zero_grad()
    left = [name for name in ("grad_scale", "found_inf") if hasattr(opt, name)]
    return ([p.detach().numpy().tobytes() for p in model.parameters()],
            scaler.get_scale(), raised, sorted({type(w.message).__name__ for w in caught}),
            left, getattr(opt, "got_scaler", scaler) is scaler)


@pytest.mark.parametrize("case", ["plain", "unscale_first", "own_grad_scale", "twice",
                                  "closure", "grad_scaler_kwarg"])
def test_fused_step_follows_torchs_protocol_bit_for_bit(case):
    """The fused path's own step() (two ops and two signature walks fewer than torch's):
    the same weights, scale, errors, warnings and attributes as torch.amp.GradScaler."""
    theirs = _fused_run(lambda: torch.amp.GradScaler("cpu", init_scale=1024.0), case)
    mine = _fused_run(lambda: ua.GradScaler(1024.0, backend="torch"), case)
    names = ("weights", "scale", "errors", "warnings", "attributes left", "scaler passed")
    for name, a, b in zip(names, theirs, mine, strict=True):
        if name == "errors":  # torch's words, then (NoInfChecksError) the fix
            b = [m[:len(t)] if m.startswith(t) else m for t, m in zip(a, b, strict=False)]
        assert a == b, f"{case}: {name} differ: torch {a!r:.300}, unifiedamp {b!r:.300}"


def test_a_config_changed_by_setters_mid_run_follows_the_spec_update_by_update():
    """Setters switch the update between torch's kernel and the tensor-op rule mid-run. The
    choice is kept per config and torch's kernel does not touch the hysteresis tracker, so
    a setter that kept the old choice, or a kernel update that left the tracker the tensor
    ops had raised, would drift from the spec here."""
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch", device="cpu")
    state = spec.ScalerState.initial(scaler.config)
    plan = [(None, True), (2, True), (1, False), (2, True), (None, True), (None, False),
            (1, False), (None, True)]
    for hysteresis, found_inf in plan:
        if hysteresis is not None:
            scaler.set_hysteresis(hysteresis)
        scaler.update(not found_inf)
        state = spec.update(scaler.config, state, found_inf)
        assert scaler.state == state, (hysteresis, found_inf)


def test_scale_keeps_the_dtype_of_a_single_tensor():
    # The first scale() makes the scale; the later ones take the short path of one tensor.
    scaler = ua.GradScaler(1024.0, backend="torch")
    for _ in range(2):
        out = scaler.scale(torch.tensor(2.0, dtype=torch.float16))
        assert out.dtype == torch.float16 and out.item() == 2048.0


def test_collapse_warns_on_the_torch_path():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ua.GradScaler(backend="torch", max_consecutive_skips=5)
    with pytest.warns(ua.ScaleCollapseWarning, match="collapsed at step 5: scale 2048.0"):
        for _ in range(7):
            scaler.scale(loss_of(model, *batch(poison=float("nan")))).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()


@pytest.mark.parametrize("kinds", [("plain", "plain"), ("fused", "fused"),
                                   ("plain", "fused"), ("fused", "plain")],
                         ids=["plain", "fused", "plain-then-fused", "fused-then-plain"])
def test_collapse_counts_only_skips_in_a_row(kinds):
    """Plain steps count the run on the host (they read the flag anyway), fused ones on
    the device; a loop that switches carries the run over. Four skips and a finite step,
    twice, are no collapse; five skips in a row are, reported at the period's end."""
    model = mlp()
    optimizers = {"plain": torch.optim.SGD(model.parameters(), lr=0.0),
                  "fused": torch.optim.AdamW(model.parameters(), lr=0.0, fused=True)}
    scaler = ua.GradScaler(backend="torch", max_consecutive_skips=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for update in range(1, 16):
            opt = optimizers[kinds[update > 12]]  # the switch falls inside the last run
            poison = None if update in (5, 10) else float("nan")
            scaler.scale(loss_of(model, *batch(poison=poison))).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    messages = [str(w.message) for w in caught if w.category is ua.ScaleCollapseWarning]
    assert len(messages) == 1 and "collapsed at step 15" in messages[0], messages


def test_collapse_counts_an_iteration_whose_first_optimizer_skipped():
    """Two plain optimizers, an inf in the first one's gradients only: every iteration
    skips (the second optimizer's finite step does not make it a finite one)."""
    a, b = mlp(seed=0), mlp(seed=1)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    scaler = ua.GradScaler(backend="torch", max_consecutive_skips=3)
    with pytest.warns(ua.ScaleCollapseWarning, match="collapsed at step 3: scale 8192.0"):
        for _ in range(3):
            losses = [loss_of(a, *batch(poison=float("inf"))), loss_of(b, *batch())]
            for loss in scaler.scale(losses):
                loss.backward()
            scaler.step(opt_a)
            scaler.step(opt_b)
            scaler.update()
            opt_a.zero_grad()
            opt_b.zero_grad()


# ---------------------------------------------------------------- skipped-step reporting


def test_lr_scheduler_steps_only_when_the_optimizer_stepped():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = ua.GradScaler(backend="torch")
    for poison in (None, float("inf"), None, float("nan"), None):
        scaler.scale(loss_of(model, *batch(poison=poison))).backward()
        scaler.step(opt)
        scaler.update()
        if not scaler.last_step_skipped:
            sched.step()
        opt.zero_grad()
    assert opt.param_groups[0]["lr"] == 0.5**3
    assert (scaler.num_steps, scaler.num_skipped_steps) == (5, 2)


# ---------------------------------------------------------------- state


def test_native_state_dict_round_trips_through_a_real_torch_scaler():
    ours = ua.GradScaler(256.0, growth_interval=4, backend="torch")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for poison in (None, None, float("inf"), None):
        ours.scale(loss_of(model, *batch(poison=poison))).backward()
        ours.step(opt)
        ours.update()
        opt.zero_grad()
    native = torch.amp.GradScaler("cpu")
    native.load_state_dict(ours.native_state_dict())
    assert native.get_scale() == ours.get_scale() == 128.0
    assert native._get_growth_tracker() == ours._get_growth_tracker() == 1
    back = ua.GradScaler(backend="torch")
    back.load_state_dict(native.state_dict())
    assert back.state == ours.state
    # torch's format has no init_scale: the loading scaler keeps its own
    assert back.config == ours.config.replace(init_scale=65536.0)
    with pytest.raises(ValueError, match="cannot carry this config"):
        ua.GradScaler(hysteresis=2, backend="torch").native_state_dict()


def test_canonical_state_moves_from_numpy_to_torch_and_resumes(tmp_path):
    source = ua.GradScaler(1024.0, 3.0, 0.25, 3, backend="numpy", hysteresis=2)
    from unifiedamp.backends.numpy import SGD

    opt = SGD([np.zeros(2, np.float32)])
    for grad in ([1.0, 1.0], [1.0, np.inf], [1.0, 1.0]):
        opt.grads = [np.array(grad, np.float32)]
        source.step(opt)
        source.update()
    path = tmp_path / "scaler.json"
    path.write_text(json.dumps(source.state_dict()))
    target = ua.GradScaler(backend="torch")
    target.load_state_dict(json.loads(path.read_text()))
    assert target.state == source.state == spec.ScalerState(1024.0, 1, 0)
    assert target.config == source.config


def test_failed_load_changes_nothing():
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(torch.ones(()))
    before = scaler.state_dict()
    with pytest.raises(ValueError, match="nothing was loaded"):
        scaler.load_state_dict({**before, "growth_tracker": -1})
    with pytest.raises(ValueError, match="it is empty"):
        scaler.load_state_dict({})
    assert scaler.state_dict() == before


def test_pickle_and_deepcopy_keep_config_and_state():
    scaler = ua.GradScaler(1024.0, hysteresis=3, backend="torch")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(loss_of(model, *batch(poison=float("inf")))).backward()
    scaler.step(opt)
    scaler.update()
    for clone in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert clone.state == scaler.state == spec.ScalerState(1024.0, 0, 1)
        assert clone.config == scaler.config and clone.num_skipped_steps == 1
    # A pickle of the previous release, whose skip counters had other names, still loads.
    old = scaler.__getstate__()
    old["_skipped_on_host"] = old.pop("_skip_count_host")
    old["_host_skips"] = old.pop("_consecutive_skips_host")
    old["_skips_on_device"] = old.pop("_device_holds_consecutive_skips")
    clone = type(scaler).__new__(type(scaler))
    clone.__setstate__(old)
    assert clone.state == scaler.state and clone.num_skipped_steps == 1


# ---------------------------------------------------------------- distributed


def test_inf_on_rank_1_only_makes_both_ranks_skip_and_agree():
    results = run_ranks({"init_scale": 1024.0, "growth_interval": 2}, ["F", "I"],
                        iterations=1)
    assert [r["stepped"] for r in results] == [False, False]
    assert [r["skipped"] for r in results] == [1, 1]
    assert [r["state"] for r in results] == [[512.0, 0, 0], [512.0, 0, 0]]


def test_ranks_agree_with_hysteresis_on_the_tensor_path():
    results = run_ranks({"init_scale": 1024.0, "hysteresis": 2, "min_scale": 1.0},
                        ["I", "F"], iterations=2)
    assert [r["state"] for r in results] == [[512.0, 0, 0], [512.0, 0, 0]]
    assert [r["stepped"] for r in results] == [False, False]


# ---------------------------------------------------------------- torch.compile


def test_compiled_model_gives_the_eager_trajectory():
    def run(compiled):
        model = mlp()
        forward = torch.compile(model) if compiled else model
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        scaler = ua.GradScaler(1024.0, growth_interval=2, hysteresis=2, backend="torch")
        for step in range(6):
            poison = float("inf") if step in (2, 3) else None
            scaler.scale(loss_of(forward, *batch(seed=step, poison=poison))).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        return scaler.state, [p.detach() for p in model.parameters()]

    (s1, p1), (s2, p2) = run(False), run(True)
    assert s1 == s2
    assert all(torch.allclose(a, b) for a, b in zip(p1, p2, strict=True))


def test_scale_traces_into_a_full_graph():
    model = mlp()
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(torch.ones(()))  # the scale tensor exists before tracing

    @torch.compile(fullgraph=True)
    def scaled_loss(x, y):
        return scaler.scale(loss_of(model, x, y))

    x, y = batch()
    assert torch.allclose(scaled_loss(x, y), loss_of(model, x, y) * 1024)


@pytest.mark.parametrize("config", [{}, {"hysteresis": 2, "min_scale": 1.0}],
                         ids=["torch-expressible", "extended"])
def test_scale_and_update_trace_into_full_graphs_with_the_eager_trajectory(config):
    """scale() and update() under torch.compile(fullgraph=True) (a graph break raises),
    with a fused optimizer's step between them: the same states as eager, skips included.
    (step() and unscale_() run eager, as torch.amp.GradScaler's do: dynamo does not trace
    torch's, and this scaler's follow them.)"""
    def run(compiled):
        model = mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch", device="cpu",
                               **config)

        def scaled_loss(x, y):
            return scaler.scale(loss_of(model, x, y))

        def update():
            scaler.update()

        if compiled:
            scaled_loss = torch.compile(scaled_loss, fullgraph=True)
            update = torch.compile(update, fullgraph=True)
        states = []
        for step in range(8):
            poison = float("inf") if step in (3, 4) else None
            scaled_loss(*batch(seed=step, poison=poison)).backward()
            scaler.step(opt)
            update()
            opt.zero_grad()
            states.append(scaler.state)
        return states, scaler.num_skipped_steps

    eager, compiled = run(False), run(True)
    assert compiled == eager and eager[1] == 2


# ---------------------------------------------------------------- CUDA


@CUDA
def test_cuda_fused_step_never_waits_for_the_device():
    model = mlp("cuda")
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = ua.GradScaler(1024.0, backend="torch", hysteresis=2, min_scale=1.0)
    x, y = batch("cuda")
    loss_of(model, x, y).backward()
    opt.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            opt.zero_grad()
            scaler.scale(loss_of(model, x, y)).backward()
            scaler.step(opt)
            scaler.update()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert scaler.get_scale() == 1024.0 and scaler.num_skipped_steps == 0


@CUDA
def test_cuda_scale_lives_on_the_parameters_device():
    model = mlp("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ua.GradScaler(backend="torch")
    scaler.scale(loss_of(model, *batch("cuda"))).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler._scale.device.type == "cuda" and scaler.state.scale == 65536.0


@CUDA
@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_cuda_tensor_op_rule_runs_as_a_replayed_graph_and_follows_the_spec(fused):
    """On CUDA the rule torch's kernel cannot run is compiled and replayed as a CUDA graph;
    it must give the spec's states step by step, across overflows and a config change."""
    model = mlp("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    scaler = ua.GradScaler(1024.0, growth_interval=2, hysteresis=2, min_scale=256.0,
                           backend="torch", device="cuda")
    expected = scaler.state
    for step in range(16):
        if step == 10:
            scaler.set_growth_factor(3.0)  # a new config: captured again
        poisoned = step in (3, 4, 7, 12, 13)
        scaler.scale(loss_of(model, *batch("cuda", seed=step,
                                           poison=float("inf") if poisoned else None))).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        expected = spec.update(scaler.config, expected, poisoned)
        assert scaler.state == expected, f"step {step}: {scaler.state} != {expected}"
    assert scaler._rule_graph is not None


def captured_training_step(model, opt, scaler, x, y):
    """The recipe of docs/backends/torch.md: one whole float16 step, captured as one
    CUDA graph after a warm-up on a side stream; returns the graph."""
    def step():
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            loss = loss_of(model, x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    return graph


@CUDA
@pytest.mark.parametrize("config", [{}, {"hysteresis": 2, "min_scale": 1.0}],
                         ids=["torch-expressible", "hysteresis-2"])
def test_cuda_graph_replays_follow_the_spec_across_overflows(config):
    model = mlp("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch", device="cuda",
                           **config)
    x, y = (t.clone() for t in batch("cuda"))
    graph = captured_training_step(model, opt, scaler, x, y)
    expected = scaler.state
    for step in range(12):
        poisoned = step in (4, 5, 9)
        x.copy_(batch("cuda", seed=step, poison=float("inf") if poisoned else None)[0])
        graph.replay()
        expected = spec.update(scaler.config, expected, poisoned)
        assert scaler.state == expected, f"replay {step}: {scaler.state} != {expected}"
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------- torch's private surface

# What the backend overrides or calls beyond torch.amp.GradScaler's public API, listed in
# unifiedamp.backends.torch._compat: parameter names of each method, how torch's own step()
# calls the two it overrides, the ops' schemas. A torch that changes any of them is outside
# the supported range.
PRIVATE_METHODS = _compat.PRIVATE_METHODS
STEP_CALLS = _compat.STEP_CALLS
OPS = _compat.OPS
STATE_ATTRIBUTES = _compat.STATE_ATTRIBUTES


def private_api_changes(scaler_cls):
    """How ``scaler_cls`` (torch.amp.GradScaler or a stand-in) differs from what we rely on."""
    changes = []
    for name, params in PRIVATE_METHODS.items():
        got = list(inspect.signature(getattr(scaler_cls, name)).parameters)
        if got != params:
            changes.append(f"{name}{tuple(got)}, expected {tuple(params)}")
    source = inspect.getsource(scaler_cls.step)
    changes += [f"step() no longer calls {call!r}" for call in STEP_CALLS if call not in source]
    for op, schemas in OPS.items():
        got = [str(s) for s in torch._C._jit_get_schemas_for_operator(f"aten::{op}")]
        if got != schemas:
            changes.append(f"torch.{op} has the schemas {got}, expected {schemas}")
    keys = set(_compat.empty_optimizer_state())
    if keys != _compat.OPTIMIZER_STATE_KEYS:
        changes.append(f"_refresh_per_optimizer_state() has the keys {sorted(keys)}")
    scaler = scaler_cls(device="cpu")
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    changes += [f"no attribute {a}" for a in STATE_ATTRIBUTES if not hasattr(scaler, a)]
    return changes


def test_torchs_private_surface_is_what_the_backend_was_written_for():
    supported = [r for r in importlib.metadata.requires("unifiedamp")
                 if r.startswith("torch") and 'extra == "torch"' in r]
    changes = private_api_changes(torch.amp.GradScaler)
    assert not changes, (
        f"torch {torch.__version__} changed the private torch.amp.GradScaler API that "
        f"unifiedamp's torch backend overrides or calls: {'; '.join(changes)}. The backend "
        f"supports {supported[0].split(';')[0]} (tested: 2.13.0 on CPU, 2.11 on CUDA); "
        "adapt unifiedamp/backends/torch/_compat.py or use a torch in that range")


def test_the_private_surface_check_sees_a_changed_step():
    # Shaped like a public pytorch revision (commit 0202916 of torch/amp/grad_scaler.py)
    # whose step() unpacks (retval, found_inf) from _maybe_opt_step.
    class NewerGradScaler(torch.amp.GradScaler):
        def step(self, optimizer, *args, return_found_inf=False, **kwargs):
            optimizer_state = {}
            retval, found_inf = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
            return (retval, found_inf) if return_found_inf else retval

    changes = private_api_changes(NewerGradScaler)
    assert changes == [f"step() no longer calls {STEP_CALLS[0]!r}",
                       f"step() no longer calls {STEP_CALLS[1]!r}"]


PROCESS_GROUP_CHECK = """
import torch.distributed as dist
from unifiedamp.backends.torch._compat import distributed_initialized
seen = [(distributed_initialized(), dist.is_initialized())]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
seen.append((distributed_initialized(), dist.is_initialized()))
dist.destroy_process_group()
seen.append((distributed_initialized(), dist.is_initialized()))
print(seen)
"""


def test_distributed_initialized_follows_torchs_process_group(run_python):
    # It reads torch.distributed's slot for the default group: a torch that moves it would
    # make the scaler skip the all-reduce of found_inf on every rank.
    if not torch.distributed.is_available():
        pytest.skip("this torch is built without torch.distributed")
    result = run_python(PROCESS_GROUP_CHECK, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[(False, False), (True, True), (False, False)]", (
        f"torch {torch.__version__}: unifiedamp.backends.torch._compat.distributed_initialized "
        f"no longer follows torch.distributed.is_initialized(): {result.stdout.strip()}")


def _is_private(dotted):
    """Whether a dotted name has a part that starts with ``_`` (dunders such as
    ``__version__`` are public)."""
    return any(part.startswith("_") and not part.endswith("__") for part in dotted.split("."))


def _dotted(node):
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _torch_private_members():
    """The private methods and attributes of a torch.amp.GradScaler whose scale exists."""
    scaler = torch.amp.GradScaler("cpu")
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    return {name for name in [*dir(torch.amp.GradScaler), *vars(scaler)] if _is_private(name)}


TORCH_PRIVATE_MEMBERS = _torch_private_members()


def private_torch_uses(source):
    """Each use in ``source`` of a private torch name: an import of one (``import torch._C``,
    ``from torch.utils._pytree import ...``, ``from torch.amp.grad_scaler import _x``), an
    attribute read through a name bound to torch or one of its modules (``torch._foreach_norm``,
    ``dist._x``), or a private member of ``torch.amp.GradScaler`` that is defined, called or
    read (``def _unscale_grads_``, ``self._scale``) and not declared in ``_compat``'s lists."""
    tree = ast.parse(source)
    uses, torch_names = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    torch_names.add(alias.asname or "torch")
                    if _is_private(alias.name):
                        uses.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level and \
                (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                torch_names.add(alias.asname or alias.name)
                if _is_private(f"{node.module}.{alias.name}"):
                    uses.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    declared = set(_compat.PRIVATE_METHODS) | set(_compat.STATE_ATTRIBUTES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] in torch_names and _is_private(node.attr) \
                    and not _is_private(_dotted(node.value)):  # the first private part only
                uses.append(f"line {node.lineno}: {dotted}")
            elif node.attr in TORCH_PRIVATE_MEMBERS and node.attr not in declared:
                uses.append(f"line {node.lineno}: .{node.attr}, torch.amp.GradScaler's")
        elif isinstance(node, ast.FunctionDef) and node.name in TORCH_PRIVATE_MEMBERS \
                and node.name not in declared:
            uses.append(f"line {node.lineno}: def {node.name}, torch.amp.GradScaler's")
    return sorted(uses, key=lambda use: int(use.split(":")[0].split()[1]))


def test_only_compat_uses_torchs_private_names():
    package = pathlib.Path(_compat.__file__).parent
    modules = sorted(path for path in package.glob("*.py") if path.name != "_compat.py")
    assert {path.name for path in modules} >= {"__init__.py", "_scaler.py", "_diagnostics.py",
                                               "_rule.py"}
    uses = {path.name: private_torch_uses(path.read_text()) for path in modules}
    assert not any(uses.values()), (
        f"private torch names outside unifiedamp/backends/torch/_compat.py: {uses}; reach "
        "them through _compat (and list torch.amp.GradScaler's members in its lists)")


def test_the_private_name_scan_sees_a_planted_use():
    planted = (
        "import torch\n"
        "import torch._dynamo\n"
        "import torch.distributed as dist\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state\n"
        "norms = torch._foreach_norm([torch.ones(2)], 2.0)\n"
        "schemas = torch._C._jit_get_schemas_for_operator\n"
        "rank = dist._rank_not_in_group(None)\n"
        "public = torch.__version__, torch.amp.GradScaler, dist.group.WORLD\n"
        "class Scaler(torch.amp.GradScaler):\n"
        "    def _check_scale_growth_tracker(self, *args):\n"
        "        return self._scale, super()._check_inf_per_device(args[0])\n"
        "    def _get_hysteresis_tracker(self):\n"
        "        return self._get_scale_async()\n"
    )
    assert private_torch_uses(planted) == [
        "line 2: import torch._dynamo",
        "line 4: from torch.utils._python_dispatch import TorchDispatchMode",
        "line 5: from torch.amp.grad_scaler import _refresh_per_optimizer_state",
        "line 6: torch._foreach_norm",
        "line 7: torch._C",
        "line 8: dist._rank_not_in_group",
        "line 11: def _check_scale_growth_tracker, torch.amp.GradScaler's",
        "line 14: ._get_scale_async, torch.amp.GradScaler's",
    ]


# ---------------------------------------------------------------- tools that take a torch scaler


def test_lightning_mixed_precision_plugin_takes_the_scaler_unchanged():
    L = pytest.importorskip("lightning")
    from lightning.pytorch.plugins import MixedPrecision

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    scaler = ua.GradScaler(1024.0, growth_interval=2, hysteresis=2, backend="torch")
    trainer = L.Trainer(max_steps=8, accelerator=device, devices=1, logger=False,
                        plugins=[MixedPrecision("16-mixed", device, scaler=scaler)],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Module(), data)
    assert trainer.strategy.precision_plugin.scaler is scaler
    assert scaler.num_steps == 8 and scaler.get_scale() == 1024.0 * 2**4


@pytest.mark.parametrize("device,message", [
    ("banana", r"device='banana' is not a device torch can use here \(not a device type "
               r"torch knows\): pass 'cpu'"),
    (42, r"device=42 is not a device torch can use here \(an int is an index of the current "
         r"accelerator"),
    (3.5, r"device=3.5 \(float\): pass a string"),
])
def test_a_device_torch_cannot_use_is_named_with_the_fix(device, message):
    if device == 42 and torch.accelerator.is_available():
        pytest.skip("an accelerator is here: device=42 is an index torch may accept")
    with pytest.raises((ValueError, TypeError), match=message):
        ua.GradScaler(backend="torch", device=device)


def test_pickling_in_the_middle_of_an_iteration_says_when_it_can_be_done():
    scaler = ua.GradScaler(1024.0, backend="torch", device="cpu")
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"middle of an iteration.*after update\(\); to "
                                           r"checkpoint, save scaler.state_dict\(\)"):
        pickle.dumps(scaler)
    scaler.step(opt)
    scaler.update()
    assert pickle.loads(pickle.dumps(scaler)).get_scale() == 1024.0
