"""How the conformance suite drives the NumPy backend: SGD with momentum over NumPy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from unifiedamp.backends.numpy import SGD
from unifiedamp.conformance.interface import STEP_KINDS, ImperativeAdapter, Problem

__all__ = ["NumpyAdapter"]


def make_problem() -> Problem:
    """SGD with momentum over a float32 and a float64 parameter.

    NumPy has no autodiff: the gradients are those of ``loss = sum(w * c)``,
    ``c`` times the scale, as ``scaler.scale(loss)`` would backpropagate them.
    """
    opt = SGD([np.zeros(4, np.float32), np.ones(2, np.float64)], lr=0.1, momentum=0.9)

    def set_grads(kind: str, scaler: Any) -> None:
        # |c| <= 0.5 keeps a finite step finite at every float32 scale.
        c = np.full(4, 0.5, np.float32)
        c[1] = STEP_KINDS[kind]
        opt.grads = [scaler.scale(c), scaler.scale(np.full(2, 0.25, np.float64))]

    def snapshot() -> list[np.ndarray]:
        return [*opt.params, *opt.velocity, np.array(opt.step_count)]

    return Problem(opt, set_grads, snapshot)


class NumpyAdapter(ImperativeAdapter):
    """Drives the NumPy backend (or a subclass of it) with :func:`make_problem`.

    Example:
        >>> from unifiedamp.backends.numpy import NumpyGradScaler
        >>> NumpyAdapter(NumpyGradScaler).name
        'numpy'
    """

    def __init__(self, scaler_cls: Any):
        super().__init__(scaler_cls, make_problem, info={
            "framework": "numpy", "version": np.__version__, "device": "cpu"})
