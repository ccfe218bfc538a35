"""Hugging Face accelerate with unifiedamp's torch scaler, on CPU (where accelerate makes no
scaler of its own): ``use_scaler`` makes ``clip_grad_norm_``/``clip_grad_value_`` clip the
unscaled gradients, so a run with the scaler trains the same weights, bit for bit, as the run
without one, skipping the steps whose gradients overflow; a scaler set by hand as
``accelerator.scaler`` (which clips the scaled gradients) warns with the fix."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.callbacks.accelerate import use_scaler  # noqa: E402

#: Gradients here have a norm of about 20 and elements up to about 10: both clips bite.
MAX_NORM, CLIP_VALUE = 1.0, 0.5


def forget_accelerators():
    # accelerate keeps one process-wide state, which the first Accelerator fixes (mixed
    # precision, accumulation steps) and later ones must agree with.
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    forget_accelerators()
    yield
    forget_accelerators()


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(x, x.sum(1, keepdim=True) * 3) for x in torch.randn(n, 8, 4, generator=g)]


def train(scaler=None, hand_set=False, clip="norm", steps=6, poison=(), accumulate=1,
          mixed_precision="no"):
    """Trains a linear model with momentum SGD and an LR schedule; ``poison``: the
    optimizer steps (from 1) whose gradients hold an inf. Without a scaler, those steps
    are left out (no backward, no step), as the scaler skips them. Returns the weights,
    the norms clip_grad_norm_ returned, the learning rates and accelerate's skip flags."""
    forget_accelerators()
    accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision,
                              gradient_accumulation_steps=accumulate)
    if scaler is not None:
        if hand_set:
            accelerator.scaler = scaler  # the recipe this module replaces
        else:
            use_scaler(accelerator, scaler)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    model, opt, schedule = accelerator.prepare(model, opt, schedule)
    norms, lrs, skipped = [], [], []
    for i, (x, y) in enumerate(batches(steps * accumulate)):
        step = i // accumulate + 1
        trains = scaler is not None or step not in poison
        with accelerator.accumulate(model):
            if trains:
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if step in poison:
                    model.weight.grad[0, 1] = math.inf  # as a float16 overflow would
            if trains and accelerator.sync_gradients:
                if clip == "norm":
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(),
                                                                   MAX_NORM)))
                else:
                    accelerator.clip_grad_value_(model.parameters(), CLIP_VALUE)
            if trains:
                opt.step()
                schedule.step()
            opt.zero_grad()
            if accelerator.sync_gradients:
                skipped.append(accelerator.optimizer_step_was_skipped)
                lrs.append(opt.param_groups[0]["lr"])
    return [p.detach().clone() for p in model.parameters()], norms, lrs, skipped


def assert_same_weights(got, expected):
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e), (g, e)


def spec_scales(config, steps, poison):
    state, scales = spec.ScalerState(config.init_scale), []
    for step in range(1, steps + 1):
        state = spec.update(config, state, step in poison)
        scales.append(state.scale)
    return scales


def test_a_scaler_set_by_hand_clips_the_scaled_gradients_and_warns_with_the_fix():
    # The recipe docs/diagnostics.md showed: accelerate unscales only in its own fp16
    # mode on a GPU, so on a CPU clip_grad_norm_ sees the gradients times the scale.
    scaler = ua.GradScaler(1024.0, backend="torch")
    with pytest.warns(UserWarning, match=r"accelerator\.scaler = scaler.*clip_grad_norm_.*"
                      r"use_scaler\(accelerator, scaler\) before accelerator\.prepare"):
        weights, norms, _, _ = train(scaler, hand_set=True, steps=2)
    expected, true_norms, _, _ = train(steps=2)
    assert norms[0] == true_norms[0] * 1024  # the scaled gradients' norm, clipped
    assert not torch.equal(weights[0], expected[0])


@pytest.mark.parametrize("mixed_precision", ["no", "fp16"])
@pytest.mark.parametrize("clip", ["norm", "value"])
def test_clipping_after_use_scaler_trains_what_a_run_without_a_scaler_trains(
        clip, mixed_precision):
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch", history=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning on this path
        weights, norms, lrs, skipped = train(scaler, clip=clip, poison={3},
                                             mixed_precision=mixed_precision)
    expected, true_norms, expected_lrs, _ = train(clip=clip, poison={3})
    assert_same_weights(weights, expected)
    if clip == "norm":
        assert true_norms[0] > MAX_NORM  # the clip bit
        assert norms[:2] + norms[3:] == true_norms  # the unscaled gradients' norms
        assert norms[2] == math.inf  # the inf step: clipped, then skipped
    assert skipped == [False, False, True, False, False, False]
    assert lrs == expected_lrs  # the schedule did not step on the skipped step
    scales = [s for _, s, _ in scaler.history().as_list()]  # the scale each update left
    expected_scales = spec_scales(scaler.config, 6, poison={3})
    assert scales == expected_scales  # 1024, 2048, then backs off at step 3
    assert expected_scales[:4] == [1024.0, 2048.0, 1024.0, 1024.0]
    assert scaler.num_skipped_steps == 1


def test_torchs_own_scaler_works_the_same_way():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    weights, norms, _, skipped = train(scaler, poison={3})
    expected, true_norms, _, _ = train(poison={3})
    assert_same_weights(weights, expected)
    assert norms[:2] + norms[3:] == true_norms and skipped[2]
    assert scaler.get_scale() == 2048.0


def test_gradient_accumulation_clips_once_per_optimizer_step():
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
    weights, norms, _, skipped = train(scaler, accumulate=3, steps=4, poison={2})
    expected, true_norms, _, _ = train(accumulate=3, steps=4, poison={2})
    assert_same_weights(weights, expected)
    assert [norms[0], *norms[2:]] == true_norms
    assert skipped == [False, True, False, False]
    assert scaler.get_scale() == spec_scales(scaler.config, 4, poison={2})[-1] == 1024.0


def test_clipping_in_a_micro_step_that_does_not_step_raises_with_the_fix():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    use_scaler(accelerator, ua.GradScaler(1024.0, backend="torch"))
    model = torch.nn.Linear(4, 1)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(2, 4)).sum())
        assert not accelerator.sync_gradients
        with pytest.raises(RuntimeError, match=r"sync_gradients is False.*"
                           r"`if accelerator.sync_gradients:`"):
            accelerator.clip_grad_norm_(model.parameters(), 1.0)


def test_use_scaler_after_prepare_raises():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match=r"after accelerator\.prepare.*wrapped 1 optimizer"
                       r".*call use_scaler before prepare"):
        use_scaler(accelerator, ua.GradScaler(backend="torch"))
    assert accelerator.scaler is None


def test_use_scaler_takes_a_torch_scaler():
    with pytest.raises(TypeError, match=r"got NumpyGradScaler.*backend='torch'"):
        use_scaler(Accelerator(cpu=True), ua.GradScaler(backend="numpy"))


def test_save_state_and_load_state_carry_the_scaler(tmp_path):
    accelerator = Accelerator(cpu=True)
    scaler = use_scaler(accelerator, ua.GradScaler(64.0, growth_interval=1, hysteresis=2,
                                                   backend="torch"))
    model = torch.nn.Linear(4, 1)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(3):  # 64 -> 512
        accelerator.backward(model(torch.ones(2, 4)).sum())
        opt.step()
        opt.zero_grad()
    accelerator.save_state(tmp_path)
    restored = ua.GradScaler(backend="torch", hysteresis=2)
    accelerator.scaler = restored  # load_state reads into accelerator.scaler
    accelerator.load_state(tmp_path)
    assert restored.get_scale() == scaler.get_scale() == 512.0
    assert restored.state_dict() == scaler.state_dict()
