"""The Hugging Face ``Trainer`` (which runs on accelerate and clips the gradients by default,
``max_grad_norm=1.0``) with unifiedamp's torch scaler handed to ``trainer.accelerator`` by
``use_scaler``, on CPU: it trains the weights a run without a scaler trains, bit for bit, and
skips a step whose loss is inf."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.callbacks.accelerate import use_scaler  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    # Each Trainer builds an Accelerator; accelerate's process-wide state must not carry
    # the previous one's settings.
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


class Regression(torch.nn.Module):
    """Returns ``{"loss": ...}`` as a transformers model does; the loss is inf at the
    forward calls in ``poison`` (counted from 1)."""

    def __init__(self, poison=()):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 1)
        self.poison, self.calls = set(poison), 0

    def forward(self, x, y):
        self.calls += 1
        loss = torch.nn.functional.mse_loss(self.linear(x), y)
        return {"loss": loss * math.inf if self.calls in self.poison else loss}


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.randn(4, generator=torch.Generator().manual_seed(i))
        return {"x": x, "y": x.sum(0, keepdim=True) * 3}


def trainer(tmp_path, model, fp16=False, steps=4, accumulate=1):
    args = TrainingArguments(
        tmp_path, use_cpu=True, fp16=fp16, max_steps=steps, per_device_train_batch_size=8,
        gradient_accumulation_steps=accumulate, learning_rate=0.05, seed=0,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    assert args.max_grad_norm == 1.0  # the Trainer clips by default
    return Trainer(model=model, args=args, train_dataset=Data())


@pytest.mark.parametrize(("fp16", "accumulate"), [(False, 1), (True, 1), (False, 2)],
                         ids=["fp32", "fp16-on-cpu", "accumulate-2"])
def test_the_trainer_with_use_scaler_trains_what_it_trains_without_a_scaler(
        tmp_path, fp16, accumulate):
    reference = trainer(tmp_path / "a", Regression(), fp16=fp16, accumulate=accumulate)
    # On a CPU accelerate makes no scaler, in fp16 mode too (and computes in float32).
    assert reference.accelerator.scaler is None
    reference.train()
    summary = reference.state.log_history[-1]
    scaled = trainer(tmp_path / "b", Regression(), fp16=fp16, accumulate=accumulate)
    scaler = use_scaler(scaled.accelerator, ua.GradScaler(1024.0, backend="torch"))
    scaled.train()
    for got, expected in zip(scaled.model.parameters(), reference.model.parameters(),
                             strict=True):
        assert torch.equal(got, expected), (got, expected)
    assert scaled.state.log_history[-1]["train_loss"] == summary["train_loss"]
    assert scaler.num_skipped_steps == 0 and scaler.get_scale() == 1024.0


def test_an_inf_loss_skips_the_step_and_backs_off(tmp_path):
    scaled = trainer(tmp_path, Regression(poison={2}))
    scaler = use_scaler(scaled.accelerator,
                        ua.GradScaler(1024.0, growth_interval=100, backend="torch"))
    scaled.train()
    assert scaled.state.global_step == 4 and scaler.num_skipped_steps == 1
    assert scaler.get_scale() == spec.update(
        scaler.config, spec.ScalerState(1024.0), found_inf=True).scale == 512.0
    assert all(torch.isfinite(p).all() for p in scaled.model.parameters())


def test_a_scaler_set_by_hand_on_the_trainer_warns_with_the_fix(tmp_path):
    scaled = trainer(tmp_path, Regression(), steps=1)
    scaled.accelerator.scaler = ua.GradScaler(1024.0, backend="torch")
    with pytest.warns(UserWarning, match=r"Hugging Face Trainer, which clips by default.*"
                      r"use_scaler\(accelerator, scaler\)"):
        scaled.train()


def test_a_checkpoint_carries_the_scaler_and_resuming_restores_it(tmp_path):
    def run(steps, poison=()):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        args = TrainingArguments(
            tmp_path, use_cpu=True, max_steps=steps, per_device_train_batch_size=8,
            report_to="none", save_strategy="steps", save_steps=2, logging_strategy="no",
            disable_tqdm=True)
        trainer = Trainer(model=Regression(poison), args=args, train_dataset=Data())
        scaler = use_scaler(trainer.accelerator,
                            ua.GradScaler(1024.0, growth_interval=100, backend="torch"))
        return trainer, scaler

    first, scaler = run(2, poison={1})
    first.train()
    assert (tmp_path / "checkpoint-2" / "scaler.pt").exists() and scaler.get_scale() == 512.0
    resumed, scaler = run(4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert scaler.get_scale() == 512.0  # the checkpoint's, not its own 1024
