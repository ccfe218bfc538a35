"""The PyTorch backend: a real ``torch.amp.GradScaler`` that follows the spec bit for bit.

Where torch can express the config (growth_factor > 1, backoff_factor < 1,
hysteresis 1, no min/max scale, dynamic) the update runs torch's own kernel
with the factors rounded to float32, which gives the spec's bits. Otherwise the
same rule runs as a few tensor ops on the scale's device. Either way ``unscale_`` and
``update`` never wait for the device; the plain (non-fused) ``step`` reads one flag to
decide whether to call ``optimizer.step()``, as torch's does, and fused optimizers get
``grad_scale``/``found_inf`` and skip on the device with no read at all.

Diagnostics (``docs/diagnostics.md``): ``overflow_report()`` names the gradients that
held inf/NaN at a skipped step and is computed only after a skip; ``history=N`` keeps
the last N (iteration, scale, skipped) records in a ring on the scale's device, one
small op per update; ``diagnose=True`` computes the report inside a skipped ``update()``
(plain optimizers: free on other steps; fused ones: one read of found_inf per update).

The modules: ``_scaler`` (``TorchGradScaler``), ``_rule`` (the update rule on tensors,
compiled on CUDA), ``_diagnostics`` (``watch``, ``overflow_report``, ``history``),
``_devices`` (where the scale lives, ranks), ``_compat`` (the one module that touches
torch's private API, with the supported torch versions).
"""

from __future__ import annotations

from unifiedamp.backends import show_as_public
from unifiedamp.backends.torch._rule import COMPILED_RULE_DEVICES, torch_expressible
from unifiedamp.backends.torch._scaler import TorchGradScaler
from unifiedamp.errors import ScaleNotCalledError

__all__ = ["COMPILED_RULE_DEVICES", "ScaleNotCalledError", "TorchGradScaler",
           "torch_expressible"]


show_as_public(TorchGradScaler, __name__)
show_as_public(torch_expressible, __name__)
