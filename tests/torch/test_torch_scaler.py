"""The PyTorch backend's scaler in a training loop: a real ``torch.amp.GradScaler`` that runs
torch's kernels where torch's rule is asked for, the same trajectories and gradients as
torch's own scaler, torch's errors with the fix, and the tools that take a torch scaler.

The shared contract runs in ``tests/torch/test_conformance.py``; host reads and the fused
path, skips, state, devices and torch's private surface have files of their own
(``tests/torch/test_torch_*.py``)."""

from __future__ import annotations

import copy
import random

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import DEVICES, OPTIMIZERS, CountOps, batch, loss_of, mlp  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.backends.torch import TorchGradScaler  # noqa: E402

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
        with CountOps() as rec:
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
    scaler.update(new_scale=torch.tensor([0.1], dtype=torch.float64))
    assert scaler.get_scale() == spec.f32(0.1)
    for bad, exc in [(0.0, ValueError), (float("nan"), ValueError), ("8", TypeError),
                     (torch.ones(2), TypeError), (torch.ones(1, requires_grad=True), TypeError),
                     (torch.ones(1, dtype=torch.int32), TypeError)]:
        with pytest.raises(exc, match="new_scale must be"):
            scaler.update(new_scale=bad)
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
