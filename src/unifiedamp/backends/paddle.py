"""The PaddlePaddle backend: a real ``paddle.amp.GradScaler`` that follows the spec bit for bit.

paddle 3.3.1's own scaler cannot be used as it is: it disables itself on a
CPU place and (unless ``auto_cast`` set float16) at the first ``scale()``, its
backoff path raises ``TypeError`` with NumPy 2 (``float()`` of a 1-element
tensor), ``update()`` sees only the last optimizer's inf flag and reuses a
stale one when no step ran, and growth past float32 makes the scale inf. This
subclass keeps its class, names and verbs and replaces its behaviour:

- the gradients are checked and unscaled by Paddle's own kernel
  ``check_finite_and_unscale_`` (float32 gradients; other dtypes by the same
  arithmetic in elementwise ops), on whatever place the scale lives;
- every check of the iteration (every optimizer, every ``unscale_``, every
  rank) is OR-ed into the one ``found_inf`` the update acts on;
- the update is the spec's rule, applied to the host copy of the state (the
  scale is a float32 value, the trackers are ints): ``step()`` must read the
  flag on the host anyway to decide whether to call ``optimizer.step()``, as
  Paddle's optimizers do, so keeping the rule there costs no extra sync.

After a skipped step, ``scaler.overflow_report()`` names the gradients that held
inf/NaN: by ``scaler.watch(model)``'s names (``model.named_parameters()``, matched
by identity), else ``param_groups[g][i]``: ``g`` the group, ``i`` the index in it,
in the order of ``optimizer._param_groups`` (an optimizer built from a plain list
of parameters has one group, ``param_groups[0][i]``); ``optimizers[k].`` is put in
front when several optimizers were checked in that iteration (``k`` in the order
they were unscaled). ``history=N`` keeps the last N updates in tensors on the
scaler's place, written with device ops.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle
import paddle.distributed as dist
from paddle import _C_ops
from paddle.amp.grad_scaler import OptimizerState, _refresh_optimizer_state

from unifiedamp import spec
from unifiedamp._monitor import CollapseMonitor
from unifiedamp._scaler import (
    GradScaler,
    HostCounters,
    LastUpdate,
    NoInfChecksError,
    ScaleNotCalledError,
    SkipReports,
    diagnostics_options,
    mid_iteration_load_error,
    new_scale_value,
    report_note,
    update_arguments,
    watched_pairs,
)
from unifiedamp._tree import leaves, tree_map
from unifiedamp.diagnostics import GradientOverflow, OverflowReport, ScaleHistory
from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["PaddleGradScaler", "paddle_expressible"]

_EXTRA_NAMES = ("device", "process_group", "distributed", "max_consecutive_skips",
                "on_collapse", "backend", "diagnose", "history")

# Paddle's CPU kernel check_finite_and_unscale_ takes float32 and float64
# gradients only (3.3.1), and for float64 it divides by a float64 scale, not by
# the float32 reciprocal every other backend multiplies by: only float32 goes
# through it. bfloat16/float16 (GPU training, or multi_precision parameters)
# and float64 take the elementwise path, which does the same arithmetic.
_KERNEL_DTYPES = (paddle.float32,)


def paddle_expressible(config: ScalerConfig) -> bool:
    """Whether ``paddle.amp.GradScaler`` can hold this config (its state dict can carry it).

    Example:
        >>> paddle_expressible(ScalerConfig()), paddle_expressible(ScalerConfig(min_scale=1.0))
        (True, False)
    """
    return (config.growth_factor > 1.0 and config.backoff_factor < 1.0
            and config.min_scale is None and config.max_scale is None)


def _place(device: Any) -> Any:
    """The Paddle place for ``device`` (a string such as ``"cpu"`` or ``"gpu:0"``, or a
    place); ``None`` is Paddle's current device (``paddle.get_device()``)."""
    if device is None:
        device = paddle.get_device()
    if not isinstance(device, str):
        return device
    kind = device.split(":")[0].lower()
    if kind in ("gpu", "cuda") and not paddle.is_compiled_with_cuda():
        # Paddle's own message ("The device should not be <re.Match object...>")
        # says neither what was asked nor what to do.
        raise RuntimeError(
            f"device={device!r} but this paddle is built without CUDA "
            "(paddle.is_compiled_with_cuda() is False): pass device='cpu' or enabled=False, or "
            "install paddlepaddle-gpu")
    try:
        return paddle.device._convert_to_place(device.lower().replace("cuda", "gpu"))
    except (ValueError, RuntimeError):
        # Paddle's message for a device its build lacks shows a regex match object.
        raise ValueError(f"device={device!r} is not a device this paddle can use: pass 'cpu', "
                         "'gpu' or 'gpu:N' (with a CUDA build), or leave device out "
                         "(paddle.get_device())") from None


def _params_of(optimizer: Any) -> list[Any]:
    return [param for _, param in _indexed_params_of(optimizer)]


def _indexed_params_of(optimizer: Any) -> list[tuple[str, Any]]:
    """``(param_groups[g][i], parameter)`` for every parameter, in the optimizer's order."""
    groups = getattr(optimizer, "_param_groups", None)
    if groups is None:
        raise TypeError(f"optimizer must be a paddle.optimizer.Optimizer, got "
                        f"{type(optimizer).__name__}")
    params: list[tuple[str, Any]] = []
    for g, group in enumerate(groups):
        if isinstance(group, dict):
            params.extend((f"param_groups[{g}][{i}]", p) for i, p in enumerate(group["params"]))
        else:  # built from a list of parameters: one group
            params.append((f"param_groups[0][{len(params)}]", group))
    return params


def _dense(grad: Any) -> Any:
    # A sparse gradient (Embedding(sparse=True)) is SelectedRows, which the dense
    # kernels misread (garbage dimensions, paddle 3.3.1); its values tensor shares
    # the gradient's storage.
    return grad._get_tensor_from_selected_rows() if grad.is_selected_rows() else grad


def _wide(tensor: Any) -> Any:
    # Paddle's CPU kernels lack float16/bfloat16 for abs and friends (3.3.1).
    if tensor.dtype in (paddle.float32, paddle.float64):
        return tensor
    return tensor.astype(paddle.float32)


def _nonfinite(grads: list[Any]) -> list[bool]:
    """Which gradients hold inf/NaN: one finite check each, one host read for all."""
    if not grads:
        return []
    flags = paddle.stack([paddle.isfinite(_wide(g)).all() for g in grads])
    return [not bool(f) for f in flags.numpy()]


def _counts(grad: Any) -> tuple[tuple[int, ...], int, int, float]:
    """``(shape, inf, nan, largest finite |g|)`` of a gradient, in one host read."""
    g = _wide(grad)
    finite = paddle.isfinite(g)
    largest = paddle.where(finite, g.abs(), paddle.zeros_like(g)).max()
    inf, nan, largest = paddle.stack([
        paddle.isinf(g).sum().astype(paddle.float64), paddle.isnan(g).sum().astype(paddle.float64),
        largest.astype(paddle.float64)]).numpy().tolist()
    return tuple(grad.shape), int(inf), int(nan), largest


class PaddleGradScaler(SkipReports, HostCounters, paddle.amp.GradScaler, GradScaler):
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
            ring, read by :meth:`history` (0: none).
        **kwargs: The other config parameters, by canonical name or alias (Paddle's
            ``init_loss_scaling``, ``incr_ratio``, ``decr_ratio``, ``incr_every_n_steps``,
            ``decr_every_n_nan_or_inf``, ``enable``, ``use_dynamic_loss_scaling``).

    Attributes:

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
        ring = diagnostics_options(diagnose, history)
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
        # paddle 3.3.1 disables an enabled scaler on a CPU place (with a warning)
        # and asserts factors != 1: built disabled, it sets nothing we need, and
        # the attributes its methods read are set from the config below.
        super().__init__(enable=False)
        self._config = config
        self._monitor = monitor
        self._place = place
        self._process_group = process_group
        self._distributed = distributed
        self._state = ScalerState.initial(config)
        self._scale: paddle.Tensor = paddle.to_tensor(np.array([self._state.scale], np.float32),
                                                     place=place)
        self._factors: dict[Any, Any] = {}  # dtype -> 0-d scale or 1/scale tensor
        # optimizer id -> {"state": OptimizerState, "found_inf": bool or bool tensor}
        self._optimizer_states = defaultdict(_refresh_optimizer_state)
        self._functional_found_inf: list[Any] = []
        # Paddle's own flags, bools here (its stubs type them from its __init__: tensor, None).
        self._found_inf = False  # type: ignore[assignment]
        self._cache_found_inf: bool | None = None  # type: ignore[assignment]
        self._scale_called = False
        self._bf16_warned = False
        self._updates = 0
        # The thread that began this iteration (its first verb since the last update).
        self._iteration_thread: int | None = None
        # Diagnostics: what overflow_report() needs, kept only until the next update.
        self._diagnose = diagnose
        self._watched: dict[int, tuple[str, Any]] = {}  # id(param) -> (name, param)
        self._checked: dict[int, Any] = {}  # id -> optimizer unscaled this iteration
        # id(optimizer) -> {parameter index: counts} taken before the CPU kernel ran
        self._prechecked: dict[int, dict[int, tuple[Any, ...]]] = {}
        self._last_output: Any = None  # the tensor given to scale(), when one
        self._last: LastUpdate | None = None  # the last update, if it skipped
        self._ring_iterations = np.zeros(ring, np.int64)  # the host counts updates
        self._ring_scales = paddle.to_tensor(np.zeros(ring, np.float32), place=place)
        self._ring_skipped = paddle.to_tensor(np.zeros(ring, bool), place=place)
        self._ring_count = 0
        self._sync_paddle_attributes()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._state}, {self._config})"

    def __getstate__(self) -> dict[str, Any]:
        # Paddle places and process groups do not pickle: carry the place's name and the
        # host state, and rebuild the tensors on load. Like torch's copy, a copy starts a
        # new iteration (no inf checks carried over).
        d = dict(self.__dict__)
        d["_place"] = str(self._place)  # "Place(cpu)", "Place(gpu:0)"
        for name in ("_scale", "_process_group"):
            d[name] = None
        d["_factors"] = {}
        d["_optimizer_states"] = None
        d["_functional_found_inf"] = []
        d["_iteration_thread"] = None
        # Diagnostics: the ring goes as arrays, the last report as a report; watch()
        # names, optimizers and gradients do not (a copy forgets watch()).
        d["_ring_scales"] = self._ring_scales.numpy()
        d["_ring_skipped"] = self._ring_skipped.numpy()
        d["_watched"], d["_checked"], d["_prechecked"], d["_last_output"] = {}, {}, {}, None
        if self._last is not None:  # the copy gets the report, read from the gradients now
            d["_last"] = self._last.detached(self.overflow_report())
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        # A scaler pickled before the diagnostics existed has none of them.
        self.__dict__.update({"_iteration_thread": None,
                              "_diagnose": False, "_watched": {}, "_checked": {},
                              "_prechecked": {}, "_last_output": None, "_last": None,
                              "_ring_iterations": np.zeros(0, np.int64), "_ring_count": 0,
                              "_ring_scales": np.zeros(0, np.float32),
                              "_ring_skipped": np.zeros(0, bool)})
        self.__dict__.update(d)
        place = d["_place"]
        self._place = _place(place[len("Place("):-1] if place.startswith("Place(") else place)
        self._scale = paddle.to_tensor(np.array([self._state.scale], np.float32),
                                       place=self._place)
        self._optimizer_states = defaultdict(_refresh_optimizer_state)
        self._ring_scales = paddle.to_tensor(self._ring_scales, place=self._place)
        self._ring_skipped = paddle.to_tensor(self._ring_skipped, place=self._place)

    def _sync_paddle_attributes(self) -> None:
        # Paddle's own attribute names, for code and tools that read them.
        c, s = self._config, self._state
        self._enable = c.enabled
        self._use_dynamic_loss_scaling = c.dynamic
        self._init_loss_scaling = c.init_scale
        self._incr_ratio = c.growth_factor
        self._decr_ratio = c.backoff_factor
        self._incr_every_n_steps = c.growth_interval
        self._decr_every_n_nan_or_inf = c.hysteresis
        self._incr_count = s.growth_tracker
        self._decr_count = s.hysteresis_tracker

    def _set_state(self, state: ScalerState) -> None:
        if state.scale != self._state.scale:
            self._scale.fill_(state.scale)  # a float32 value: fill_ stores it exactly
            self._factors.clear()
        self._state = state
        self._incr_count = state.growth_tracker
        self._decr_count = state.hysteresis_tracker

    # ------------------------------------------------------------ config and state

    @property
    def config(self) -> ScalerConfig:
        return self._config

    @property
    def state(self) -> ScalerState:
        return self._state

    @property
    def native(self) -> PaddleGradScaler:
        """The ``paddle.amp.GradScaler`` to hand to Paddle code: this scaler itself."""
        return self

    def is_enabled(self) -> bool:
        return self._config.enabled

    def is_enable(self) -> bool:
        """Paddle's name for :meth:`is_enabled`."""
        return self._config.enabled

    def is_use_dynamic_loss_scaling(self) -> bool:
        return self._config.dynamic

    def get_scale(self) -> float:
        """The current scale; 1.0 when disabled, as in torch."""
        return self._state.scale if self._config.enabled else 1.0

    def get_init_loss_scaling(self) -> float:
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
        self._sync_paddle_attributes()
        return self

    # paddle.amp.GradScaler's names for the interface's accessors, with its keywords.
    # Paddle's setters return None, the interface's the scaler: hence the [override]s.
    get_incr_ratio = GradScaler.get_growth_factor
    get_decr_ratio = GradScaler.get_backoff_factor
    get_incr_every_n_steps = GradScaler.get_growth_interval
    get_decr_every_n_nan_or_inf = GradScaler.get_hysteresis

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
        c, s = self._config, self._state
        return {"scale": np.array([s.scale], np.float32), "incr_ratio": c.growth_factor,
                "decr_ratio": c.backoff_factor, "incr_every_n_steps": c.growth_interval,
                "decr_every_n_nan_or_inf": c.hysteresis, "incr_count": s.growth_tracker,
                "decr_count": s.hysteresis_tracker, "use_dynamic_loss_scaling": c.dynamic}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads a canonical dict of any backend, or a native Paddle or torch dict.

        ``enabled`` stays as this scaler was built. A dict that fails validation
        raises ``ValueError`` and changes nothing.
        """
        if self._functional_found_inf or any("found_inf" in s
                                             for s in self._optimizer_states.values()):
            raise mid_iteration_load_error()
        config, state = spec.parse_state_dict(state_dict, base=self._config)
        self._config = config.replace(enabled=self._config.enabled)
        self._sync_paddle_attributes()
        self._set_state(state)

    # ------------------------------------------------------------ the verbs

    def _factor(self, dtype: Any, reciprocal: bool = False) -> Any:
        """The 0-d scale (or ``f32(1 / scale)``, the float64 reciprocal rounded once) as a
        tensor to multiply a ``dtype`` tensor by: float64 for float64, else float32
        (16-bit values are multiplied in float32 and rounded back, as NumPy does)."""
        key = (dtype == paddle.float64, reciprocal)
        factor = self._factors.get(key)
        if factor is None:
            value = np.float32(self._state.scale)
            if reciprocal:
                with np.errstate(divide="ignore", over="ignore"):
                    value = np.float32(np.float64(1.0) / np.float64(value))
            factor = paddle.to_tensor(np.asarray(value, np.float64 if key[0] else np.float32),
                                      place=self._place)
            self._factors[key] = factor
        return factor

    def _multiply(self, tensor: Any, reciprocal: bool = False) -> Any:
        if tensor.dtype in (paddle.float32, paddle.float64):
            return tensor * self._factor(tensor.dtype, reciprocal)
        return (tensor.astype(paddle.float32) * self._factor(tensor.dtype, reciprocal)
                ).astype(tensor.dtype)

    def scale(self, outputs: Any) -> Any:
        """Multiplies a tensor, or a list/tuple/dict of them, by the scale (shape and dtype
        kept), on every place and whatever ``auto_cast`` is set to."""
        if not self._config.enabled:
            return outputs
        self._claim()
        self._scale_called = True
        if not self._bf16_warned:
            self._warn_if_bf16(outputs)
        scaled = tree_map(self._scale_one, outputs)
        # For overflow_report().loss_finite, read only after a skipped update.
        self._last_output = outputs if isinstance(outputs, paddle.Tensor) else None
        return scaled

    def _scale_one(self, tensor: Any) -> Any:
        if not isinstance(tensor, paddle.Tensor):
            raise TypeError(f"scale() takes a paddle.Tensor or a list/tuple/dict of them, got "
                            f"{type(tensor).__name__}")
        if not paddle.is_floating_point(tensor):
            raise TypeError(f"scale() takes floating-point tensors, got {tensor.dtype}")
        return self._multiply(tensor)

    def _warn_if_bf16(self, outputs: Any) -> None:
        first = next(iter(leaves(outputs)), None)
        if not isinstance(first, paddle.Tensor):
            return
        tracer = paddle.base.framework._dygraph_tracer()
        autocast_bf16 = (tracer is not None and str(tracer._amp_level) != "AmpLevel.O0"
                         and tracer._amp_dtype == "bfloat16")
        if first.dtype == paddle.bfloat16 or autocast_bf16:
            self._bf16_warned = True
            # paddle.amp.GradScaler disables itself here (3.3.1); this one keeps
            # scaling, which is harmless, and says once that it is unnecessary.
            warnings.warn(
                "Loss scaling is unnecessary with bfloat16: it has float32's exponent range, "
                "so gradients do not underflow. Build the scaler with enabled=False (every verb "
                "becomes a pass-through) or drop it.", UserWarning, stacklevel=3)

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
        kernel = [g for g in grads if g.dtype in _KERNEL_DTYPES]
        if kernel:
            # It returns a new flag: the one passed in is not written in eager mode.
            # Paddle's stub leaves out the found_inf argument the kernel takes.
            _, flag = _C_ops.check_finite_and_unscale_(  # type: ignore[call-arg]
                kernel, self._scale, paddle.zeros([1], dtype=paddle.bool))
            flags.append(flag)
        for g in grads:
            if g.dtype not in _KERNEL_DTYPES:
                wide = g if g.dtype == paddle.float64 else g.astype(paddle.float32)
                flags.append(paddle.logical_not(paddle.isfinite(wide).all()).reshape([1]))
                paddle.assign(self._multiply(g, reciprocal=True), g)
        if spec.unscale_overflows(self._state.scale):
            # 1/scale is inf in float32: every unscaled gradient is inf or NaN.
            return True
        return functools.reduce(paddle.logical_or, flags) if flags else False

    def unscale_(self, optimizer: Any) -> None:
        """Divides the optimizer's gradients by the scale in place and records inf/NaN,
        agreed across ranks when ``paddle.distributed`` is initialised."""
        if not self._config.enabled:
            return
        self._claim()
        self._require_scale_called("unscale_")
        state = self._optimizer_states[id(optimizer)]
        if state["state"] is OptimizerState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        if state["state"] is OptimizerState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # A sparse gradient's values tensor shares its storage (_dense), so unscaling
        # it in place unscales the gradient.
        indexed = [(k, _dense(p.grad)) for k, p in enumerate(_params_of(optimizer))
                   if p.grad is not None]
        grads = [g for _, g in indexed]
        if self._diagnose:
            self._prechecked[id(optimizer)] = self._precheck(indexed)
        self._checked[id(optimizer)] = optimizer
        found = self._check_and_unscale(grads) if grads else None
        if self._across_ranks():
            found = self._agree_across_ranks(found)
        if found is not None:
            state["found_inf"] = found
        state["state"] = OptimizerState.UNSCALED

    def _unscale(self, optimizer: Any) -> None:
        # The name paddle.amp.GradScaler's own code (and tools built on it) calls.
        self.unscale_(optimizer)

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
        return self._step(optimizer, optimizer.step, *args, **kwargs)

    def _step(self, optimizer: Any, call: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._config.enabled:
            return call(*args, **kwargs)
        self._claim()
        self._require_scale_called("step")
        state = self._optimizer_states[id(optimizer)]
        if state["state"] is OptimizerState.STEPPED:
            raise RuntimeError("step() has already been called since the last update(). Call "
                               "scaler.update() once per iteration, after the last step().")
        if state["state"] is OptimizerState.INIT:
            self.unscale_(optimizer)
        if "found_inf" not in state:
            raise NoInfChecksError("No inf checks were recorded for this optimizer.")
        # The one host read: Python must decide whether to step (Paddle's optimizers
        # read their found_inf the same way).
        skipped = bool(state["found_inf"])
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
        retval = self._step(optimizer, optimizer.minimize, *args, **kwargs)
        if self._config.enabled:
            self.update()
        return (None, None) if retval is None else retval

    def unscale(self, grads: Any) -> tuple[Any, Any]:
        """Functional unscale: ``(unscaled copies of grads, all finite)``.

        ``grads`` is a tensor or a list/tuple/dict of them; ``all finite`` is a bool
        tensor (or a Python bool when the scale's reciprocal overflows). The check
        counts towards the next ``update()``.
        """
        for leaf in leaves(grads):
            if not isinstance(leaf, paddle.Tensor):
                raise TypeError(
                    f"grads must be a paddle.Tensor or a list/tuple/dict of them, got a "
                    f"{type(leaf).__name__} leaf ({leaf!r}); convert it with paddle.to_tensor")
        out = tree_map(lambda g: g.detach().clone(), grads)
        if not self._config.enabled:
            return out, True
        self._claim()
        found = self._check_and_unscale(leaves(out))
        self._functional_found_inf.append(found)
        if isinstance(found, bool):
            return out, paddle.to_tensor(not found)
        return out, paddle.logical_not(found.reshape([]))

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
        check; ``update()`` uses the checks alone. ``new_scale`` (a float, a 1-element
        array or tensor; finite and > 0; a number as the first argument, as in torch)
        sets the scale instead, leaving the trackers, as torch does; such a manual set
        is not counted as an update: it is not recorded in :meth:`history`, and
        :meth:`overflow_report` is None after it (as on torch).
        """
        finite, new_scale = update_arguments(finite, new_scale)
        if not self._config.enabled:
            return self
        self._claim()
        found_inf = False
        if new_scale is not None:
            if isinstance(new_scale, paddle.Tensor):
                if new_scale.size != 1 or not paddle.is_floating_point(new_scale):
                    raise TypeError(f"new_scale must be a float or a 1-element array/tensor, "
                                    f"got {new_scale!r}")
                new_scale = new_scale.item()  # a Python float: a floating tensor's item
            self._set_state(self._state._replace(scale=new_scale_value(new_scale)))
            self._last = None
        else:
            optimizer_checks = [s["found_inf"] for s in self._optimizer_states.values()
                                if "found_inf" in s]
            checks = optimizer_checks + self._functional_found_inf
            if finite is not None:
                checks.append(not bool(finite))
            if not checks:
                raise NoInfChecksError("No inf checks were recorded prior to update.")
            found_inf = any(bool(flag) for flag in checks)
            self._cache_found_inf = found_inf
            scale = self._state.scale
            self._set_state(spec.update(self._config, self._state, found_inf))
            self._count(found_inf)
            self._record(scale, found_inf)
            self._last = None
            if found_inf:
                self._last = LastUpdate(
                    self._updates, scale, list(self._checked.values()), self._last_output,
                    not any(bool(flag) for flag in optimizer_checks), self._across_ranks(),
                    self._prechecked)
                if self._diagnose:
                    self._last.report = self._compute_report(self._last, at_update=True)
        self._optimizer_states = defaultdict(_refresh_optimizer_state)
        self._functional_found_inf = []
        self._checked, self._prechecked, self._last_output = {}, {}, None
        self._iteration_thread = None
        if new_scale is None:
            # After the update is applied: on_collapse="raise" leaves a consistent scaler.
            self._monitor.observe(self._updates, self._state.scale, found_inf,
                                  detail=self._collapse_detail if found_inf else None)
        return self

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

    def _update(self) -> None:
        # The name paddle.amp.GradScaler's own code calls after a step.
        self.update()

    # ------------------------------------------------------------ diagnostics

    def watch(self, model: Any) -> None:
        """Names the parameters in :meth:`overflow_report`.

        ``model`` is a ``paddle.nn.Layer`` (its ``named_parameters()``), a dict ``name ->
        parameter`` or an iterable of ``(name, parameter)`` pairs, matched to the
        optimizer's parameters by identity. Calls add up (a later name for the same
        parameter wins); every pair is checked before any is kept. A copy of the scaler
        (``copy.deepcopy``, pickle) forgets the names: watch again. Unwatched parameters
        are named ``param_groups[g][i]``.

        Example:
            >>> import paddle
            >>> model = paddle.nn.Linear(2, 1)
            >>> opt = paddle.optimizer.SGD(parameters=model.parameters())
            >>> scaler = PaddleGradScaler(8.0)
            >>> scaler.watch(model)
            >>> x = paddle.to_tensor([[float("inf"), 1.0]])  # d(out)/d(weight) = x
            >>> scaler.scale(model(x).sum()).backward()
            >>> scaler.step(opt); _ = scaler.update()
            >>> scaler.overflow_report().names
            ['weight']
        """
        pairs = watched_pairs(model, lambda p: isinstance(p, paddle.Tensor), "paddle.Tensor")
        self._watched.update((id(param), (name, param)) for name, param in pairs)

    def overflow_report(self) -> OverflowReport | None:
        """Which gradients held inf/NaN at the last update, if it skipped; else None.

        With ``diagnose=True`` the report was computed during that ``update()``. Without,
        it is computed now (once, then kept) from the gradients of the optimizers checked
        in that iteration as they are now: ``clear_grad()`` zeroes or removes them, and
        the report then lists none and says so; on a CPU place Paddle's kernel has already
        multiplied a checked float32 gradient by 0 (an inf reads as NaN, the largest finite
        value as 0: the names are right, and the note says so). ``max_finite`` is of the
        unscaled gradient. ``loss_finite`` is whether the one tensor given to ``scale()``
        that iteration was finite (None when it got a container).

        Example:
            >>> import paddle
            >>> model = paddle.nn.Linear(2, 1)
            >>> opt = paddle.optimizer.SGD(parameters=model.parameters())
            >>> scaler = PaddleGradScaler(8.0, diagnose=True)
            >>> x = paddle.to_tensor([[float("nan"), 1.0]])  # d(out)/d(weight) = x
            >>> scaler.scale(model(x).sum()).backward()
            >>> scaler.step(opt); _ = scaler.update(); opt.clear_grad()
            >>> print(scaler.overflow_report())  # doctest: +NORMALIZE_WHITESPACE
            Step 1 was skipped at scale 8: 1 of 2 gradients held inf/NaN.
              param_groups[0][0] (2, 1): 0 inf, 1 NaN, largest finite |g| 1
            The loss itself was inf/NaN before scaling: the model, not the scale, is the
            problem; lower the learning rate, train in bfloat16 (no loss scaling needed), or
            clip the gradients after unscaling them (torch/paddle: scaler.unscale_(optimizer),
            then clip the norm; optax: clip_by_global_norm inside loss_scaled).
        """
        return self._kept_report()

    def history(self) -> ScaleHistory:
        """The last ``history`` updates (oldest first): iteration (counted from 1), the scale
        that iteration used (before the update changed it), and whether it skipped.

        The ring lives on the scaler's place, written by device ops at each update;
        this reads it.

        Raises:
            ValueError: The scaler was built with ``history=0`` (the default).

        Example:
            >>> import paddle
            >>> model = paddle.nn.Linear(2, 1)
            >>> opt = paddle.optimizer.SGD(parameters=model.parameters())
            >>> scaler = PaddleGradScaler(8.0, history=2)
            >>> for poison in (1.0, float("inf"), 1.0):
            ...     scaler.scale(model(paddle.full([1, 2], poison)).sum()).backward()
            ...     scaler.step(opt); _ = scaler.update(); opt.clear_grad()
            >>> scaler.history().as_list()
            [(2, 8.0, True), (3, 4.0, False)]
        """
        if not len(self._ring_iterations):
            raise ValueError("this scaler keeps no history: build it with history=N (e.g. "
                             "history=1000) to keep the last N updates")
        return ScaleHistory.from_ring(self._ring_iterations, self._ring_scales.numpy(),
                                      self._ring_skipped.numpy(), self._ring_count)

    def _record(self, scale: float, skipped: bool) -> None:
        size = len(self._ring_iterations)
        if size:
            # set_value ops on the scaler's place: values from the host, no read back.
            slot = self._ring_count % size
            self._ring_iterations[slot] = self._updates
            self._ring_scales[slot] = scale
            self._ring_skipped[slot] = skipped
            self._ring_count += 1

    def _precheck(self, indexed: list[tuple[int, Any]]) -> dict[int, tuple[Any, ...]]:
        """The counts of the float32 gradients on a CPU place that hold inf/NaN, taken
        before Paddle's CPU kernel multiplies them by 0 (parameter index -> counts); on
        other places the kernel leaves them readable and this checks nothing."""
        cpu = [(k, g) for k, g in indexed
               if g.dtype in _KERNEL_DTYPES and g.place.is_cpu_place()]
        bad = _nonfinite([g for _, g in cpu])
        # Counted as the kernel would have stored them: unscaled.
        return {k: _counts(self._multiply(g, reciprocal=True))
                for (k, g), b in zip(cpu, bad, strict=True) if b}

    def _compute_report(self, last: LastUpdate, at_update: bool) -> OverflowReport:
        watched = self._watched
        prefix = len(last.optimizers) > 1
        found: dict[int, GradientOverflow] = {}  # position among the checked -> overflow
        todo = []  # (position, name, gradient) to check now
        zeroed = False  # a CPU float32 gradient, multiplied by 0 by the kernel
        position = 0
        for k, optimizer in enumerate(last.optimizers):
            prechecked = last.prechecked.get(id(optimizer))
            for index, (fallback, param) in enumerate(_indexed_params_of(optimizer)):
                if param.grad is None:
                    continue
                entry = watched.get(id(param))
                if entry is not None and entry[1] is param:
                    name = entry[0]
                else:
                    name = f"optimizers[{k}].{fallback}" if prefix else fallback
                grad = _dense(param.grad)
                if (prechecked is not None and grad.dtype in _KERNEL_DTYPES
                        and grad.place.is_cpu_place()):
                    if index in prechecked:
                        found[position] = GradientOverflow(name, *prechecked[index])
                else:
                    todo.append((position, name, grad))
                position += 1
        for (pos, name, grad), bad in zip(todo, _nonfinite([g for _, _, g in todo]),
                                          strict=True):
            if bad:
                found[pos] = GradientOverflow(name, *_counts(grad))
                zeroed = zeroed or (grad.dtype in _KERNEL_DTYPES and grad.place.is_cpu_place())
        overflows = [found[pos] for pos in sorted(found)]
        loss_finite = (None if last.loss is None
                       else bool(paddle.isfinite(_wide(last.loss)).all()))
        note = report_note(
            last, bool(overflows), position, at_update, items="tensors", clear="clear_grad",
            changed=" (clear_grad() zeroes them)", zeroed=_ZEROED if zeroed else "")
        return OverflowReport(last.step, last.scale, overflows, position, loss_finite, note)

    # ------------------------------------------------------------ tooling

    @classmethod
    def devices(cls) -> list[str]:
        """``cpu`` and every GPU Paddle sees."""
        count = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
        return ["cpu"] + [f"gpu:{i}" for i in range(count)]


_ZEROED = ("Paddle's CPU kernel multiplied these float32 gradients by 0 when it found inf/NaN, "
           "so an inf reads as NaN and the largest finite value as 0: the names are right; "
           "build the scaler with diagnose=True for the counts.")
