"""The Paddle backend's scaler: :class:`PaddleGradScaler`, a real ``paddle.amp.GradScaler``.

Length: one class, because it is one ``paddle.amp.GradScaler``: each of Paddle's public
members must be the class's own (none may run Paddle's behaviour on this scaler's state),
and with torch's verbs, the interface's and Paddle's getters and setters they make most of
this module. Its diagnostics (``_diagnostics``) and Paddle's private API (``_compat``) are
modules of their own.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle
import paddle.distributed as dist

from unifiedamp import spec
from unifiedamp._monitor import CollapseMonitor
from unifiedamp._scaler import GradScaler, new_scale_value
from unifiedamp._tree import leaves, refuse_foreign, tree_map
from unifiedamp.backends._imperative import (
    Flags,
    HostState,
    LastUpdate,
    diagnostics_options,
    mid_iteration_load_error,
    update_arguments,
)
from unifiedamp.backends.paddle import _compat
from unifiedamp.backends.paddle._compat import KERNEL_DTYPES, OptimizerState
from unifiedamp.backends.paddle._diagnostics import PaddleDiagnostics
from unifiedamp.errors import NoInfChecksError, ScaleNotCalledError
from unifiedamp.spec import FLOAT32_MIN_NORMAL, ScalerConfig, ScalerState

__all__ = ["PaddleGradScaler", "paddle_expressible"]

#: The floating-point dtypes scale() takes.
_FLOATING = frozenset((paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64))
#: The key of the float32 scale in ``_factor_tensors``.
_FLOAT32_SCALE = (False, False)

_EXTRA_NAMES = ("device", "process_group", "distributed", "max_consecutive_skips",
                "on_collapse", "backend", "diagnose", "history")


def paddle_expressible(config: ScalerConfig) -> bool:
    """Whether ``paddle.amp.GradScaler`` can hold this config (its state dict can carry it).

    Example:
        >>> from unifiedamp.spec import ScalerConfig
        >>> paddle_expressible(ScalerConfig()), paddle_expressible(ScalerConfig(min_scale=1.0))
        (True, False)
    """
    return not spec.cannot_carry(config, "paddle.amp.GradScaler")


def _factor_value(scale: float, key: tuple[bool, bool]) -> np.ndarray:
    """The value of the factor tensor ``key`` (float64?, reciprocal?) for ``scale``."""
    value = np.float32(scale)
    if key[1]:
        with np.errstate(divide="ignore", over="ignore"):
            value = np.float32(np.float64(1.0) / np.float64(value))
    return np.asarray(value, np.float64 if key[0] else np.float32)


def _is_set(flag: Any) -> bool:
    """A found_inf flag read on the host: a bool, or a shape-[1] tensor read with
    ``numpy()`` (a Paddle tensor's ``bool()`` is seven Python calls)."""
    return flag if flag.__class__ is bool else bool(flag.numpy()[0])


def _place(device: Any) -> Any:
    """The Paddle place for ``device`` (a string such as ``"cpu"`` or ``"gpu:0"``, or a
    place); ``None`` is Paddle's current device (``paddle.get_device()``)."""
    if device is None:
        device = paddle.get_device()
    if not isinstance(device, str):
        if type(device).__name__.endswith("Place"):  # paddle.CPUPlace(), CUDAPlace(0)...
            return device
        raise TypeError(f"device={device!r} ({type(device).__name__}): pass a string, 'cpu', "
                        f"'gpu' or 'gpu:N' (device=3 is 'gpu:3'), or a Paddle place such as "
                        "paddle.CUDAPlace(3)")
    kind = device.split(":")[0].lower()
    if kind in ("gpu", "cuda") and not paddle.is_compiled_with_cuda():
        # Paddle's own message ("The device should not be <re.Match object...>")
        # says neither what was asked nor what to do.
        raise RuntimeError(
            f"device={device!r} but this paddle is built without CUDA "
            "(paddle.is_compiled_with_cuda() is False): pass device='cpu' or enabled=False, or "
            "install paddlepaddle-gpu")
    try:
        return _compat.convert_to_place(device.lower().replace("cuda", "gpu"))
    except (ValueError, RuntimeError):
        # Paddle's message for a device its build lacks shows a regex match object.
        raise ValueError(f"device={device!r} is not a device this paddle can use: pass 'cpu', "
                         "'gpu' or 'gpu:N' (with a CUDA build), or leave device out "
                         "(paddle.get_device())") from None


def _method(optimizer: Any, verb: str) -> Any:
    """``optimizer.<verb>``, or an error naming what was passed instead of an optimizer
    (``unscale_`` is refused by ``_compat``'s reading of the parameter groups)."""
    method = getattr(optimizer, verb, None)
    if not callable(method):
        raise TypeError(f"{verb}() takes the paddle optimizer whose gradients were scaled "
                        f"(a paddle.optimizer.Optimizer), got {type(optimizer).__name__} "
                        f"{optimizer!r:.60}: pass the optimizer itself, e.g. "
                        f"scaler.{verb}(opt)")
    return method


#: The flags update() takes: the bool tensor unscale() returns, a bool, a NumPy bool.
_FLAGS = Flags((paddle.Tensor, bool, np.bool_, np.ndarray), "paddle",
               "(a 0-d bool tensor) or a bool", "paddle.to_tensor")
#: The error for another framework's arrays, in the words every backend uses.
_refuse_foreign = functools.partial(
    refuse_foreign, own=("paddle",), expected="paddle tensors",
    convert="paddle.to_tensor")


@_compat.overrides_private_methods
class PaddleGradScaler(PaddleDiagnostics, HostState, paddle.amp.GradScaler, GradScaler):
    """``paddle.amp.GradScaler`` with the unifiedamp spec, config, state and reporting.

    It is a real ``paddle.amp.GradScaler`` (``isinstance`` holds, Paddle's verbs
    and getters/setters work: ``minimize``, ``is_enable``,
    ``get_incr_ratio``...), and it has torch's verbs too. Unlike Paddle's own,
    it scales on every place, CPU included, whatever ``auto_cast`` is set to.

    Args:
        *args: ``init_scale, growth_factor, backoff_factor, growth_interval, enabled``
            (the spec's order; Paddle's constructor starts with ``enable``: pass
            Paddle's names as keywords, e.g. ``init_loss_scaling=1024``).
        device: Where the scale lives: ``"cpu"``, ``"gpu"``, ``"gpu:N"`` or a Paddle
            place (default: ``paddle.get_device()`` when the scaler is built).
        process_group: With ``paddle.distributed`` initialised, the group whose
            ranks must agree on found_inf (default: every rank).
        distributed: ``None`` (default) all-reduces found_inf whenever
            ``paddle.distributed`` is initialised with more than one rank; ``False`` never.
        max_consecutive_skips: Warn once after this many skipped iterations in a
            row (``None``: only when the scale drops below float32's smallest normal).
        on_collapse: ``"warn"`` or ``"raise"``.
        diagnose: Compute the :meth:`overflow_report` of every skipped update when it
            happens, so that it survives ``clear_grad()``. Free on GPU. On a CPU place it
            adds one finite check of the float32 gradients per ``unscale_``: Paddle's
            CPU kernel multiplies the gradients by 0 when it finds inf/NaN (an inf
            becomes NaN), so their counts are taken before it runs.
        history: Keep the last ``history`` updates' ``(iteration, scale, skipped)`` in a
            ring of tensors on the scaler's place, read by :meth:`history` (0: none).
        **kwargs: The other config parameters, by canonical name or alias (Paddle's
            ``init_loss_scaling``, ``incr_ratio``, ``decr_ratio``, ``incr_every_n_steps``,
            ``decr_every_n_nan_or_inf``, ``enable``, ``use_dynamic_loss_scaling``).

    After a skipped step, :meth:`overflow_report` names the gradients that held inf/NaN
    (``param_groups[g][i]`` unless :meth:`watch` named them). On a CPU place, Paddle's
    kernel has multiplied a checked float32 gradient by 0 by the time the report is asked
    for (an inf reads as NaN, the largest finite value as 0): the names are right, and the
    note says so; ``diagnose=True`` keeps the counts.

    Example:
        >>> import paddle
        >>> import unifiedamp as ua
        >>> model = paddle.nn.Linear(3, 1)
        >>> opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        >>> scaler = ua.GradScaler(init_loss_scaling=1024.0, incr_every_n_steps=2,
        ...                        backend="paddle")
        >>> isinstance(scaler, paddle.amp.GradScaler)
        True
        >>> scaler.scale(model(paddle.ones([2, 3])).sum()).backward()
        >>> scaler.step(opt); _ = scaler.update()
        >>> scaler.get_scale(), scaler.last_step_skipped
        (1024.0, False)
    """

    backend = "paddle"
    capabilities = frozenset({"unscale_", "step", "minimize", "watch", "overflow_report",
                              "history", "native_state_dict"})

    def __init__(
        self,
        *args: Any,
        device: Any = None,
        process_group: Any = None,
        distributed: bool | None = None,
        max_consecutive_skips: int | None = 100,
        on_collapse: str = "warn",
        diagnose: bool = False,
        history: int = 0,
        **kwargs: Any,
    ):
        history_size = diagnostics_options(diagnose, history)
        if args and isinstance(args[0], bool):
            raise TypeError(
                f"the first positional argument is init_scale (the spec's order), got "
                f"{args[0]!r}: paddle.amp.GradScaler starts with enable, so pass Paddle's "
                f"parameters by name, e.g. GradScaler(enable={args[0]!r}, "
                "init_loss_scaling=65536.0, backend='paddle')")
        config = spec.config_from_args(args, kwargs, extra_names=_EXTRA_NAMES)
        monitor = CollapseMonitor(max_consecutive_skips, on_collapse)
        if process_group is not None and not isinstance(process_group, dist.collective.Group):
            raise TypeError(f"process_group must be a paddle.distributed group "
                            f"(paddle.distributed.new_group(ranks)) or None, got "
                            f"{process_group!r}")
        place = _place(device)
        # Paddle's own constructor disables an enabled scaler on a CPU place (with a
        # warning) and asserts factors != 1: built disabled, it sets nothing this scaler
        # needs, and Paddle's attributes are written from the config below.
        super().__init__(enable=False)
        self._config = config
        self._monitor = monitor
        self._place = place
        self._process_group = process_group
        self._distributed = distributed
        self._state = ScalerState.initial(config)
        self._unscale_overflows = spec.unscale_overflows(self._state.scale)
        # The scale as a shape-[1] float32 tensor on the place: what the kernel takes.
        self._scale_tensor: paddle.Tensor = paddle.to_tensor(
            np.array([self._state.scale], np.float32), place=place)
        # (float64?, reciprocal?) -> the 0-d scale or f32(1/scale) to multiply by.
        self._factor_tensors: dict[tuple[bool, bool], paddle.Tensor] = {}
        # optimizer id -> {"state": its OptimizerState, "found_inf": its check, once made},
        # as paddle.amp.GradScaler keeps it.
        self._optimizer_checks = _compat.new_optimizer_states()
        # The checks of the functional unscale() since the last update.
        self._functional_found_inf: list[Any] = []
        self._scale_called = False
        self._bf16_warned = False
        self._updates = 0
        # The thread that began this iteration (its first verb since the last update).
        self._iteration_thread: int | None = None
        self._prechecked = {}
        self._init_diagnostics(diagnose, history_size)
        self._write_native_attributes()

    def __getstate__(self) -> dict[str, Any]:
        # Paddle places, tensors and process groups do not pickle: a copy carries the
        # place's name and the host state, and rebuilds the tensors. Like torch's, a copy
        # starts a new iteration (no inf checks carried over) and has no process group.
        return {"_config": self._config, "_monitor": self._monitor,
                "_place": str(self._place),  # "Place(cpu)", "Place(gpu:0)"
                "_distributed": self._distributed, "_state": self._state,
                "_scale_called": self._scale_called, "_bf16_warned": self._bf16_warned,
                **self._counters(), **self._diagnostics_state()}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        place = saved["_place"]
        self._config = saved["_config"]
        self._monitor = saved["_monitor"]
        self._place = _place(place[len("Place("):-1] if place.startswith("Place(") else place)
        self._process_group = None
        self._distributed = saved["_distributed"]
        self._state = saved["_state"]
        self._unscale_overflows = spec.unscale_overflows(self._state.scale)
        self._scale_tensor = paddle.to_tensor(np.array([self._state.scale], np.float32),
                                              place=self._place)
        self._factor_tensors = {}
        self._optimizer_checks = _compat.new_optimizer_states()
        self._functional_found_inf = []
        self._scale_called = saved["_scale_called"]
        self._bf16_warned = saved["_bf16_warned"]
        self._iteration_thread = None
        self._prechecked = {}
        self._restore_counters(saved)
        self._restore_diagnostics(saved)
        self._write_native_attributes()

    def _write_native_attributes(self) -> None:
        # Paddle's own attributes, for code and tools that read them.
        _compat.write_native_config(self, self._config)
        _compat.write_native_trackers(self, self._state)
        _compat.write_native_scale(self, self._scale_tensor)
        _compat.write_native_iteration(self, self._optimizer_checks,
                                       self._last_skipped if self._updates else None)

    def _set_state(self, state: ScalerState) -> None:
        if state.scale != self._state.scale:
            self._scale_tensor.fill_(state.scale)  # a float32 value: fill_ stores it exactly
            # In place, not rebuilt: a new tensor is dozens of calls at each skip.
            for key, factor in self._factor_tensors.items():
                factor.fill_(float(_factor_value(state.scale, key)))
            self._unscale_overflows = spec.unscale_overflows(state.scale)
        self._state = state
        _compat.write_native_trackers(self, state)

    # ------------------------------------------------------------ config and state

    @property
    def native(self) -> PaddleGradScaler:
        """The ``paddle.amp.GradScaler`` to hand to Paddle code: this scaler itself."""
        return self

    def is_enable(self) -> bool:
        """Paddle's name for :meth:`is_enabled`."""
        return self._config.enabled

    def is_use_dynamic_loss_scaling(self) -> bool:
        """Whether the scale adapts (Paddle's name for the config's ``dynamic``)."""
        return self._config.dynamic

    def get_init_loss_scaling(self) -> float:
        """The scale the scaler started from (Paddle's name for ``init_scale``)."""
        return self._config.init_scale

    def set_init_loss_scaling(  # type: ignore[override]
            self, new_init_loss_scaling: float) -> PaddleGradScaler:
        """Sets ``init_scale`` and, as Paddle does, the current scale (trackers kept);
        returns the scaler."""
        self._reconfigure(self._config.replace(init_scale=new_init_loss_scaling))
        self._set_state(self._state._replace(scale=spec.f32(self._config.init_scale)))
        return self

    def _reconfigure(self, config: ScalerConfig) -> PaddleGradScaler:
        self._config = config
        _compat.write_native_config(self, config)
        return self

    # paddle.amp.GradScaler's names for the interface's accessors, with its keywords.
    # Paddle's setters return None, the interface's the scaler: hence the [override]s.
    def get_incr_ratio(self) -> float:
        """Paddle's name for :meth:`get_growth_factor`.

        Example:
            >>> PaddleGradScaler(growth_factor=4.0).get_incr_ratio()
            4.0
        """
        return self.get_growth_factor()

    def get_decr_ratio(self) -> float:
        """Paddle's name for :meth:`get_backoff_factor`."""
        return self.get_backoff_factor()

    def get_incr_every_n_steps(self) -> int:
        """Paddle's name for :meth:`get_growth_interval`."""
        return self.get_growth_interval()

    def get_decr_every_n_nan_or_inf(self) -> int:
        """Paddle's name for :meth:`get_hysteresis`."""
        return self.get_hysteresis()

    def set_incr_ratio(self, new_incr_ratio: float) -> PaddleGradScaler:  # type: ignore[override]
        """Paddle's name and keyword for :meth:`set_growth_factor`."""
        return self.set_growth_factor(new_incr_ratio)

    def set_decr_ratio(self, new_decr_ratio: float) -> PaddleGradScaler:  # type: ignore[override]
        """Paddle's name and keyword for :meth:`set_backoff_factor`."""
        return self.set_backoff_factor(new_decr_ratio)

    def set_incr_every_n_steps(  # type: ignore[override]
            self, new_incr_every_n_steps: int) -> PaddleGradScaler:
        """Paddle's name and keyword for :meth:`set_growth_interval`."""
        return self.set_growth_interval(new_incr_every_n_steps)

    def set_decr_every_n_nan_or_inf(  # type: ignore[override]
            self, new_decr_every_n_nan_or_inf: int) -> PaddleGradScaler:
        """Paddle's name and keyword for :meth:`set_hysteresis`."""
        return self.set_hysteresis(new_decr_every_n_nan_or_inf)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]  # not Paddle's dict
        """The canonical dict (every unifiedamp backend loads it); a disabled scaler
        returns it too, with ``enabled`` False. ``native_state_dict()`` gives Paddle's.

        Example:
            >>> d = PaddleGradScaler(1024.0).state_dict()
            >>> d["format"], d["scale"], d["growth_tracker"]
            ('unifiedamp.GradScaler', 1024.0, 0)
        """
        return spec.to_state_dict(self._config, self._state, self.backend)

    def native_state_dict(self) -> dict[str, Any]:
        """``paddle.amp.GradScaler``'s own state dict (``{}`` when disabled, as Paddle's).

        Raises:
            ValueError: The config uses options Paddle's format cannot carry.

        Example:
            >>> import paddle
            >>> d = PaddleGradScaler(1024.0).native_state_dict()
            >>> d["scale"], d["incr_count"]
            (array([1024.], dtype=float32), 0)
        """
        if not paddle_expressible(self._config):
            raise ValueError(
                f"paddle.amp.GradScaler's state dict cannot carry this config ({self._config}: "
                "Paddle has no min/max scale and refuses factors of 1); use state_dict(), "
                "which every unifiedamp backend loads")
        if not self._config.enabled:
            return {}
        return spec.native_dict(self._config, self._state, "paddle")

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads a canonical dict of any backend, or a native Paddle or torch dict.

        ``enabled`` stays as this scaler was built. A dict that fails validation
        raises ``ValueError`` and changes nothing.
        """
        if self._functional_found_inf or any("found_inf" in s
                                             for s in self._optimizer_checks.values()):
            raise mid_iteration_load_error()
        config, state = spec.parse_state_dict(state_dict, base=self._config)
        self._config = config.replace(enabled=self._config.enabled)
        _compat.write_native_config(self, self._config)
        self._set_state(state)

    # ------------------------------------------------------------ the verbs

    def _factor(self, dtype: Any, reciprocal: bool = False) -> Any:
        """The 0-d scale (or ``f32(1 / scale)``, the float64 reciprocal rounded once) as a
        tensor to multiply a ``dtype`` tensor by: float64 for float64, else float32
        (16-bit values are multiplied in float32 and rounded back, as NumPy does)."""
        key = (dtype == paddle.float64, reciprocal)  # _FLOAT32_SCALE for float32
        factor = self._factor_tensors.get(key)
        if factor is None:
            factor = paddle.to_tensor(_factor_value(self._state.scale, key), place=self._place)
            self._factor_tensors[key] = factor
        return factor

    def _multiply(self, tensor: Any, reciprocal: bool = False) -> Any:
        if tensor.dtype in (paddle.float32, paddle.float64):
            return tensor * self._factor(tensor.dtype, reciprocal)
        return (tensor.astype(paddle.float32) * self._factor(tensor.dtype, reciprocal)
                ).astype(tensor.dtype)

    # torch's parameter name (the interface's), where Paddle's is ``var``.
    def scale(self, outputs: Any) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Multiplies a tensor, or a list/tuple/dict of them, by the scale (shape and dtype
        kept), on every place and whatever ``auto_cast`` is set to."""
        if not self._config.enabled:
            return outputs
        if self._iteration_thread != threading.get_ident():
            self._claim()
        self._scale_called = True
        if outputs.__class__ is paddle.Tensor:
            # One loss, the usual case, in line: every call here is host time a
            # launch-bound step waits for (tests/paddle/test_call_counts.py).
            dtype = outputs.dtype
            if not self._bf16_warned and (dtype == paddle.bfloat16
                                          or _compat.autocast_dtype() == "bfloat16"):
                self._warn_bf16()
            if dtype == paddle.float32:
                factor = self._factor_tensors.get(_FLOAT32_SCALE)
                scaled = outputs * (factor if factor is not None
                                    else self._factor(paddle.float32))
            else:
                scaled = self._scale_one(outputs)
            self._scale_input = outputs  # for overflow_report().loss_finite
            return scaled
        if not self._bf16_warned:
            self._warn_if_bf16(outputs)
        scaled = tree_map(self._scale_one, outputs)
        # For overflow_report().loss_finite, read only after a skipped update.
        self._scale_input = outputs if isinstance(outputs, paddle.Tensor) else None
        return scaled

    def _scale_one(self, tensor: Any) -> Any:
        if not isinstance(tensor, paddle.Tensor):
            _refuse_foreign(tensor, what="scale()")
            raise TypeError(f"scale() takes a paddle.Tensor or a list/tuple/dict of them, got "
                            f"{type(tensor).__name__}")
        if tensor.dtype not in _FLOATING:
            raise TypeError(f"scale() takes floating-point tensors, got {tensor.dtype}")
        return self._multiply(tensor)

    def _warn_if_bf16(self, outputs: Any) -> None:
        first = next(iter(leaves(outputs)), None)
        if not isinstance(first, paddle.Tensor):
            return
        if first.dtype == paddle.bfloat16 or _compat.autocast_dtype() == "bfloat16":
            self._warn_bf16()

    def _warn_bf16(self) -> None:
        self._bf16_warned = True
        # paddle.amp.GradScaler disables itself here; this one keeps scaling, which is
        # harmless, and says once that it is unnecessary.
        warnings.warn(
            "Loss scaling is unnecessary with bfloat16: it has float32's exponent range, "
            "so gradients do not underflow. Build the scaler with enabled=False (every verb "
            "becomes a pass-through) or drop it.", UserWarning, stacklevel=4)

    def _require_scale_called(self, verb: str) -> None:
        # torch raises here; without it the gradients of an unscaled loss would be
        # divided by the scale and the step taken. Only before the first scale().
        if not self._scale_called:
            raise ScaleNotCalledError(
                f"Attempted {verb} before any scale(): the gradients were not computed from "
                f"a scaled loss. Fix: call scaler.scale(loss).backward() before "
                f"scaler.{verb}(optimizer); without it the unscaled gradients would be "
                "divided by the scale.")

    def _check_and_unscale(self, grads: list[Any]) -> Any:
        """Unscales ``grads`` in place; returns found_inf (a bool, or a bool tensor on
        the scale's place) for the gradients as given, before unscaling."""
        flags = []
        kernel: list[Any] = []
        others: list[Any] = []
        for g in grads:  # a loop, not comprehensions: each of those is a call
            (kernel if g.dtype in KERNEL_DTYPES else others).append(g)
        if kernel:
            flags.append(_compat.check_finite_and_unscale_(kernel, self._scale_tensor))
        for g in others:
            wide = g if g.dtype == paddle.float64 else g.astype(paddle.float32)
            flags.append(paddle.logical_not(paddle.isfinite(wide).all()).reshape([1]))
            paddle.assign(self._multiply(g, reciprocal=True), g)
        if self._unscale_overflows:
            # 1/scale is inf in float32: every unscaled gradient is inf or NaN.
            return True
        if len(flags) == 1:
            return flags[0]
        return functools.reduce(paddle.logical_or, flags) if flags else False

    def unscale_(self, optimizer: Any) -> None:
        """Divides the optimizer's gradients by the scale in place and records inf/NaN,
        agreed across ranks when ``paddle.distributed`` is initialised."""
        if not self._config.enabled:
            return
        if self._iteration_thread != threading.get_ident():
            self._claim()
        if not self._scale_called:
            self._require_scale_called("unscale_")
        state = self._optimizer_checks[id(optimizer)]
        if state["state"] is OptimizerState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        if state["state"] is OptimizerState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        if self._diagnose:
            # A sparse gradient's values tensor shares its storage (_compat.dense), so
            # unscaling it in place unscales the gradient.
            indexed = [(k, _compat.dense(p.grad))
                       for k, (_, p) in enumerate(_compat.indexed_params(optimizer))
                       if p.grad is not None]
            grads = [g for _, g in indexed]
            self._prechecked[id(optimizer)] = self._precheck(indexed)
        else:
            grads = _compat.gradients(optimizer)
        self._checked[id(optimizer)] = optimizer
        found = self._check_and_unscale(grads) if grads else None
        if self._distributed is not False and dist.is_initialized() and \
                dist.get_world_size(self._process_group) > 1:  # _across_ranks(), in line
            found = self._agree_across_ranks(found)
        if found is not None:
            state["found_inf"] = found
        state["state"] = OptimizerState.UNSCALED

    def _across_ranks(self) -> bool:
        return (self._distributed is not False and dist.is_initialized()
                and dist.get_world_size(self._process_group) > 1)

    def _agree_across_ranks(self, found: Any) -> Any:
        # Every rank joins the collective, also one whose shard has no gradient.
        flag = paddle.to_tensor([1 if found is True else 0], dtype=paddle.int32,
                                place=self._place)
        if isinstance(found, paddle.Tensor):
            flag = paddle.maximum(flag, found.astype(paddle.int32))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._process_group)
        return flag > 0

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscales (unless ``unscale_`` was called) and calls ``optimizer.step()`` unless a
        gradient was inf/NaN; returns what it returned, or ``None`` when skipped."""
        return self._step(optimizer, _method(optimizer, "step"), *args, **kwargs)

    def _step(self, optimizer: Any, call: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._config.enabled:
            return call(*args, **kwargs)
        if self._iteration_thread != threading.get_ident():
            self._claim()
        if not self._scale_called:
            self._require_scale_called("step")
        state = self._optimizer_checks[id(optimizer)]
        if state["state"] is OptimizerState.STEPPED:
            raise RuntimeError("step() has already been called since the last update(). Call "
                               "scaler.update() once per iteration, after the last step().")
        if state["state"] is OptimizerState.INIT:
            self.unscale_(optimizer)
        if "found_inf" not in state:
            raise NoInfChecksError.for_optimizer()
        # The one host read: Python must decide whether to step (Paddle's optimizers
        # read their found_inf the same way).
        skipped = _is_set(state["found_inf"])
        state["found_inf"] = skipped
        state["state"] = OptimizerState.STEPPED
        return None if skipped else call(*args, **kwargs)

    def minimize(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Paddle's one-call step: ``step`` through ``optimizer.minimize(*args, **kwargs)``,
        then ``update()``. Returns ``optimizer.minimize``'s result, ``(None, None)`` when
        skipped (as Paddle's).

        Example:
            >>> import paddle
            >>> model = paddle.nn.Linear(3, 1)
            >>> opt = paddle.optimizer.Adam(parameters=model.parameters())
            >>> scaler = PaddleGradScaler(1024.0)
            >>> scaled = scaler.scale(model(paddle.ones([2, 3])).mean())
            >>> scaled.backward()
            >>> _ = scaler.minimize(opt, scaled)
            >>> scaler.last_step_skipped, scaler.state.growth_tracker
            (False, 1)
        """
        retval = self._step(optimizer, _method(optimizer, "minimize"), *args, **kwargs)
        if self._config.enabled:
            self.update()
        return (None, None) if retval is None else retval

    def unscale(self, grads: Any) -> tuple[Any, Any]:
        """Functional unscale: ``(unscaled copies of grads, all finite)``.

        ``grads`` is a tensor or a list/tuple/dict of them; ``all finite`` is a bool
        tensor (or a Python bool when the scale's reciprocal overflows). The check
        counts towards the next ``update()``. A gradient that carries an autograd graph
        (``paddle.grad(..., create_graph=True)``, as for a gradient penalty) comes back as
        a differentiable product with the same values, as on the functional backends.
        """
        for leaf in leaves(grads):
            if not isinstance(leaf, paddle.Tensor):
                _refuse_foreign(leaf, what="unscale()")
                raise TypeError(
                    f"grads must be a paddle.Tensor or a list/tuple/dict of them, got a "
                    f"{type(leaf).__name__} leaf ({leaf!r}); convert it with paddle.to_tensor")
        out = tree_map(lambda g: g.detach().clone(), grads)
        if not self._config.enabled:
            return self._with_graph(grads, out), True
        self._claim()
        found = self._check_and_unscale(leaves(out))
        self._functional_found_inf.append(found)
        out = self._with_graph(grads, out)
        if isinstance(found, bool):
            return out, paddle.to_tensor(not found)
        return out, paddle.logical_not(found.reshape([]))

    def _with_graph(self, grads: Any, out: Any) -> Any:
        """``out`` (the kernel's detached, unscaled copies), with each gradient that carries
        an autograd graph replaced by the same product in differentiable ops: without it, a
        penalty computed on ``unscale()``'s result would drop out of the parameters'
        gradients without an error."""
        if all(g.stop_gradient for g in leaves(grads)):
            return out

        def one(grad: Any, copy: Any) -> Any:
            if grad.stop_gradient:
                return copy
            if not self._config.enabled:                  # the gradient as it is
                return grad.clone()
            return self._multiply(grad, reciprocal=True)

        return tree_map(one, grads, out)

    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` where ``finite`` (the bool tensor :meth:`unscale` returns, or a bool),
        else ``old``: trees of tensors, selected by ``paddle.where``.

        Example:
            >>> import paddle
            >>> s = PaddleGradScaler()
            >>> s.where_finite(paddle.to_tensor(False), [paddle.ones([2])],
            ...                [paddle.zeros([2])])[0].tolist()
            [0.0, 0.0]
        """
        _refuse_foreign((new, old), what="where_finite()")
        if isinstance(finite, paddle.Tensor):
            return tree_map(lambda n, o: paddle.where(finite, n, o), new, old)
        keep = bool(finite)
        return tree_map(lambda n, o: n if keep else o, new, old)

    # Paddle's update() takes nothing and returns None; the interface's takes the flag
    # (or torch's new_scale) and returns the scaler.
    def update(  # type: ignore[override]
            self, finite: Any = None, *, new_scale: Any = None) -> PaddleGradScaler:
        """Adapts the scale from every check since the last update, per the spec; returns
        the scaler itself.

        ``finite`` (the flag :meth:`unscale` returned, or a bool) counts as one more
        check; ``update()`` uses the checks alone; any other tensor or array first is
        refused (TypeError), as ``update(finite.astype("float32"))`` would otherwise set
        the scale to 1.0. ``new_scale`` (a float, a 1-element array or tensor; finite and
        > 0; a plain number may come first, as in torch, an array or a tensor goes by
        keyword) sets the scale instead, leaving the trackers, as torch does; such a
        manual set is not counted as an update: it is not recorded in :meth:`history`, and
        :meth:`overflow_report` is None after it (as on torch).
        """
        if finite is not None or new_scale is not None:
            finite, new_scale = update_arguments(finite, new_scale, _FLAGS)
        if not self._config.enabled:
            return self
        if self._iteration_thread != threading.get_ident():
            self._claim()
        if new_scale is not None:
            self._set_scale(new_scale)
            self._forget_iteration()
            return self
        found_inf, optimizer_found = self._iteration_found_inf(finite)
        scale = self._state.scale
        self._set_state(spec.update(self._config, self._state, found_inf))
        self._count(found_inf)
        if len(self._ring_iterations):  # history=N
            self._record(self._state.scale, found_inf)  # the scale the update left
        # A skip is kept for overflow_report(), with what the iteration checked.
        skip = (LastUpdate(self._updates, scale, list(self._checked.values()), self._scale_input,
                           functional_only=not optimizer_found,
                           distributed=self._across_ranks(), prechecked=self._prechecked)
                if found_inf else None)
        self._remember_update(skip)
        self._forget_iteration()
        # A good update at a normal scale, with no run of skips before it, has nothing to
        # tell the monitor. Observed after the iteration is over: on_collapse="raise"
        # leaves a consistent scaler.
        if found_inf or not self._monitor.settled or self._state.scale < FLOAT32_MIN_NORMAL:
            self._monitor.observe(self._updates, self._state.scale, found_inf,
                                  detail=self._collapse_detail if found_inf else None)
        return self

    def _iteration_found_inf(self, finite: Any) -> tuple[bool, bool]:
        """The spec's found_inf: the OR of every check since the last update (each
        optimizer's, and ``finite``, else each functional ``unscale()``'s); and the OR of the
        optimizers' checks alone (for the overflow report)."""
        # Loops, not comprehensions or any(): each of those is a call per update. step()
        # has left a bool in its optimizer's check, unscale_() alone a tensor.
        checked = optimizer_found = False
        for s in self._optimizer_checks.values():
            if "found_inf" in s:
                checked = True
                if _is_set(s["found_inf"]):
                    optimizer_found = True
        found_inf = optimizer_found
        # A flag stands for the functional unscale() checks it was made from, as on the
        # functional backends, which record none: the optimizers' checks stay.
        for flag in self._functional_found_inf if finite is None else ():
            checked = True
            if _is_set(flag):
                found_inf = True
        if finite is not None:
            checked = True
            if not bool(finite):
                found_inf = True
        if not checked:
            raise NoInfChecksError.prior_to_update()
        return found_inf, optimizer_found

    def _set_scale(self, new_scale: Any) -> None:
        """``update(new_scale=...)``: the scale set by hand, the trackers kept; not an
        update, so nothing is left to report."""
        if isinstance(new_scale, paddle.Tensor):
            if new_scale.size != 1 or not paddle.is_floating_point(new_scale):
                raise TypeError(f"new_scale must be a float or a 1-element array/tensor, "
                                f"got {new_scale!r}")
            new_scale = new_scale.item()  # a Python float: a floating tensor's item
        self._set_state(self._state._replace(scale=new_scale_value(new_scale)))
        self._remember_update(None)

    def _forget_iteration(self) -> None:
        """After an update: the next iteration starts with no checks (Paddle's own
        ``_optimizer_states`` too), in any thread."""
        self._optimizer_checks.clear()  # Paddle's _optimizer_states: the same dict
        self._functional_found_inf = []
        if self._prechecked:
            self._prechecked = {}
        super()._forget_iteration()
        _compat.write_native_iteration(self, self._optimizer_checks,
                                       self._last_skipped if self._updates else None)
        self._iteration_thread = None

    def _claim(self) -> None:
        # One scaler's iteration (scale ... update) must run in one thread: two threads
        # interleaving their verbs mix their inf checks and updates (wrong scales, no
        # error). Comparing thread ids costs far less than a verb's tensor work.
        me = threading.get_ident()
        if self._iteration_thread is None:
            self._iteration_thread = me
        elif self._iteration_thread != me:
            raise RuntimeError(
                "this scaler is in the middle of an iteration begun by another thread: a "
                "scaler is not thread-safe; give each thread its own scaler, or finish the "
                "iteration (update()) before another thread uses it")

    # ------------------------------------------------------------ tooling

    @classmethod
    def devices(cls) -> list[str]:
        """``cpu`` and every GPU Paddle sees."""
        count = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
        return ["cpu"] + [f"gpu:{i}" for i in range(count)]
