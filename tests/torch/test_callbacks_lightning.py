"""The Lightning callback ``ScaleLogger``, with the real Trainer on CPU and a CSVLogger: the
rows are at the expected steps, the scale matches the scaler's own record and the spec,
and a step forced to overflow shows up in the skipped-step counts."""

from __future__ import annotations

import csv
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.callbacks.lightning import ScaleLogger  # noqa: E402


class Model(L.LightningModule):
    """A linear regression whose loss is multiplied by inf at the optimizer steps
    ``poison`` (counted from 1), which the scaler must skip."""

    def __init__(self, poison=(), fused=False):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.poison = set(poison)
        self.fused = fused

    def training_step(self, batch, index):
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        if self.global_step + 1 in self.poison:
            loss = loss * math.inf
        return loss

    def configure_optimizers(self):
        if self.fused:
            return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True)
        return torch.optim.SGD(self.parameters(), lr=0.01)


def data(batches=32):
    x = torch.randn(batches * 4, 4, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def fit(tmp_path, model, scaler=None, steps=12, every=3, precision=None, device="cpu",
        callbacks=None, **trainer_options):
    logger = CSVLogger(tmp_path)
    plugins = [] if scaler is None else [MixedPrecision("16-mixed", device, scaler=scaler)]
    trainer = L.Trainer(max_steps=steps, accelerator=device, devices=1, logger=logger,
                        precision=precision, plugins=plugins,
                        callbacks=callbacks or [ScaleLogger(every_n_steps=every)],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=1, **trainer_options)
    trainer.fit(model, data())
    return trainer, rows(logger)


def rows(logger):
    path = f"{logger.log_dir}/metrics.csv"
    try:
        with open(path) as f:
            return [r for r in csv.DictReader(f) if r.get("loss_scale")]
    except FileNotFoundError:
        return []


def spec_scales(config, steps, poison):
    """The scale after each update (index k: after update k + 1), per the spec."""
    state, scales = spec.ScalerState(config.init_scale), []
    for step in range(1, steps + 1):
        state = spec.update(config, state, step in poison)
        scales.append(state.scale)
    return scales


@pytest.mark.parametrize("fused", [False, True], ids=["sgd", "fused-adamw"])
def test_rows_follow_the_scalers_history_and_count_a_forced_skip(tmp_path, fused):
    # A small scale: from 1024, six growths overflow float16 in this model's gradients.
    scaler = ua.GradScaler(64.0, growth_interval=2, backend="torch", history=16)
    trainer, got = fit(tmp_path, Model(poison=[5], fused=fused), scaler)
    assert trainer.global_step == 12 and scaler.num_skipped_steps == 1
    assert [int(r["step"]) for r in got] == [3, 6, 9, 12]
    # The scale after update k, in the scaler's ring (the last one: get_scale()).
    history = {i: s for i, s, _ in scaler.history().as_list()}
    after = [history[k] for k in (3, 6, 9, 12)]
    assert after[-1] == scaler.get_scale()
    assert [float(r["loss_scale"]) for r in got] == after
    expected = spec_scales(scaler.config, 12, poison={5})
    assert after == [expected[k - 1] for k in (3, 6, 9, 12)]
    assert [int(r["skipped_steps"]) for r in got] == [0, 1, 1, 1]
    assert [s for s in scaler.history().skipped].count(True) == 1


def test_torch_amp_grad_scaler_skips_are_counted_from_the_scale(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    trainer, got = fit(tmp_path, Model(poison=[4, 8, 9]), scaler, steps=10, every=2)
    assert trainer.precision_plugin.scaler is scaler
    expected = spec_scales(spec.ScalerConfig(1024.0, growth_interval=2), 10, {4, 8, 9})
    assert [(int(r["step"]), float(r["loss_scale"])) for r in got] == [
        (k, expected[k - 1]) for k in (2, 4, 6, 8, 10)]
    assert [int(r["skipped_steps"]) for r in got] == [0, 1, 1, 2, 3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed is bf16 on a CPU")
def test_lightnings_own_16_mixed_scaler_is_read(tmp_path):
    trainer, got = fit(tmp_path, Model(poison=[2]), precision="16-mixed", steps=4, every=4,
                       device="cuda")
    assert isinstance(trainer.precision_plugin.scaler, torch.amp.GradScaler)
    assert [(int(r["step"]), int(r["skipped_steps"])) for r in got] == [(4, 1)]
    assert float(got[0]["loss_scale"]) == trainer.precision_plugin.scaler.get_scale()


def test_gradient_accumulation_logs_once_per_multiple_of_optimizer_steps(tmp_path):
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
    trainer, got = fit(tmp_path, Model(poison=[3]), scaler, steps=6, every=2,
                       accumulate_grad_batches=3)
    assert [int(r["step"]) for r in got] == [2, 4, 6]
    assert [int(r["skipped_steps"]) for r in got] == [0, 1, 1]
    expected = spec_scales(scaler.config, 6, {3})
    assert [float(r["loss_scale"]) for r in got] == [expected[1], expected[3], expected[5]]


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_trainer_without_a_scaler_gets_one_warning_and_no_rows(tmp_path, precision):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, got = fit(tmp_path, Model(), precision=precision, steps=4, every=1)
    messages = [str(w.message) for w in caught if "ScaleLogger" in str(w.message)]
    assert len(messages) == 1 and "no loss scaler" in messages[0]
    assert "16-mixed" in messages[0] and got == []


def test_every_n_steps_is_validated():
    for bad in (0, -1, 2.5, True, "50"):
        with pytest.raises(ValueError, match=rf"every_n_steps must be an int >= 1, got {bad!r}"):
            ScaleLogger(every_n_steps=bad)
    for name in ("prog_bar", "logger"):
        with pytest.raises(TypeError, match=rf"{name} must be True or False, got 1"):
            ScaleLogger(**{name: 1})


def test_every_logger_of_the_trainer_gets_the_rows(tmp_path):
    loggers = [CSVLogger(tmp_path / "a"), CSVLogger(tmp_path / "b")]
    scaler = ua.GradScaler(64.0, growth_interval=2, backend="torch")
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=loggers,
                        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                        callbacks=[ScaleLogger(every_n_steps=2, prefix="amp/")],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Model(poison=[1]), data())
    for logger in loggers:
        with open(f"{logger.log_dir}/metrics.csv") as f:
            got = [(r["step"], r["amp/loss_scale"], r["amp/skipped_steps"])
                   for r in csv.DictReader(f)]
        assert got == [("2", "32.0", "1"), ("4", "64.0", "1")]


class TwoOptimizers(L.LightningModule):
    """Manual optimization stepping two optimizers per batch (a GAN's shape): the
    global step moves by two, and rows come at the first step past each multiple."""

    def __init__(self, poison_batch):
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
        self.poison_batch = poison_batch

    def training_step(self, batch, index):
        for opt, net in zip(self.optimizers(), (self.a, self.b), strict=True):
            loss = torch.nn.functional.mse_loss(net(batch[0]), batch[1])
            if index == self.poison_batch and net is self.b:
                loss = loss * math.inf
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    def configure_optimizers(self):
        return (torch.optim.SGD(self.a.parameters(), lr=0.01),
                torch.optim.SGD(self.b.parameters(), lr=0.01))


def test_several_optimizer_steps_per_batch_log_past_each_multiple(tmp_path):
    scaler = ua.GradScaler(64.0, growth_interval=100, backend="torch")
    trainer, got = fit(tmp_path, TwoOptimizers(poison_batch=2), scaler, steps=10, every=3)
    assert trainer.global_step == 10
    assert [int(r["step"]) for r in got] == [4, 6, 10]
    assert [int(r["skipped_steps"]) for r in got] == [0, 1, 1]
    assert [float(r["loss_scale"]) for r in got] == [64.0, 32.0, 32.0]


def test_skipped_steps_count_over_every_fit_of_the_callback(tmp_path):
    callback = ScaleLogger(every_n_steps=2)
    scaler = ua.GradScaler(64.0, growth_interval=100, backend="torch")
    model = Model(poison=[1, 4])
    for run, steps in enumerate((2, 4)):
        logger = CSVLogger(tmp_path / str(run))
        trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=logger,
                            plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                            callbacks=[callback], enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(model, data())  # a new trainer: steps 1 to 4, skipping 1 and 4
        assert [(int(r["step"]), int(r["skipped_steps"])) for r in rows(logger)] == [
            [(2, 1)], [(2, 2), (4, 3)]][run]
    assert scaler.num_skipped_steps == 3


# ---------------------------------------------------------------- Lightning's logging


class Probe(L.Callback):
    """Records what the progress bar would show after each batch (after ScaleLogger)."""

    def __init__(self):
        self.shown = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        bar = trainer.progress_bar_callback
        metrics = bar.get_metrics(trainer, pl_module) if bar else trainer.progress_bar_metrics
        self.shown.append((trainer.global_step, metrics.get("loss_scale"),
                           metrics.get("skipped_steps")))


@pytest.mark.parametrize("logger", [True, False], ids=["with-logger", "trainer-logger-false"])
def test_the_progress_bar_shows_the_last_row(tmp_path, logger):
    scaler = ua.GradScaler(64.0, growth_interval=2, backend="torch")
    probe = Probe()
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1,
                        logger=CSVLogger(tmp_path) if logger else False,
                        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                        callbacks=[ScaleLogger(every_n_steps=2), probe],
                        enable_checkpointing=False, enable_progress_bar=True,
                        enable_model_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Model(poison=[3]), data())
    assert not [w for w in caught if "ScaleLogger" in str(w.message)]
    # Rows at steps 2, 4, 6 (the scale after each); the bar keeps a row until the next.
    assert probe.shown == [(1, None, None), (2, 128.0, 0.0), (3, 128.0, 0.0), (4, 64.0, 1.0),
                           (5, 64.0, 1.0), (6, 128.0, 1.0)]
    assert trainer.callback_metrics["loss_scale"] == 128.0


def test_prog_bar_false_and_logger_false_leave_each_out(tmp_path):
    def scaler():
        return ua.GradScaler(64.0, growth_interval=2, backend="torch")

    trainer, got = fit(tmp_path / "a", Model(), scaler(), steps=4,
                       callbacks=[ScaleLogger(every_n_steps=2, prog_bar=False)])
    assert [(r["step"], r["loss_scale"]) for r in got] == [("2", "128.0"), ("4", "256.0")]
    assert "loss_scale" not in trainer.progress_bar_metrics
    trainer, got = fit(tmp_path / "b", Model(), scaler(), steps=4,
                       callbacks=[ScaleLogger(every_n_steps=2, logger=False)])
    assert got == [] and trainer.progress_bar_metrics["loss_scale"] == 256.0
    with pytest.warns(UserWarning, match="ScaleLogger logs nothing: prog_bar=False and logger"):
        fit(tmp_path / "c", Model(), scaler(), steps=2,
            callbacks=[ScaleLogger(prog_bar=False, logger=False)])


def test_16_mixed_on_a_cpu_is_bf16_with_no_scaler():
    """What the docs say Lightning does with precision="16-mixed" on a CPU."""
    with pytest.warns(UserWarning, match="fp16 is not supported on CPU. Using "
                      "`precision='bf16-mixed'` instead"):
        trainer = L.Trainer(accelerator="cpu", precision="16-mixed", logger=False,
                            enable_progress_bar=False, enable_checkpointing=False)
    plugin = trainer.precision_plugin
    assert isinstance(plugin, MixedPrecision) and plugin.precision == "bf16-mixed"
    assert plugin.scaler is None


# ---------------------------------------------------------------- clipping, accumulation


class Elementwise(L.LightningModule):
    """``y = sum(x * w) + b``: elementwise products, which autocast leaves in float32, so
    the run under ``MixedPrecision("16-mixed")`` computes what a float32 run computes
    and the scale is the only difference. Loss times inf at the optimizer steps
    ``poison`` (from 1)."""

    def __init__(self, poison=()):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4))
        self.b = torch.nn.Parameter(torch.zeros(1))
        self.poison = set(poison)

    def forward(self, x):
        return (x * self.w).sum(-1, keepdim=True) + self.b

    def training_step(self, batch, index):
        loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
        return loss * math.inf if self.global_step + 1 in self.poison else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def float32_run(steps, accumulate, clip, algorithm, poison):
    """The run without a scaler: plain torch, skipping the ``poison`` steps."""
    model = Elementwise()
    opt = model.configure_optimizers()
    batches = iter(data())
    for step in range(1, steps + 1):
        for _ in range(accumulate):
            x, y = next(batches)
            if step not in poison:
                (torch.nn.functional.mse_loss(model(x), y) / accumulate).backward()
        if step not in poison:
            if algorithm == "norm":
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            else:
                torch.nn.utils.clip_grad_value_(model.parameters(), clip)
            opt.step()
        opt.zero_grad()
    return list(model.parameters())


@pytest.mark.parametrize(("algorithm", "accumulate"),
                         [("norm", 1), ("value", 1), ("norm", 3)],
                         ids=["norm", "value", "norm-accumulate-3"])
def test_gradient_clipping_clips_the_unscaled_gradients(tmp_path, algorithm, accumulate):
    clip = {"norm": 1.0, "value": 0.25}[algorithm]  # both bite: gradient norms of 5 to 10
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
    model = Elementwise(poison=[3])
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False,
                        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                        gradient_clip_val=clip, gradient_clip_algorithm=algorithm,
                        accumulate_grad_batches=accumulate, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data())
    expected = float32_run(6, accumulate, clip, algorithm, poison={3})
    for got, want in zip(model.parameters(), expected, strict=True):
        assert torch.equal(got, want), (got, want)
    assert scaler.num_skipped_steps == 1
    assert scaler.get_scale() == spec_scales(scaler.config, 6, poison={3})[-1] == 2048.0


class ManualElementwise(Elementwise):
    """Manual optimization, clipping where ``clip_in`` says: ``"hook"``, in
    ``on_before_optimizer_step`` (Lightning calls it after ``scaler.unscale_``), or
    ``"training_step"``, between ``manual_backward`` and ``opt.step()``."""

    def __init__(self, clip_in, poison=()):
        super().__init__(poison)
        self.automatic_optimization = False
        self.clip_in = clip_in

    def training_step(self, batch, index):
        opt = self.optimizers()
        self.manual_backward(super().training_step(batch, index))
        if self.clip_in == "training_step":
            self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt.step()
        opt.zero_grad()

    def on_before_optimizer_step(self, optimizer):
        if self.clip_in == "hook":
            self.clip_gradients(optimizer, gradient_clip_val=1.0, gradient_clip_algorithm="norm")


@pytest.mark.parametrize("clip_in", ["hook", "training_step"])
def test_manual_optimization_clips_unscaled_gradients_in_on_before_optimizer_step(clip_in):
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
    model = ManualElementwise(clip_in, poison=[3])
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False,
                        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, data())
    expected = float32_run(6, 1, 1.0, "norm", poison={3})
    same = all(torch.equal(g, w) for g, w in zip(model.parameters(), expected, strict=True))
    # Lightning unscales inside opt.step(): clipping before it clips the scaled gradients
    # (with Lightning's own scaler too), which the docs say.
    assert same == (clip_in == "hook")
    assert scaler.num_skipped_steps == 1
