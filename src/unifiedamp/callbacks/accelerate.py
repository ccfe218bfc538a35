"""Hands a loss scaler to Hugging Face accelerate's ``Accelerator``: :func:`use_scaler`.

accelerate drives a scaler it is given as ``accelerator.scaler``: ``accelerator.backward``
scales the loss, and the optimizers ``prepare`` wraps call ``scaler.step`` and
``scaler.update``. But ``Accelerator.unscale_gradients``, which ``clip_grad_norm_`` and
``clip_grad_value_`` call first, unscales only in accelerate's own fp16 mode on a GPU; on a
CPU (and with ``mixed_precision="no"`` or ``"bf16"`` anywhere) it does nothing, so those
clip the *scaled* gradients and the step is up to ``scale`` times too small, without an
error. :func:`use_scaler` sets the scaler and makes ``unscale_gradients`` unscale through
it in every mode. Imports accelerate and torch.
"""

from __future__ import annotations

import types
from typing import Any, TypeVar

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType

from unifiedamp.backends.torch import TorchGradScaler

__all__ = ["use_scaler"]

_Scaler = TypeVar("_Scaler", bound=torch.amp.GradScaler)

# Where accelerate shards the gradients or scales the loss itself: unscaling through a
# scaler of the whole model is not what these need, and none of them is tested here.
_REFUSED = {
    DistributedType.DEEPSPEED: "DeepSpeed scales the loss itself (its fp16 config)",
    DistributedType.MEGATRON_LM: "Megatron-LM scales the loss itself",
    DistributedType.FSDP: "FSDP shards the gradients (accelerate gives it torch's "
                          "ShardedGradScaler in fp16 mode)",
    DistributedType.XLA: "XLA reduces the gradients inside clip_grad_norm_",
}


def use_scaler(accelerator: Accelerator, scaler: _Scaler) -> _Scaler:
    """Makes ``scaler`` the loss scaler of ``accelerator``; call it before ``prepare``.

    Then, in every mixed-precision mode of the Accelerator and on every device:

    * ``accelerator.backward(loss)`` runs ``scaler.scale(loss).backward()``;
    * ``accelerator.unscale_gradients()``, and so ``clip_grad_norm_`` and
      ``clip_grad_value_``, unscale the gradients with ``scaler.unscale_(optimizer)``:
      once per optimizer step, as torch's ``unscale_`` (the step then does not unscale
      again; a second unscale before the step is torch's RuntimeError);
    * ``optimizer.step()`` on a prepared optimizer runs ``scaler.step`` and
      ``scaler.update``, skipping the step when a gradient is inf/NaN
      (``accelerator.optimizer_step_was_skipped`` says so, and a prepared scheduler does
      not step then);
    * ``accelerator.save_state`` / ``load_state`` save and restore the scaler.

    With gradient accumulation (``accelerator.accumulate(model)``), clip under ``if
    accelerator.sync_gradients:``, as accelerate's docs do: unscaling in a micro-step that
    does not step would mix unscaled gradients with the next micro-steps' scaled ones, so
    it raises RuntimeError.

    Args:
        accelerator: An ``accelerate.Accelerator`` whose optimizers are not prepared yet.
        scaler: A torch loss scaler: ``unifiedamp.GradScaler(..., backend="torch")``
            (or a ``torch.amp.GradScaler``).

    Returns:
        ``scaler``.

    Raises:
        TypeError: ``scaler`` is not a torch loss scaler.
        RuntimeError: an optimizer was prepared already (its wrapper keeps the scaler it
            was given then).
        ValueError: DeepSpeed, Megatron-LM, FSDP, XLA or fp8, which scale or shard
            otherwise.

    Example:
        >>> import torch
        >>> from accelerate import Accelerator
        >>> import unifiedamp as ua
        >>> accelerator = Accelerator(cpu=True)  # no scaler of its own on a CPU
        >>> scaler = use_scaler(accelerator, ua.GradScaler(1024.0, backend="torch"))
        >>> model = torch.nn.Linear(2, 1)
        >>> model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> accelerator.backward(model(torch.ones(1, 2)).sum() * 100)
        >>> norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)  # unscaled first
        >>> round(float(norm), 3)  # the norm of the true gradients, not 1024 times it
        173.205
        >>> opt.step()
        >>> opt.zero_grad()
        >>> accelerator.optimizer_step_was_skipped, scaler.get_scale()
        (False, 1024.0)
    """
    if not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(
            f"use_scaler takes a torch loss scaler, got {type(scaler).__name__}: pass "
            "unifiedamp.GradScaler(..., backend='torch')")
    refused = _REFUSED.get(accelerator.distributed_type)
    if refused is None and getattr(accelerator, "fp8_enabled", False):
        refused = "fp8 training brings its own scaling recipe"
    if refused is not None:
        raise ValueError(
            f"use_scaler does not support this Accelerator "
            f"(distributed_type={accelerator.distributed_type!s}, "
            f"mixed_precision={accelerator.mixed_precision!r}): {refused}. Use accelerate's "
            "own scaling there, or a single-process or DDP Accelerator.")
    prepared = list(getattr(accelerator, "_optimizers", ()))
    if prepared:
        raise RuntimeError(
            f"use_scaler(accelerator, scaler) came after accelerator.prepare(...) had "
            f"wrapped {len(prepared)} optimizer(s), which keep the scaler they were given "
            "then and would not skip or update with this one: call use_scaler before "
            "prepare.")
    accelerator.scaler = scaler
    # An instance attribute: accelerate's clip_grad_norm_ and clip_grad_value_ call
    # self.unscale_gradients(), which finds it before the class's method.
    accelerator.unscale_gradients = types.MethodType(_unscale_gradients, accelerator)
    if isinstance(scaler, TorchGradScaler):
        # Clipping through this Accelerator unscales: the scaler's warning about a scaler
        # set by hand does not apply.
        scaler._unscaled_by_accelerator = True
    return scaler


def _unscale_gradients(self: Accelerator, optimizer: Any = None) -> None:
    # accelerate's Accelerator.unscale_gradients, without its "fp16 mode on a GPU only"
    # condition.
    if not self.sync_gradients:
        raise RuntimeError(
            "accelerator.unscale_gradients (from clip_grad_norm_ or clip_grad_value_) in a "
            "micro-step that does not step the optimizer (accelerator.sync_gradients is "
            "False): the gradients are still being accumulated at the loss scale, and "
            "unscaling them now would mix unscaled and scaled gradients. Clip under "
            "`if accelerator.sync_gradients:`.")
    if optimizer is None:
        optimizer = self._optimizers
    elif not isinstance(optimizer, (tuple, list)):
        optimizer = [optimizer]
    for opt in optimizer:
        while isinstance(opt, AcceleratedOptimizer):
            opt = opt.optimizer
        assert self.scaler is not None  # use_scaler set it before installing this method
        self.scaler.unscale_(opt)
