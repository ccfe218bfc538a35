"""What ``watch``, ``overflow_report`` and ``history`` need on Paddle.

The members themselves are :class:`~unifiedamp.backends._imperative.ImperativeDiagnostics`'
(shared with NumPy); :class:`PaddleDiagnostics` gives them Paddle's parts: the history ring
in tensors on the scaler's place (written with device ops, read by ``history()``), the
counts of a gradient in one host read, and the counts taken before Paddle's CPU kernel
changes the gradients (``diagnose=True``): it multiplies every float32 gradient by 0 when it
finds inf/NaN, so an inf then reads as NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from unifiedamp.backends._imperative import ImperativeDiagnostics, LastUpdate, report_note
from unifiedamp.backends.paddle._compat import KERNEL_DTYPES, dense, indexed_params
from unifiedamp.diagnostics import GradientOverflow, OverflowReport

#: The note of a report whose float32 gradients Paddle's CPU kernel has changed.
ZEROED = ("Paddle's CPU kernel multiplied these float32 gradients by 0 when it found inf/NaN, "
          "so an inf reads as NaN and the largest finite value as 0: the names are right; "
          "build the scaler with diagnose=True for the counts.")


def wide(tensor: Any) -> Any:
    """``tensor`` in a dtype Paddle's CPU kernels take for ``abs`` and friends (they lack
    float16/bfloat16): float32 unless it is float32 or float64."""
    if tensor.dtype in (paddle.float32, paddle.float64):
        return tensor
    return tensor.astype(paddle.float32)


def nonfinite(grads: list[Any]) -> list[bool]:
    """Which gradients hold inf/NaN: one finite check each, one host read for all."""
    if not grads:
        return []
    flags = paddle.stack([paddle.isfinite(wide(g)).all() for g in grads])
    return [not bool(f) for f in flags.numpy()]


def overflow_counts(grad: Any) -> tuple[tuple[int, ...], int, int, float]:
    """``(shape, inf, nan, largest finite |g|)`` of a gradient, in one host read."""
    g = wide(grad)
    finite = paddle.isfinite(g)
    largest = paddle.where(finite, g.abs(), paddle.zeros_like(g)).max()
    inf, nan, largest = paddle.stack([
        paddle.isinf(g).sum().astype(paddle.float64), paddle.isnan(g).sum().astype(paddle.float64),
        largest.astype(paddle.float64)]).numpy().tolist()
    return tuple(grad.shape), int(inf), int(nan), largest


def _changed_by_the_kernel(grad: Any) -> bool:
    return grad.dtype in KERNEL_DTYPES and grad.place.is_cpu_place()


class PaddleDiagnostics(ImperativeDiagnostics):
    """The Paddle scaler's diagnostics: the shared members, Paddle's hooks."""

    _parameter_type = paddle.Tensor
    _parameter_kind = "paddle.Tensor"
    #: Where the scale, and the history ring, live (set by the scaler).
    _place: Any
    #: ``diagnose=True`` on a CPU place: id(optimizer) -> {parameter index: counts}, taken
    #: this iteration before the kernel ran.
    _prechecked: dict[int, dict[int, tuple[Any, ...]]]

    def _multiply(self, tensor: Any, reciprocal: bool = False) -> Any:
        raise NotImplementedError  # the scaler's: tensor times the scale (or 1/scale)

    def _to_ring(self, values: np.ndarray) -> Any:
        return paddle.to_tensor(values, place=self._place)

    def _from_ring(self, stored: Any) -> np.ndarray:
        return stored if isinstance(stored, np.ndarray) else stored.numpy()

    def _precheck(self, indexed: list[tuple[int, Any]]) -> dict[int, tuple[Any, ...]]:
        """The counts of the float32 gradients on a CPU place that hold inf/NaN, taken
        before Paddle's CPU kernel multiplies them by 0 (parameter index -> counts); on
        other places the kernel leaves them readable and this checks nothing."""
        cpu = [(k, g) for k, g in indexed if _changed_by_the_kernel(g)]
        bad = nonfinite([g for _, g in cpu])
        # Counted as the kernel would have stored them: unscaled.
        return {k: overflow_counts(self._multiply(g, reciprocal=True))
                for (k, g), b in zip(cpu, bad, strict=True) if b}

    def _compute_report(self, last: LastUpdate, at_update: bool) -> OverflowReport:
        several = len(last.optimizers) > 1
        found: dict[int, GradientOverflow] = {}  # position among the checked -> overflow
        todo = []  # (position, name, gradient) to check now
        zeroed = False  # a CPU float32 gradient, multiplied by 0 by the kernel
        position = 0
        for k, optimizer in enumerate(last.optimizers):
            prechecked = last.prechecked.get(id(optimizer))
            for index, (fallback, param) in enumerate(indexed_params(optimizer)):
                if param.grad is None:
                    continue
                name = self._gradient_name(param, fallback, k, several)
                grad = dense(param.grad)
                if prechecked is not None and _changed_by_the_kernel(grad):
                    if index in prechecked:
                        found[position] = GradientOverflow(name, *prechecked[index])
                else:
                    todo.append((position, name, grad))
                position += 1
        for (pos, name, grad), bad in zip(todo, nonfinite([g for _, _, g in todo]),
                                          strict=True):
            if bad:
                found[pos] = GradientOverflow(name, *overflow_counts(grad))
                zeroed = zeroed or _changed_by_the_kernel(grad)
        overflows = [found[pos] for pos in sorted(found)]
        loss_finite = (None if last.loss is None
                       else bool(paddle.isfinite(wide(last.loss)).all()))
        note = report_note(
            last, bool(overflows), position, at_update, items="tensors", clear="clear_grad",
            changed=" (clear_grad() zeroes them)", zeroed=ZEROED if zeroed else "")
        return OverflowReport(last.step, last.scale, overflows, position, loss_finite, note)
