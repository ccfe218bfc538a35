"""Skipped steps on the torch backend: a scale backed off so far that its reciprocal
overflows (every step skips, as the spec says), the functional ``unscale(grads)`` and its
flag, the collapse warning's count of skips in a row, and a loop that reads
``last_step_skipped`` (an LR scheduler)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import batch, loss_of, mlp  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402

# ---------------------------------------------------------------- an unscalable scale


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


# ---------------------------------------------------------------- the functional unscale


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


# ---------------------------------------------------------------- collapse


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
