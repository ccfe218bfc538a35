"""Paddle's private API: the one module of the Paddle backend that names it.

Supported: ``paddlepaddle>=3.0`` (the ``paddle`` extra); tested on 3.3.1, CPU build
(``constraints.txt``). Every private name the backend relies on is listed
below: ``tests/paddle/test_paddle_private_api.py`` checks that each one still exists in the
installed Paddle, and that no other module of ``unifiedamp.backends.paddle`` names one. A Paddle
release that drops or changes one is outside the supported range until this module follows.

What the backend takes from Paddle's private API, and why:

- the unscale kernel ``_C_ops.check_finite_and_unscale_``: Paddle's own check-and-unscale,
  one call for every float32 gradient;
- ``paddle.amp.grad_scaler.OptimizerState`` and ``_refresh_optimizer_state``: the
  per-optimizer states ``paddle.amp.GradScaler`` keeps, kept in the same shape for code
  that reads them;
- ``paddle.device._convert_to_place``: a device string as a place;
- the dygraph tracer's ``_amp_level`` and ``_amp_dtype``: whether ``auto_cast`` computes in
  bfloat16 (the bfloat16 warning);
- ``Tensor._get_tensor_from_selected_rows``: the values of a sparse (SelectedRows) gradient;
- ``Optimizer._param_groups``: an optimizer's parameters, in its order;
- ``paddle.amp.GradScaler``'s private attributes, written so that code reading them
  (PaddleNLP's Trainer reads ``_cache_found_inf``) sees this scaler's config and state, and
  the private methods Paddle's own code calls (``_unscale``, ``_update``), overridden.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, TypeVar

import paddle
from paddle import _C_ops
from paddle.amp.grad_scaler import OptimizerState, _refresh_optimizer_state

from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["KERNEL_DTYPES", "OptimizerState", "autocast_dtype", "check_finite_and_unscale_",
           "convert_to_place", "dense", "gradients", "indexed_params", "new_optimizer_states",
           "overrides_private_methods", "write_native_config", "write_native_iteration",
           "write_native_scale", "write_native_trackers"]

#: Private members of Paddle's modules: (module, name).
PRIVATE_IMPORTS = (("paddle", "_C_ops"), ("paddle.amp.grad_scaler", "_refresh_optimizer_state"),
                   ("paddle.device", "_convert_to_place"),
                   ("paddle.base.framework", "_dygraph_tracer"))
#: Private attributes of Paddle objects read here: (the object's kind, name).
PRIVATE_ATTRIBUTES = (("tracer", "_amp_level"), ("tracer", "_amp_dtype"),
                      ("paddle.Tensor", "_get_tensor_from_selected_rows"),
                      ("paddle.optimizer.Optimizer", "_param_groups"))
#: ``paddle.amp.GradScaler``'s private attributes, written for code that reads them.
NATIVE_ATTRIBUTES = ("_enable", "_use_dynamic_loss_scaling", "_init_loss_scaling",
                     "_incr_ratio", "_decr_ratio", "_incr_every_n_steps",
                     "_decr_every_n_nan_or_inf", "_incr_count", "_decr_count", "_scale",
                     "_found_inf", "_cache_found_inf", "_optimizer_states")
#: ``paddle.amp.GradScaler``'s private methods that its own code calls, overridden.
OVERRIDDEN_METHODS = ("_unscale", "_update")

#: Every private name above: no other module of the backend names one.
PRIVATE_NAMES = frozenset({name for _, name in PRIVATE_IMPORTS}
                          | {name for _, name in PRIVATE_ATTRIBUTES}
                          | set(NATIVE_ATTRIBUTES) | set(OVERRIDDEN_METHODS))

# The CPU kernel takes float32 and float64 gradients only, and for float64 it divides by a
# float64 scale, not by the float32 reciprocal every other backend multiplies by: only
# float32 goes through it. bfloat16/float16 (GPU training, or multi_precision parameters)
# and float64 take the elementwise path, which does the same arithmetic.
KERNEL_DTYPES = (paddle.float32,)


def check_finite_and_unscale_(grads: list[Any], scale: Any) -> Any:
    """Multiplies ``grads`` (float32) by ``f32(1 / scale)`` in place; returns the
    found_inf flag (a shape-[1] bool tensor) of the gradients as given."""
    # It returns a new flag: the one passed in is not written in eager mode, so one
    # tensor serves every call (a new one is a dozen Python calls). Paddle's stub leaves
    # out the found_inf argument the kernel takes.
    _, flag = _C_ops.check_finite_and_unscale_(  # type: ignore[call-arg]
        grads, scale, _unwritten_flag(scale.place))  # pyright: ignore[reportCallIssue]
    return flag


_UNWRITTEN_FLAGS: dict[str, Any] = {}


def _unwritten_flag(place: Any) -> Any:
    flag = _UNWRITTEN_FLAGS.get(str(place))
    if flag is None:
        flag = _UNWRITTEN_FLAGS[str(place)] = paddle.zeros([1], dtype=paddle.bool).to(place)
    return flag


def new_optimizer_states() -> defaultdict[int, dict[str, Any]]:
    """An empty ``optimizer id -> {"state": OptimizerState, "found_inf": flag}``, as
    ``paddle.amp.GradScaler`` keeps it."""
    return defaultdict(_refresh_optimizer_state)


def convert_to_place(device: str) -> Any:
    """The place of a device string (``"cpu"``, ``"gpu:0"``); Paddle's ValueError or
    RuntimeError for one its build lacks."""
    return paddle.device._convert_to_place(device)


def autocast_dtype() -> str | None:
    """The dtype ``auto_cast`` computes in (``"float16"``, ``"bfloat16"``); None outside
    it."""
    tracer = paddle.base.framework._dygraph_tracer()
    if tracer is None or str(tracer._amp_level) == "AmpLevel.O0":
        return None
    return str(tracer._amp_dtype)


def dense(grad: Any) -> Any:
    """A gradient as a dense tensor: the values of a sparse one (``Embedding(sparse=True)``
    gives SelectedRows, which the dense kernels misread), sharing its storage."""
    return grad._get_tensor_from_selected_rows() if grad.is_selected_rows() else grad


def _param_groups(optimizer: Any) -> list[Any]:
    groups = getattr(optimizer, "_param_groups", None)
    if groups is None:
        raise TypeError(f"optimizer must be a paddle.optimizer.Optimizer, got "
                        f"{type(optimizer).__name__}")
    return groups


def gradients(optimizer: Any) -> list[Any]:
    """The optimizer's gradients as dense tensors (:func:`dense`), in its order, skipping
    parameters without one: :func:`indexed_params`' gradients in one call (what every
    ``unscale_`` pays: no call per parameter)."""
    groups = _param_groups(optimizer)
    grads = []
    for group in groups:
        for p in group["params"] if isinstance(group, dict) else (group,):
            grad = p.grad
            if grad is not None:
                grads.append(grad._get_tensor_from_selected_rows() if grad.is_selected_rows()
                             else grad)
    return grads


def indexed_params(optimizer: Any) -> list[tuple[str, Any]]:
    """``(param_groups[g][i], parameter)`` for every parameter, in the optimizer's order
    (an optimizer built from a plain list of parameters has one group)."""
    groups = _param_groups(optimizer)
    params: list[tuple[str, Any]] = []
    for g, group in enumerate(groups):
        if isinstance(group, dict):
            params.extend((f"param_groups[{g}][{i}]", p) for i, p in enumerate(group["params"]))
        else:  # built from a list of parameters: one group
            params.append((f"param_groups[0][{len(params)}]", group))
    return params


# ---------------------------------------------------------------- paddle.amp.GradScaler's own


def write_native_config(scaler: paddle.amp.GradScaler, config: ScalerConfig) -> None:
    """Paddle's attributes for the config, for code and tools that read them."""
    scaler._enable = config.enabled
    scaler._use_dynamic_loss_scaling = config.dynamic
    scaler._init_loss_scaling = config.init_scale
    scaler._incr_ratio = config.growth_factor
    scaler._decr_ratio = config.backoff_factor
    scaler._incr_every_n_steps = config.growth_interval
    scaler._decr_every_n_nan_or_inf = config.hysteresis


def write_native_trackers(scaler: paddle.amp.GradScaler, state: ScalerState) -> None:
    """Paddle's attributes for the trackers."""
    scaler._incr_count = state.growth_tracker
    scaler._decr_count = state.hysteresis_tracker


def write_native_scale(scaler: paddle.amp.GradScaler, scale: Any) -> None:
    """Paddle's attribute for the scale tensor: ``scale`` itself, written in place."""
    scaler._scale = scale


def write_native_iteration(scaler: paddle.amp.GradScaler,
                           optimizer_states: defaultdict[int, dict[str, Any]],
                           found_inf: bool | None) -> None:
    """Paddle's attributes for an iteration: the per-optimizer states (the same dict) and
    the last update's found_inf (None before any update). Its ``_found_inf`` stays False:
    Paddle's kernels write it, and none runs on this scaler."""
    scaler._optimizer_states = optimizer_states
    # Paddle's stubs type these from its __init__ (tensor, None); bools here.
    scaler._found_inf = False  # type: ignore[assignment]
    scaler._cache_found_inf = found_inf  # type: ignore[assignment]


_Scaler = TypeVar("_Scaler", bound=type)


def overrides_private_methods(cls: _Scaler) -> _Scaler:
    """Class decorator: the private methods ``paddle.amp.GradScaler``'s own code calls
    after a step (``_unscale``, ``_update``), as the class's public verbs."""

    def unscale(self: Any, optimizer: Any) -> None:
        self.unscale_(optimizer)

    def update(self: Any) -> None:
        self.update()

    for name, method in (("_unscale", unscale), ("_update", update)):
        method.__name__, method.__qualname__ = name, f"{cls.__qualname__}.{name}"
        setattr(cls, name, method)
    return cls
