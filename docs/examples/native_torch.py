"""A conformance adapter for a scaler this project did not write: ``torch.amp.GradScaler``.

Run the suite on it from this directory (a relative PYTHONPATH works):

    PYTHONPATH=. unifiedamp conformance --backend native_torch:NativeTorch

The zoo's own adapter of it is ``unifiedamp.conformance.zoo.torch_grad_scaler``.
"""

from __future__ import annotations

import functools

import torch

from unifiedamp.conformance import ImperativeAdapter
from unifiedamp.conformance.adapters.torch import make_problem
from unifiedamp.spec import ScalerConfig


class NativeTorch(ImperativeAdapter):
    """``torch.amp.GradScaler("cpu")``, an Adam problem, ``scale(loss).backward()`` each step.

    Its constructor has no ``hysteresis``, ``min_scale``, ``max_scale`` or ``dynamic``:
    ImperativeAdapter fixes them at the spec's defaults, so the suite draws configs and
    vectors only where they hold. torch also refuses factors of 1, said here.
    """

    def __init__(self) -> None:
        super().__init__(functools.partial(torch.amp.GradScaler, "cpu"),
                         lambda: make_problem("adam", "cpu")[0], name="torch.amp.GradScaler",
                         info={"framework": "torch", "version": torch.__version__,
                               "device": "cpu"})

    def expresses(self, config: ScalerConfig) -> str | None:
        if config.growth_factor <= 1 or config.backoff_factor >= 1:
            return "torch.amp.GradScaler asserts growth_factor > 1 and backoff_factor < 1"
        return super().expresses(config)
