"""Logs a Lightning run's loss scale and skipped optimizer steps: :class:`ScaleLogger`.

The scaler is the trainer's (``trainer.precision_plugin.scaler``): Lightning's own
``torch.amp.GradScaler`` with ``precision="16-mixed"`` on a GPU, or a unifiedamp scaler given
to the ``MixedPrecision`` plugin (the one way to get a scaler on a CPU, where Lightning turns
``"16-mixed"`` into ``"bf16-mixed"``)::

    from lightning.pytorch.plugins import MixedPrecision
    scaler = unifiedamp.GradScaler(backend="torch", hysteresis=2)
    trainer = Trainer(precision=None, callbacks=[ScaleLogger(every_n_steps=50)],
                      plugins=[MixedPrecision("16-mixed", "cuda", scaler=scaler)])

The values go to Lightning's progress bar and ``trainer.callback_metrics`` through
``pl_module.log``, and to every logger of the trainer (TensorBoard, CSV, W&B...) through
``logger.log_metrics`` at ``step=trainer.global_step``, at this callback's own cadence:
Lightning's ``log_every_n_steps`` does not apply. This module imports Lightning
(``lightning.pytorch``, else ``pytorch_lightning``).
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # one base class for type checkers (either package has the same API)
    import lightning.pytorch as pl
    from lightning.pytorch.utilities import rank_zero_warn
else:
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.utilities import rank_zero_warn
    except ImportError:  # the standalone package; its Trainer takes only its own Callbacks
        import pytorch_lightning as pl  # the same API, another name
        from pytorch_lightning.utilities import rank_zero_warn

import torch

__all__ = ["ScaleLogger"]


class ScaleLogger(pl.Callback):
    """Every ``every_n_steps`` optimizer steps, logs the loss scale and the skipped steps.

    Metrics (each name after ``prefix``), for the optimizer step ``trainer.global_step``
    (the number of optimizer steps taken, counting skipped ones, so the first row of
    ``every_n_steps=50`` is step 50):

    * ``loss_scale``: the scale after that step's update (what ``scaler.get_scale()``
      returns then, and what the next step's loss is multiplied by).
    * ``skipped_steps``: optimizer steps skipped (inf/NaN gradients) since this
      callback's first fit began, over every fit it is used in (as the Keras
      ``ScaleLogger`` counts), an int; the skips in the last ``every_n_steps`` steps are
      the difference of two rows.

    Where they go:

    * ``prog_bar=True``: Lightning's progress bar and ``trainer.callback_metrics``,
      through ``pl_module.log(..., prog_bar=True, logger=False)``; the bar keeps the last
      row's values until the next row.
    * ``logger=True``: every logger of the trainer, with ``logger.log_metrics(metrics,
      step=trainer.global_step)``. Not through ``pl_module.log``: Lightning would write the
      row at its batch counter, one less than the number of optimizer steps, and only at
      multiples of ``log_every_n_steps``. ``skipped_steps`` stays an int there.

    A row is made in the batch whose optimizer step reaches a multiple of
    ``every_n_steps`` (with several optimizers stepping in one batch, at the step after
    it). A unifiedamp scaler counts its skipped steps itself (``num_skipped_steps``).
    For ``torch.amp.GradScaler``, which does not, a skip is a batch after which the
    scale went down (torch backs off at every inf and only then; several skips in one
    batch count as one): the callback keeps the scale after each batch that stepped
    on the device (one small copy) and reads them all once per row. Reading the scaler
    waits for the device once per row, never in between. With no scaler
    (``precision="32-true"``, ``"bf16-mixed"``, ``"16-mixed"`` on a CPU...), or a disabled
    one, or nowhere to log (``logger=False`` on the trainer and ``prog_bar=False``), it
    warns once and logs nothing.

    Args:
        every_n_steps: Log a row at every multiple of this many optimizer steps.
        prefix: Put before each metric's name (e.g. ``"amp/"``).
        prog_bar: Show the values in Lightning's progress bar.
        logger: Write the rows to the trainer's loggers.

    Example:
        >>> import tempfile, torch, lightning.pytorch as pl
        >>> from lightning.pytorch.loggers import CSVLogger
        >>> from lightning.pytorch.plugins import MixedPrecision
        >>> import unifiedamp as ua
        >>> class Model(pl.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 1)
        ...     def training_step(self, batch, index):
        ...         return self.net(batch[0]).pow(2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.01)
        >>> data = torch.utils.data.DataLoader(
        ...     torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
        >>> scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
        >>> logger = CSVLogger(tempfile.mkdtemp())
        >>> trainer = pl.Trainer(
        ...     max_steps=4, accelerator="cpu", logger=logger, enable_progress_bar=False,
        ...     enable_checkpointing=False, enable_model_summary=False,
        ...     plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        ...     callbacks=[ScaleLogger(every_n_steps=2)])
        >>> trainer.fit(Model(), data)
        >>> import csv
        >>> with open(f"{logger.log_dir}/metrics.csv") as f:
        ...     [(r["step"], r["loss_scale"], r["skipped_steps"]) for r in csv.DictReader(f)]
        [('2', '2048.0', '0'), ('4', '4096.0', '0')]
        >>> trainer.progress_bar_metrics  # the last row, as the progress bar shows it
        {'loss_scale': 4096.0, 'skipped_steps': 0.0}
    """

    def __init__(self, every_n_steps: int = 50, prefix: str = "", prog_bar: bool = True,
                 logger: bool = True):
        # int beside Integral for type checkers, which do not know that int is an Integral.
        if (isinstance(every_n_steps, bool)
                or not isinstance(every_n_steps, (int, numbers.Integral))
                or every_n_steps < 1):
            raise ValueError(f"every_n_steps must be an int >= 1, got {every_n_steps!r}: "
                             "pass e.g. every_n_steps=50")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a string, got {prefix!r}: pass e.g. prefix='amp/'")
        for name, value in (("prog_bar", prog_bar), ("logger", logger)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        super().__init__()
        self.every_n_steps = int(every_n_steps)
        self.prefix = prefix
        self.prog_bar = prog_bar
        self.logger = logger
        self._scaler: Any = None
        self._warned = False
        self._total = 0  # over every fit
        self._seen_step = 0  # the global step at the last batch seen

    # ------------------------------------------------------------ Lightning's hooks

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._scaler = self._scaler_of(trainer)
        self._seen_step = trainer.global_step
        if self._scaler is None:
            return
        if self._counts_skips(self._scaler):
            self._counted = int(self._scaler.num_skipped_steps)
        else:
            # The scale before the first step: get_scale() is the initial value on the
            # host while torch's scale tensor does not exist yet.
            self._last_scale = float(self._scaler.get_scale())
            self._scales: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step, previous = trainer.global_step, self._seen_step
        if self._scaler is None or step == previous:
            return  # no scaler, or no optimizer step in this batch (gradient accumulation)
        self._seen_step = step
        scaler = self._scaler
        if not self._counts_skips(scaler):
            scale = scaler._get_scale_async()
            if scale is not None:
                self._scales.append(scale.detach().clone())  # no read: a copy on the device
        # A multiple of every_n_steps reached in this batch (several optimizers can step
        # in one batch of manual optimization, so the step may pass it).
        if step // self.every_n_steps > previous // self.every_n_steps:
            self._log_row(trainer, pl_module, step)

    # ------------------------------------------------------------ helpers

    @staticmethod
    def _counts_skips(scaler: Any) -> bool:
        return hasattr(scaler, "num_skipped_steps")

    def _scaler_of(self, trainer: pl.Trainer) -> Any:
        plugin = getattr(trainer, "precision_plugin", None) or trainer.strategy.precision_plugin
        scaler = getattr(plugin, "scaler", None)
        if scaler is None or not scaler.is_enabled():
            self._warn_once(
                f"ScaleLogger logs nothing: the trainer's precision plugin "
                f"({type(plugin).__name__}) has {'a disabled' if scaler else 'no'} loss scaler "
                "(only float16 needs one: precision='32-true' and 'bf16-mixed' have none, and "
                "on a CPU Lightning turns precision='16-mixed' into 'bf16-mixed'). Pass "
                "plugins=[MixedPrecision('16-mixed', device, scaler=unifiedamp.GradScaler("
                "backend='torch'))] (on a GPU, precision='16-mixed' also has one), or drop "
                "the callback.")
            return None
        if not self.prog_bar and not (self.logger and trainer.loggers):
            self._warn_once(
                "ScaleLogger logs nothing: prog_bar=False and "
                + ("logger=False" if not self.logger else "the trainer has no logger")
                + "; pass ScaleLogger(prog_bar=True), or a logger, e.g. "
                "Trainer(logger=CSVLogger('logs')) with ScaleLogger(logger=True).")
            return None
        return scaler

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            rank_zero_warn(message, category=UserWarning)

    def _skips_since_last_row(self) -> int:
        scaler = self._scaler
        if self._counts_skips(scaler):
            counted = int(scaler.num_skipped_steps)  # reads the device after fused steps
            skipped, self._counted = counted - self._counted, counted
            return skipped
        if not self._scales:
            return 0
        scales = torch.stack([s.to(self._scales[0].device) for s in self._scales]).tolist()
        self._scales = []
        previous = [self._last_scale, *scales[:-1]]
        self._last_scale = scales[-1]
        return sum(now < before for now, before in zip(scales, previous, strict=True))

    def _log_row(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> None:
        self._total += self._skips_since_last_row()
        scale_name, skipped_name = f"{self.prefix}loss_scale", f"{self.prefix}skipped_steps"
        scale = float(self._scaler.get_scale())
        if self.logger:
            for logger in trainer.loggers:
                logger.log_metrics({scale_name: scale, skipped_name: self._total}, step=step)
        if self.prog_bar:
            # Lightning keeps floats (an int would be converted, with a warning).
            for name, value in ((scale_name, scale), (skipped_name, float(self._total))):
                pl_module.log(name, value, prog_bar=True, logger=False, on_step=True,
                              on_epoch=False)
