"""The one-layer problem of the TensorFlow and Paddle engines, and its reference weights.

Each rank trains ``Linear(FEATURES, 1)`` (every weight at :data:`START`) with SGD on one
example whose element :data:`PLANTED` holds the step's kind (``STEP_KINDS``); the loss is
``sum(model(x)) * LOSS_FACTOR`` averaged over the ranks, so its gradient does not depend
on the weights and a finite step stays finite at every float32 scale.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unifiedamp.conformance.interface import STEP_KINDS

FEATURES = 4
LEARNING_RATE = 0.1
START = 0.1
PLANTED = 1
LOSS_FACTOR = 2.0**-4


def example(kind: str) -> np.ndarray:
    """One rank's ``[1, FEATURES]`` example for a step of ``kind``.

    Example:
        >>> example("I").tolist()
        [[0.5, inf, 0.5, 0.5]]
    """
    x = np.full((1, FEATURES), STEP_KINDS["F"], np.float32)
    x[0, PLANTED] = STEP_KINDS[kind]
    return x


def reference(kinds_per_rank: Sequence[str]) -> list[list[float]]:
    """The weights (the ``[FEATURES, 1]`` weight, then the bias) after each step of one
    process that takes the spec's steps on the ranks' mean gradient: a step with an inf
    or NaN on any rank leaves them as they were.

    Example:
        >>> [round(w, 6) for w in reference(["F", "F"])[0]]
        [0.096875, 0.096875, 0.096875, 0.096875, 0.09375]
    """
    weights = np.full(FEATURES + 1, START, np.float32)
    grad = (np.float32(LOSS_FACTOR) * np.append(
        np.full(FEATURES, STEP_KINDS["F"], np.float32), np.float32(1.0))).astype(np.float32)
    out = []
    for step in range(len(kinds_per_rank[0])):
        if not any(k[step] in "IN" for k in kinds_per_rank):
            weights = (weights - np.float32(LEARNING_RATE) * grad).astype(np.float32)
        out.append([float(w) for w in weights])
    return out
