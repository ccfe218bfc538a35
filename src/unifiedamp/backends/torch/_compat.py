"""The one module of the torch backend that touches torch's private API.

Supported: ``torch>=2.4`` (the ``torch`` extra of pyproject.toml); tested on torch 2.13
(CPU) and 2.11 (CUDA). Beyond ``torch.amp.GradScaler``'s public members the backend relies
on what this module names: two private ops and one private foreach op, torch's per-optimizer
state (``OptState`` and its factory), the dispatch-mode query, the attribute by which an
optimizer says it skips on the device, the private methods the scaler overrides and the
private attributes it shares with torch's class, the copy of torch's fused-optimizer
branch of ``step()`` (:func:`fused_step`), and torch.distributed's slot for the default
process group (:func:`distributed_initialized`).

``tests/torch/test_torch_private_api.py`` checks these against the torch installed: the methods'
parameters, how torch's own ``step()`` calls the two it overrides, the ops' schemas, the
per-optimizer state's keys, the attributes, and that :func:`distributed_initialized` agrees
with ``torch.distributed.is_initialized()`` around a process group; a torch that changes one
fails there, naming the change and this range. It also scans the package: no other module
imports or reads a private torch name, and every private member of ``torch.amp.GradScaler``
the scaler overrides, calls or reads is listed here.
"""

from __future__ import annotations

import inspect
import math
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state
from torch.utils._python_dispatch import _get_current_dispatch_mode

if TYPE_CHECKING:
    from unifiedamp.backends.torch._scaler import TorchGradScaler

__all__ = [
    "OPS", "OPTIMIZER_STATE_KEYS", "PRIVATE_METHODS", "STATE_ATTRIBUTES", "STEPS_ON_DEVICE",
    "STEP_CALLS", "OptState", "current_dispatch_mode", "distributed_initialized",
    "empty_optimizer_state", "fused_step",
    "inf_norms", "takes_grad_scaler", "unscale_and_check_", "unscale_grads_", "update_scale_",
]

#: The private methods of ``torch.amp.GradScaler`` the scaler overrides or calls, with
#: their parameters: a torch that changes any of them is outside the supported range.
PRIVATE_METHODS: dict[str, list[str]] = {
    "_maybe_opt_step": ["self", "optimizer", "optimizer_state", "args", "kwargs"],
    "_check_inf_per_device": ["self", "optimizer"],
    "_lazy_init_scale_growth_tracker": ["self", "dev"],
    "_unscale_grads_": ["self", "optimizer", "inv_scale", "found_inf", "allow_fp16"],
}

#: How torch's own ``step()`` calls the two methods overridden on its path.
STEP_CALLS = ["retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)",
              "self._check_inf_per_device(optimizer)"]

#: The private ops called, with every schema of each (its overloads) they were written for.
OPS: dict[str, list[str]] = {
    "_amp_update_scale_": [
        "aten::_amp_update_scale_(Tensor(a!) self, Tensor(b!) growth_tracker, Tensor found_inf, "
        "float scale_growth_factor, float scale_backoff_factor, int growth_interval) "
        "-> Tensor(a!)"],
    "_amp_foreach_non_finite_check_and_unscale_": [
        "aten::_amp_foreach_non_finite_check_and_unscale_(Tensor(a!)[] self, Tensor(b!) "
        "found_inf, Tensor inv_scale) -> ()"],
    "_foreach_norm": [
        "aten::_foreach_norm.Scalar(Tensor[] self, Scalar ord=2, ScalarType? dtype=None) "
        "-> Tensor[]",
        "aten::_foreach_norm.Scalar_out(Tensor[] self, Scalar ord=2, ScalarType? dtype=None, "
        "*, Tensor(a!)[] out) -> ()"],
}

#: The private attributes of ``torch.amp.GradScaler`` the scaler reads or writes.
STATE_ATTRIBUTES = ["_scale", "_growth_tracker", "_per_optimizer_states", "_enabled", "_device",
                    "_init_scale", "_init_growth_tracker", "_growth_factor", "_backoff_factor",
                    "_growth_interval"]

#: The keys of one optimizer's entry in ``_per_optimizer_states``.
OPTIMIZER_STATE_KEYS = {"stage", "found_inf_per_device"}

#: The attribute by which an optimizer says its ``step()`` takes ``grad_scale`` and
#: ``found_inf`` and skips on the device (torch's fused optimizers set it).
STEPS_ON_DEVICE = "_step_supports_amp_scaling"

#: ``empty_optimizer_state()``: one optimizer's state before its first check this iteration
#: (``{"stage": OptState.READY, "found_inf_per_device": {}}``), the factory of torch's
#: ``defaultdict`` of them.
empty_optimizer_state = _refresh_per_optimizer_state


def current_dispatch_mode() -> Any:
    """The ``TorchDispatchMode`` active (a FLOP counter, a debug mode), or None."""
    return _get_current_dispatch_mode()


#: ``update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
#: growth_interval)``: torch's update of the scale and its growth tracker, in place on the
#: device, what ``torch.amp.GradScaler.update`` runs. The op itself, not a function around
#: it: update() runs it at every iteration, and a Python call is host time a launch-bound
#: step waits for (``tests/torch/test_call_counts.py``).
update_scale_ = torch._amp_update_scale_


#: torch.distributed's registry of process groups (``distributed_c10d._world``, made once
#: at its import and never replaced; None in a torch built without torch.distributed).
_PROCESS_GROUPS: Any = None
if torch.distributed.is_available():
    from torch.distributed import distributed_c10d

    _PROCESS_GROUPS = distributed_c10d._world


def distributed_initialized() -> bool:
    """``torch.distributed.is_initialized()`` in one Python call instead of three (it reads
    the default group through two properties): asked at every check of found_inf, to
    all-reduce it when a process group exists."""
    return _PROCESS_GROUPS is not None and _PROCESS_GROUPS._default_pg is not None


#: ``unscale_and_check_(grads, found_inf, inv_scale)``: multiplies ``grads`` (one device,
#: one dtype) by ``inv_scale`` in place and sets ``found_inf`` (a 0-dim float32 tensor) to
#: 1.0 if one of them held inf or NaN, looking at the gradients before the multiply: torch's
#: fused kernel, what ``torch.amp.GradScaler.unscale_`` runs. The op itself, as
#: :data:`update_scale_` is: ``unscale_()`` runs it at every iteration.
unscale_and_check_ = torch._amp_foreach_non_finite_check_and_unscale_


def unscale_grads_(scaler: TorchGradScaler, optimizer: torch.optim.Optimizer,
                   inv_scale: torch.Tensor, found_inf: torch.Tensor,
                   allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
    """``torch.amp.GradScaler._unscale_grads_``, which the scaler's class takes as its own:
    the optimizer's gradients split by device and dtype (a sparse one by its coalesced
    values), unscaled and checked by :data:`unscale_and_check_`, grad mode off; the flag of each
    device returned. The same checks, errors and kernels, less torch's per-call helper
    objects, its copies of ``inv_scale`` and ``found_inf`` onto their own device (two
    kernels), and its ``no_grad`` context (frames): host time at every iteration.

    Example:
        >>> from unifiedamp.backends.torch import TorchGradScaler
        >>> param = torch.nn.Parameter(torch.ones(2))
        >>> param.grad = torch.tensor([4.0, float("inf")])
        >>> optimizer = torch.optim.SGD([param])
        >>> found = unscale_grads_(TorchGradScaler(device="cpu"), optimizer,
        ...                        torch.tensor(0.25), torch.zeros(()), False)
        >>> param.grad[0].item(), found
        (1.0, {device(type='cpu'): tensor(1.)})
    """
    float16 = torch.float16
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    founds: dict[torch.device, torch.Tensor] = {}
    grad_enabled = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not isinstance(param, torch.Tensor):
                    raise AssertionError(
                        f"expected param to be torch.Tensor, got {type(param).__name__}")
                grad = param.grad
                if grad is None:
                    continue
                if not allow_fp16 and grad.dtype == float16:
                    raise ValueError(
                        "Attempting to unscale FP16 gradients. Keep the parameters (and so "
                        "their gradients) in float32 and run the float16 compute under "
                        "torch.autocast: unscaled float16 gradients flush small values to "
                        "zero, which is what loss scaling exists to prevent. (Fused "
                        "optimizers take float16 gradients.)")
                if grad.is_sparse:
                    # Duplicate indices summed first, as torch does: their sum may overflow.
                    if grad.dtype is float16:
                        param.grad = grad = grad.coalesce()
                    grad = grad._values()
                key = (grad.device, grad.dtype)
                same = groups.get(key)
                if same is None:
                    groups[key] = [grad]
                else:
                    same.append(grad)
        for (device, _), grads in groups.items():
            found = founds.get(device)
            if found is None:
                found = founds[device] = (found_inf if found_inf.device == device else
                                          found_inf.to(device, non_blocking=True, copy=True))
            unscale_and_check_(grads, found, inv_scale.to(device, non_blocking=True))
    finally:
        torch._C._set_grad_enabled(grad_enabled)
    return founds


def inf_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The infinity norm of each tensor (one device), in one multi-tensor kernel on CUDA."""
    return list(torch._foreach_norm(tensors, math.inf))


#: step functions -> whether they take torch's deprecated ``grad_scaler`` keyword.
_TAKES_GRAD_SCALER: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def takes_grad_scaler(optimizer: torch.optim.Optimizer) -> bool:
    """``"grad_scaler" in inspect.signature(optimizer.step).parameters``, once per function:
    torch asks at every fused step, two signature walks of host time."""
    step = optimizer.step
    func = getattr(step, "__func__", step)
    try:
        return _TAKES_GRAD_SCALER[func]
    except (KeyError, TypeError):  # TypeError: not weakly referenceable; not cached
        takes = "grad_scaler" in inspect.signature(step).parameters
        try:
            _TAKES_GRAD_SCALER[func] = takes
        except TypeError:
            pass
        return takes


def fused_step(scaler: TorchGradScaler, optimizer: torch.optim.Optimizer, *args: Any,
               **kwargs: Any) -> Any:
    """torch's ``step()`` for an optimizer that skips on the device (``fused=True``), less
    two ops and its signature walks: the flag goes to the optimizer as it is where torch
    passes ``0 + flag`` (its ``sum`` of one device's flags), and the scale where torch
    passes ``scale * 1`` (no ``grad_scale`` of the optimizer's own). The same checks,
    errors and attributes as torch's branch; the caller has made the scale and asked
    :func:`takes_grad_scaler` (an optimizer that takes the keyword runs torch's own)."""
    if "closure" in kwargs:
        raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
    state = scaler._per_optimizer_states[id(optimizer)]
    if state["stage"] is OptState.STEPPED:
        raise RuntimeError("step() has already been called since the last update().")
    if state["stage"] is OptState.READY:
        scaler._check_inf_per_device(optimizer)
    scale = scaler._scale
    assert scale is not None  # made by step()
    founds = [t.to(scale.device, non_blocking=True)
              for t in state["found_inf_per_device"].values()]
    own = getattr(optimizer, "grad_scale", None)
    # Fused optimizers read these two attributes, which Optimizer does not declare.
    if state["stage"] == OptState.UNSCALED:
        optimizer.grad_scale = own  # type: ignore[attr-defined]
    else:
        optimizer.grad_scale = scale if own is None else scale * own  # type: ignore[attr-defined]
    optimizer.found_inf = founds[0] if len(founds) == 1 else sum(founds)  # type: ignore[attr-defined]
    retval = optimizer.step(*args, **kwargs)
    state["stage"] = OptState.STEPPED
    del optimizer.grad_scale  # type: ignore[attr-defined]
    del optimizer.found_inf  # type: ignore[attr-defined]
    return retval
