"""A Keras callback that logs the loss scale and the skipped steps of a model trained with
``KerasGradScaler.wrap``: :class:`ScaleLogger`.

It writes ``loss_scale`` and ``skipped_steps`` into the ``logs`` dict that Keras hands every
callback, so whatever logs it (``keras.callbacks.CSVLogger``, ``TensorBoard``, ``History``,
the progress bar) records them with the loss. Imports Keras.
"""

from __future__ import annotations

import numbers
from typing import Any

import keras

from unifiedamp.backends.keras import SpecLossScaleOptimizer
from unifiedamp.backends.keras._paths import read_float, read_int

__all__ = ["ScaleLogger"]


class _Plain:
    """What keeps a logged number plain in Keras's progress bar, which shows every log value
    as ``f"{v / 1:.4f}"`` (``.4e`` at 0.001 and below; ``np.mean(v)`` first, unless ``v``
    is a float): ``65536.0000`` for a scale, ``0.0000e+00`` for no skip. Everything else
    (CSVLogger, History, TensorBoard, arithmetic) sees the number itself."""

    def mean(self, *args: Any, **kwargs: Any) -> Any:
        return self  # np.mean(v) calls v.mean(): the value itself, not a float64

    def __truediv__(self, other: Any) -> Any:
        return self if other == 1 else super().__truediv__(other)  # type: ignore[misc]

    def __format__(self, spec: str) -> str:
        # Fixed and exponent notations (Keras's) print the number as it is; others as usual.
        if spec.startswith(".") and spec[-1:] in ("f", "e"):
            return _plain(self)
        return super().__format__(spec)


def _plain(value: Any) -> str:
    """``65536``, ``0.5``, ``3``: a whole number without a fraction, else its repr."""
    number = float(value)
    return str(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number)


class _Scale(_Plain, float):
    """The logged ``loss_scale``: a float; ``65536`` in the progress bar."""


class _Count(_Plain, int):
    """The logged ``skipped_steps``: an int; ``0`` in the progress bar."""


class ScaleLogger(keras.callbacks.Callback):
    """Puts ``loss_scale`` and ``skipped_steps`` into the train logs every ``every_n_steps``
    steps, and at the end of every epoch.

    Batch logs get them at the batch where the number of train steps this callback has
    seen reaches a multiple of ``every_n_steps`` (``TensorBoard(update_freq=N)`` with the
    same N records them); epoch logs always, since ``CSVLogger`` and ``History`` log per
    epoch. Keras hands each callback the same dict in list order: put ``ScaleLogger``
    before the loggers that should see its values.

    - ``loss_scale``: the wrapped optimizer's scale when the logs were written: the scale
      the logged step's update left (``docs/diagnostics.md``, "Steps and scales"), a float.
    - ``skipped_steps``: the train steps skipped since this callback's first training
      began (over every ``fit`` it is used in), an int: the steps it saw less the growth
      of the inner optimizer's iteration count, which Keras advances on applied steps
      only. No counter is added to the optimizer, and nothing is read from it between
      the logged steps (under JAX, reading syncs the train state: once every N steps).

    Keras's progress bar shows both as they are (``loss_scale: 32768 - skipped_steps:
    1``), where it would print any other number as ``32768.0000`` and a 0 as
    ``0.0000e+00``; ``CSVLogger`` and ``History`` get the numbers.

    The model must be compiled with the optimizer ``KerasGradScaler.wrap`` returns (a
    :class:`~unifiedamp.backends.keras.SpecLossScaleOptimizer`); ``fit`` raises a
    TypeError at once otherwise.

    Args:
        every_n_steps: How often batch logs carry the values (an int >= 1).

    Attributes:
        loss_scale: The last value logged (None before).
        skipped_steps: The last value logged (None before).

    Example:
        >>> import keras, numpy as np
        >>> from unifiedamp.backends.keras import KerasGradScaler
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer=KerasGradScaler(64.0).wrap(keras.optimizers.SGD()),
        ...               loss="mse")
        >>> x = np.ones((4, 2), np.float32)
        >>> x[1, 0] = np.inf  # the second of four batches overflows
        >>> history = model.fit(x, np.ones((4, 1)), batch_size=1, verbose=0,
        ...                     callbacks=[ScaleLogger(every_n_steps=2)])
        >>> history.history["loss_scale"], history.history["skipped_steps"]
        ([32.0], [1])
    """

    def __init__(self, every_n_steps: int = 50):
        super().__init__()
        # int beside Integral for type checkers, which do not know that int is an Integral.
        if (not isinstance(every_n_steps, (int, numbers.Integral))
                or isinstance(every_n_steps, bool)
                or every_n_steps < 1):
            raise ValueError(f"every_n_steps must be an int >= 1, got {every_n_steps!r}: "
                             "e.g. ScaleLogger(every_n_steps=50)")
        self.every_n_steps = int(every_n_steps)
        self.loss_scale: float | None = None
        self.skipped_steps: int | None = None
        self._steps = 0            # train steps seen before the current epoch
        self._epoch_steps = 0      # train steps of the current epoch
        self._skipped_before = 0   # skipped steps of the earlier fits
        self._steps_at_begin = 0   # self._steps when the current fit began
        self._iterations_at_begin = 0
        self._next_log = self.every_n_steps

    # ------------------------------------------------------------ reading the optimizer

    def _optimizer(self) -> SpecLossScaleOptimizer:
        # self.model syncs JAX's train state into the variables first.
        opt = getattr(self.model, "optimizer", None)
        if isinstance(opt, SpecLossScaleOptimizer):
            return opt
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            found = ("Keras's own LossScaleOptimizer (a mixed_float16 policy wraps an "
                     "optimizer compile gets in it)")
        else:
            found = "no optimizer" if opt is None else type(opt).__name__
        raise TypeError(f"ScaleLogger logs the optimizer that KerasGradScaler.wrap returns; "
                        f"model.optimizer is {found}: compile the model with "
                        f"optimizer=scaler.wrap(keras.optimizers.Adam(...)), where scaler = "
                        f"KerasGradScaler(...) (or ua.GradScaler(..., backend='keras'))")

    @staticmethod
    def _iterations(opt: SpecLossScaleOptimizer) -> int:
        # The inner optimizer's own count of applied steps (iterations divides it by
        # gradient_accumulation_steps, where set).
        inner = opt.inner_optimizer
        return read_int(getattr(inner, "_iterations", inner.iterations))

    def _write(self, logs: dict[str, Any] | None) -> None:
        opt = self._optimizer()
        steps = self._steps + self._epoch_steps - self._steps_at_begin
        applied = self._iterations(opt) - self._iterations_at_begin
        self.loss_scale = read_float(opt.dynamic_scale)
        self.skipped_steps = self._skipped_before + steps - applied
        if logs is not None:
            logs["loss_scale"] = _Scale(self.loss_scale)
            logs["skipped_steps"] = _Count(self.skipped_steps)

    # ------------------------------------------------------------ Keras's hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._steps_at_begin = self._steps
        self._epoch_steps = 0
        self._iterations_at_begin = self._iterations(self._optimizer())

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_steps = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # ``batch`` is the index of the step's last batch in the epoch (with
        # steps_per_execution > 1 Keras calls this once per execution).
        self._epoch_steps = batch + 1
        if self._steps + self._epoch_steps >= self._next_log:
            self._write(logs)
            total = self._steps + self._epoch_steps
            self._next_log = (total // self.every_n_steps + 1) * self.every_n_steps

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._write(logs)
        self._steps += self._epoch_steps
        self._epoch_steps = 0

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._steps += self._epoch_steps  # a fit stopped inside an epoch
        self._epoch_steps = 0
        self._write(None)
        self._skipped_before = self.skipped_steps or 0
        self._steps_at_begin = self._steps
        self._iterations_at_begin = self._iterations(self._optimizer())
