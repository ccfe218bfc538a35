"""What the diagnostics tests of the imperative scalers share (NumPy's in
tests/core/test_diagnostics_numpy.py, Paddle's in tests/paddle/test_diagnostics_paddle.py):
the batch of the small two-layer model, NumPy's own count of a gradient's overflow, the spec's
history of a run, and the option values both constructors refuse.

Imports no framework.
"""

from __future__ import annotations

import numpy as np

from unifiedamp import spec

INF, NAN = float("inf"), float("nan")

#: Values of diagnose= and history= the constructors refuse before building anything.
BAD_DIAGNOSE = [1, 0, "yes", None, np.bool_(True)]
BAD_HISTORY = [-1, 1.5, True, "10", None]


def expected_overflow(grad: np.ndarray) -> tuple[int, int, float]:
    """(inf, nan, largest finite |g|) by plain NumPy, independently of count_overflow."""
    finite = np.isfinite(grad)
    largest = float(np.abs(grad[finite]).max()) if finite.any() else 0.0
    return int(np.isinf(grad).sum()), int(np.isnan(grad).sum()), largest


def batch(seed=1, poison=None, n_in=4, n_out=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, n_in)).astype(np.float32)
    y = rng.standard_normal((6, n_out)).astype(np.float32)
    if poison is not None:  # in the target: relu would drop a NaN input (paddle's does)
        y[0, 0] = poison
    return x, y


def reference_history(config, skips):
    """[(iteration, scale the update left, skipped)] by unifiedamp.spec, one update at a
    time."""
    state, out = spec.ScalerState.initial(config), []
    for i, skipped in enumerate(skips, start=1):
        state = spec.update(config, state, skipped)
        out.append((i, state.scale, skipped))
    return out
