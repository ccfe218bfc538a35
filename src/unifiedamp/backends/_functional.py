"""The immutable scaler shared by the functional backends (JAX, MLX).

A scaler is a value: five 0-d arrays (:data:`LEAVES`: the float32 ``loss_scale``,
the int32 trackers and skip counters) and a static :class:`ScalerConfig`. Every verb
returns a new value; nothing waits for the device. The rule, validation, state
handling and the tree of arrays are written here once. A backend names its array
namespace (``xp``) and how its arrays are made, and may change how the scale is
multiplied: JAX keeps exact float32 products under XLA's flush-to-zero by working
on bit patterns (:meth:`FunctionalGradScaler._encode` and friends).

The diagnostics (``docs/diagnostics.md``) are written here once too: per-leaf overflow
counts computed inside the traced step (:func:`leaf_counts`) and read into an
:class:`~unifiedamp.diagnostics.OverflowReport` outside it (:func:`build_report`), a ring of
(iteration, scale, skipped) kept in the user's train state (:func:`history_init`,
:func:`history_record`, :func:`scale_history`), and the collapse message the imperative
backends' monitor gives, read from a scaler's skip counters (:func:`collapse_message`).
Each backend wraps them with its tree functions (JAX key paths, MLX dotted paths).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, ClassVar, NamedTuple

from unifiedamp import spec
from unifiedamp._monitor import CollapseMonitor, ScaleCollapseError, ScaleCollapseWarning
from unifiedamp._scaler import MAX_HISTORY, GradScaler, check_flag, new_scale_value
from unifiedamp.diagnostics import GradientOverflow, OverflowReport, ScaleHistory
from unifiedamp.spec import ScalerConfig, ScalerState

#: The arrays of a scaler, in pytree order: the state, then the skip counters.
LEAVES = ("loss_scale", "growth_tracker", "hysteresis_tracker", "skipped_steps",
          "consecutive_skips", "updates")


class FunctionalGradScaler(GradScaler):
    """Base of the immutable scalers; a subclass sets ``backend`` and ``xp`` and implements
    ``_array``, ``scale`` and ``unscale``.

    Attributes:
        loss_scale: The scale, a float32 0-d array.
        growth_tracker: Consecutive finite updates, an int32 0-d array.
        hysteresis_tracker: Consecutive non-finite updates, an int32 0-d array.
        skipped_steps: Updates whose gradients were not all finite (the skipped
            steps), an int32 0-d array; not part of a state dict, as in torch.
        consecutive_skips: Such updates in a row up to the last one, an int32 0-d array.
        updates: Updates made, an int32 0-d array; not part of a state dict either.
    """

    functional = True
    capabilities = frozenset({"tree", "with_tree", "with_config"})

    #: The array namespace: ``jax.numpy`` or ``mlx.core``.
    xp: ClassVar[Any]
    # Set by _set_arrays (through object.__setattr__: the scaler is immutable).
    _config: ScalerConfig
    loss_scale: Any
    growth_tracker: Any
    hysteresis_tracker: Any
    skipped_steps: Any
    consecutive_skips: Any
    updates: Any

    def __init__(self, *args: Any, **kwargs: Any):
        config = spec.config_from_args(args, kwargs, extra_names=("backend",))
        # One array per leaf: a jitted step that donates the scaler's buffers may not
        # meet the same buffer twice.
        self._set_arrays(config, *self._arrays(ScalerState.initial(config)),
                         *(self._array(0, self.xp.int32) for _ in LEAVES[3:]))

    @classmethod
    def _array(cls, value: Any, dtype: Any) -> Any:
        """A 0-d array of ``dtype`` (``xp.float32``, ``xp.int32``, ``xp.bool_``) from ``value``."""
        raise NotImplementedError

    @classmethod
    def _arrays(cls, state: ScalerState) -> tuple[Any, Any, Any]:
        xp = cls.xp
        return (cls._array(state.scale, xp.float32), cls._array(state.growth_tracker, xp.int32),
                cls._array(state.hysteresis_tracker, xp.int32))

    @classmethod
    def _overflow_reductions(cls, grad: Any) -> tuple[Any, ...]:
        """``(inf count, NaN count, largest finite |g|)`` of a non-empty float array, 0-d
        arrays, traceable. Sums of bool arrays (MLX sums them into int32; a cast first
        made ``mx.compile`` write an int32 copy of each gradient: 2 to 3x slower)."""
        xp = cls.xp
        return (xp.sum(xp.isinf(grad)), xp.sum(xp.isnan(grad)),
                xp.max(xp.where(xp.isfinite(grad), xp.abs(grad), 0)))

    def _set_arrays(self, config: ScalerConfig, *arrays: Any) -> None:
        object.__setattr__(self, "_config", config)
        for name, array in zip(LEAVES, arrays, strict=True):
            object.__setattr__(self, name, array)

    @classmethod
    def _make(cls, config: ScalerConfig, *arrays: Any) -> Any:
        """A scaler from a config and one array per name of :data:`LEAVES`."""
        new = object.__new__(cls)
        new._set_arrays(config, *arrays)
        return new

    def _leaves(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in LEAVES)

    def _traced(self, array: Any) -> bool:
        """Whether ``array`` is a placeholder of a traced function, with no value to read."""
        return False

    def _host(self, array: Any, cast: Any) -> Any:
        # Outside a traced function, a Python value; inside, the array itself, which
        # the traced function can return or log.
        return array if self._traced(array) else cast(array.item())

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: update() and with_config() "
                             "return a new scaler")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(loss_scale={self.loss_scale!r}, growth_tracker="
                f"{self.growth_tracker!r}, hysteresis_tracker={self.hysteresis_tracker!r}, "
                f"{self._config})")

    def tree(self) -> dict[str, Any]:
        """The arrays, as a dict (what ``mx.compile`` takes; a JAX scaler is a pytree itself).

        Example:
            >>> import unifiedamp as ua
            >>> s = ua.GradScaler(8.0, backend="mlx")
            >>> list(s.tree())  # doctest: +NORMALIZE_WHITESPACE
            ['loss_scale', 'growth_tracker', 'hysteresis_tracker', 'skipped_steps',
             'consecutive_skips', 'updates']
            >>> s.with_tree(s.tree()).get_scale()
            8.0
        """
        return {name: getattr(self, name) for name in LEAVES}

    def with_tree(self, tree: dict[str, Any]) -> Any:
        """This scaler's config with the arrays of ``tree`` (from :meth:`tree`)."""
        return self._make(self._config, *(tree[name] for name in LEAVES))

    # ------------------------------------------------------------ config and state

    @property
    def config(self) -> ScalerConfig:
        return self._config

    @property
    def state(self) -> ScalerState:
        """Scale and trackers as Python numbers (reads the device)."""
        return ScalerState(float(self.loss_scale.item()), int(self.growth_tracker.item()),
                           int(self.hysteresis_tracker.item()))

    def is_enabled(self) -> bool:
        return self._config.enabled

    def get_scale(self) -> Any:
        """The scale: a Python float (reads the device), or, while traced (inside
        ``jax.jit``, ``lax.scan``, ``shard_map``...), the float32 0-d array
        ``loss_scale``, which can be returned or logged from the traced function.
        1.0 when disabled, in both cases.

        Example:
            >>> import jax, unifiedamp as ua
            >>> s = ua.GradScaler(8.0, backend="jax")
            >>> s.get_scale(), jax.jit(lambda s: s.get_scale())(s)
            (8.0, Array(8., dtype=float32))
        """
        return self._host(self.loss_scale, float) if self._config.enabled else 1.0

    @property
    def num_skipped_steps(self) -> Any:
        """Updates whose gradients were not all finite: the steps ``where_finite`` (or
        ``step_if_finite``, ``apply``) skipped. An int, or the int32 array while traced.

        Example:
            >>> import unifiedamp as ua
            >>> s = ua.GradScaler(8.0, backend="jax").update(False).update(True).update(False)
            >>> s.num_skipped_steps, s.last_step_skipped, s.num_steps
            (2, True, 3)
        """
        return self._host(self.skipped_steps, int)

    @property
    def last_step_skipped(self) -> Any:
        """Whether the last update's gradients were not all finite (a bool, or a 0-d bool
        array while traced); ``consecutive_skips`` counts them in a row."""
        return self._host(self.consecutive_skips > 0, bool)

    @property
    def num_steps(self) -> Any:
        """Updates made (an int, or the int32 array while traced); ``update(new_scale=...)``
        and a disabled scaler count none."""
        return self._host(self.updates, int)

    def _reconfigure(self, config: ScalerConfig) -> Any:
        return self._make(config, *self._leaves())

    def with_config(self, **changes: Any) -> Any:
        """A scaler with the same state and some parameters changed (validated).

        Example:
            >>> import unifiedamp as ua
            >>> s = ua.GradScaler(8.0, backend="jax").with_config(growth_interval=5)
            >>> s.config.growth_interval, s.get_scale()
            (5, 8.0)
        """
        return self._reconfigure(self._config.replace(**changes))

    def state_dict(self) -> dict[str, Any]:
        """The canonical dict (reads the device)."""
        return spec.to_state_dict(self._config, self.state, self.backend)

    def restore(self, state_dict: dict[str, Any]) -> Any:
        """A new scaler from a canonical dict of any backend, or a native torch/paddle dict.

        The scaler is a value: this returns the loaded one and leaves ``self`` as it
        was, so write ``scaler = scaler.restore(d)``. ``enabled`` stays as ``self``
        was built. A bad dict raises ``ValueError``.

        Example:
            >>> import unifiedamp as ua
            >>> a = ua.GradScaler(8.0, backend="jax")
            >>> ua.GradScaler(backend="jax").restore(a.state_dict()).get_scale()
            8.0
        """
        config, state = spec.parse_state_dict(state_dict, base=self._config)
        # The skip counters are this run's, not the checkpoint's (as in torch).
        return self._make(config.replace(enabled=self._config.enabled), *self._arrays(state),
                          *self._leaves()[3:])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refused: torch's in-place habit would silently keep the old state here.

        Example:
            >>> import unifiedamp as ua
            >>> s = ua.GradScaler(backend="jax")
            >>> s.load_state_dict(s.state_dict())
            Traceback (most recent call last):
            ...
            TypeError: JaxGradScaler is an immutable value: load_state_dict() cannot change it ...
        """
        raise TypeError(
            f"{type(self).__name__} is an immutable value: load_state_dict() cannot change it "
            "in place, and a call whose result is not kept would silently resume from the old "
            "state. Write: scaler = scaler.restore(state_dict)")

    # ------------------------------------------------------------ the rule

    # How the rule multiplies and compares scales. It works on an "encoded" scale
    # whose order is the scale's order; by default the float32 array itself,
    # multiplied in float32 (JAX overrides all five to work on bit patterns).

    def _encode(self, scale: Any) -> Any:
        """The float32 scale array in the encoded form the rule compares and selects."""
        return scale

    def _decode(self, encoded: Any) -> Any:
        """The float32 scale array of an encoded scale."""
        return encoded

    def _constant(self, value: float) -> Any:
        """A float32 value (a bound), encoded."""
        return self._array(value, self.xp.float32)

    def _multiply(self, scale: Any, factor: float) -> Any:
        """``f32(scale * factor)`` for the float32 scale array, encoded."""
        return scale * self._constant(factor)

    def _is_finite(self, encoded: Any) -> Any:
        """Whether an encoded scale is finite."""
        return self.xp.isfinite(encoded)

    def update(self, finite: Any = None, *, new_scale: Any = None) -> Any:
        """The scaler after one iteration whose gradients were all ``finite`` (or not).

        Args:
            finite: One flag: the 0-d bool array ``unscale`` returns, a Python bool
                or a 0-d NumPy bool. Anything else (a string, a float, an array of
                flags) raises ``TypeError``/``ValueError`` rather than being read as
                true or reshaping the scaler's arrays; the check reads only static
                type, dtype and shape, so it costs nothing under jit.
            new_scale: Instead, a scaler whose scale is this host number (finite and
                > 0 in float32), trackers and counters kept, as torch's
                ``update(new_scale)``; not counted as an update.

        Example:
            >>> import unifiedamp as ua
            >>> ua.GradScaler(8.0, backend="jax").update(False).get_scale()
            4.0
        """
        config, xp = self._config, self.xp
        if new_scale is not None:
            if finite is not None:
                raise TypeError("update() takes a finite flag or new_scale, not both: "
                                "update(finite) applies the rule, update(new_scale=x) sets "
                                "the scale")
            if not config.enabled:
                return self
            value = self._array(new_scale_value(new_scale), xp.float32)
            return self._make(config, value, *self._leaves()[1:])
        if finite is None:
            raise TypeError("update() needs the flag unscale() returned: grads, finite = "
                            "scaler.unscale(grads); scaler = scaler.update(finite) (a "
                            "functional scaler records no checks of its own)")
        check_flag(finite)
        if not config.enabled:
            return self
        inf = xp.logical_not(self._array(finite, xp.bool_))
        skipped = (self.skipped_steps + inf.astype(xp.int32)).astype(xp.int32)
        in_a_row = xp.where(inf, self.consecutive_skips + 1, 0).astype(xp.int32)
        updates = (self.updates + 1).astype(xp.int32)
        if not config.dynamic:
            return self._make(config, self.loss_scale, xp.zeros_like(self.growth_tracker),
                              xp.zeros_like(self.hysteresis_tracker), skipped, in_a_row,
                              updates)
        hyst = xp.where(inf, self.hysteresis_tracker + 1, 0).astype(xp.int32)
        growth = xp.where(inf, 0, self.growth_tracker + 1).astype(xp.int32)
        back_off = inf & (hyst >= config.hysteresis)
        grow = xp.logical_not(inf) & (growth >= config.growth_interval)
        scale = self._encode(self.loss_scale)
        backed = self._multiply(self.loss_scale, spec.f32(config.backoff_factor))
        if config.min_scale is not None:
            backed = xp.maximum(backed, self._constant(spec.f32(config.min_scale)))
        grown = self._multiply(self.loss_scale, spec.f32(config.growth_factor))
        if config.max_scale is not None:
            grown = xp.minimum(grown, self._constant(spec.f32(config.max_scale)))
        grown = xp.where(self._is_finite(grown), grown, scale)  # an overflow keeps the scale
        new = xp.where(back_off, backed, xp.where(grow, grown, scale))
        return self._make(config, self._decode(new),
                          xp.where(grow, 0, growth).astype(xp.int32),
                          xp.where(back_off, 0, hyst).astype(xp.int32), skipped, in_a_row,
                          updates)


# ---------------------------------------------------------------- diagnostics
#
# Written once with ``xp`` for both functional backends; jax.py and mlx.py wrap each
# function with their tree functions and give it a docstring with a runnable example.


class LeafCounts(NamedTuple):
    """One gradient's overflow counts: what ``overflow_counts`` puts where the gradient was.

    Four arrays, so the record is a tree of arrays that ``jax.jit``, ``lax.cond``,
    ``mx.compile``, donation and checkpoints carry like any other output of a step.

    Attributes:
        inf: Elements that were +inf or -inf, an int32 0-d array (exact up to 2**31 - 1).
        nan: Elements that were NaN, an int32 0-d array.
        max_finite: The largest finite magnitude, a float32 0-d array (0 if there is none).
        shape: The gradient's shape, an int32 1-d array (a constant of the traced step).
    """

    inf: Any
    nan: Any
    max_finite: Any
    shape: Any


def leaf_counts(backend: type[FunctionalGradScaler], grad: Any) -> LeafCounts:
    """The :class:`LeafCounts` of one gradient array, traceable.

    The reductions are the backend's (:meth:`FunctionalGradScaler._overflow_reductions`);
    a leaf that is not a float (an integer, JAX's ``float0``) or is empty counts nothing.
    """
    xp = backend.xp
    shape = backend._array(list(grad.shape), xp.int32)
    if grad.size == 0 or not xp.issubdtype(grad.dtype, xp.inexact):
        return LeafCounts(backend._array(0, xp.int32), backend._array(0, xp.int32),
                          backend._array(0.0, xp.float32), shape)
    inf, nan, largest = backend._overflow_reductions(grad)
    return LeafCounts(inf.astype(xp.int32), nan.astype(xp.int32), largest.astype(xp.float32),
                      shape)


def _check_counts(named: list[tuple[str, Any]]) -> None:
    for name, record in named:
        if not isinstance(record, LeafCounts):
            raise TypeError(
                f"overflow_report(counts) takes the tree overflow_counts(grads) returns (a "
                f"LeafCounts where each gradient was), but {name or 'the tree'!r} is "
                f"{type(record).__name__}: return overflow_counts(grads) from the step and "
                "pass that")


def _host_int(value: Any, what: str) -> int:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int (or a 0-d integer array), got {value!r}")
    return int(value)


def _host_float(value: Any, what: str) -> float:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a float (or a 0-d float array), got {value!r}")
    return float(value)


def build_report(named: list[tuple[str, Any]], host: Any, *, step: Any, scale: Any,
                 loss_finite: bool | None, history: Any) -> OverflowReport | None:
    """The :class:`OverflowReport` of ``named`` ``(path, LeafCounts)`` pairs, read to the host
    with ``host`` (a tree of arrays -> the same tree of NumPy arrays, in one transfer).

    None when no gradient held inf/NaN. ``step``/``scale`` default to the last record of
    ``history`` (a :func:`history_init` ring), else to 0 and NaN (unknown).
    """
    _check_counts(named)
    records = host([record for _, record in named])
    overflows = []
    for (name, _), record in zip(named, records, strict=True):
        inf, nan = int(record.inf), int(record.nan)
        if inf or nan:
            shape = [int(n) for n in record.shape.reshape(-1).tolist()]
            overflows.append(GradientOverflow(name, shape, inf, nan, float(record.max_finite)))
    if not overflows:
        return None
    last_step, last_scale = 0, math.nan
    if history is not None:
        _check_history(history, "overflow_report(history=...)")
        ring = host(history)
        count = int(ring["count"])
        if count:
            slot = (count - 1) % len(ring["scale"])
            last_step, last_scale = int(ring["iteration"][slot]), float(ring["scale"][slot])
    step = last_step if step is None else _host_int(step, "overflow_report(step=...)")
    scale = last_scale if scale is None else _host_float(scale, "overflow_report(scale=...)")
    return OverflowReport(step, scale, overflows, checked=len(named), loss_finite=loss_finite)


def loss_is_finite(xp: Any, loss: Any) -> bool | None:
    """Whether ``loss`` (an array of the backend, or None) is all finite, on the host; a bool
    array is taken as the flag itself (``isfinite(loss)`` computed in the step)."""
    if loss is None or isinstance(loss, bool):
        return loss
    flag = xp.all(loss) if str(loss.dtype).rsplit(".", 1)[-1] == "bool" else xp.all(
        xp.isfinite(loss))
    return bool(flag.item())


#: The arrays of a history ring (:func:`history_init`).
HISTORY_KEYS = ("iteration", "scale", "skipped", "count")


def history_init(backend: type[FunctionalGradScaler], size: Any) -> dict[str, Any]:
    """An empty ring of ``size`` records: int32 ``iteration``, float32 ``scale``, bool
    ``skipped`` (each ``(size,)``) and the int32 0-d ``count`` of records written."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(f"history_init(size) takes the number of updates to keep, an int >= 1, "
                        f"got {size!r} of type {type(size).__name__}: e.g. history_init(1000)")
    if not 1 <= int(size) <= MAX_HISTORY:
        raise ValueError(f"history_init(size) takes the number of updates to keep, an int >= 1 "
                         f"and at most {MAX_HISTORY} (MAX_HISTORY), got {size}: e.g. "
                         "history_init(1000)")
    xp, n = backend.xp, int(size)
    # One buffer per array: a jitted step may donate them all.
    return {"iteration": xp.zeros((n,), xp.int32), "scale": xp.zeros((n,), xp.float32),
            "skipped": xp.zeros((n,), xp.bool_), "count": backend._array(0, xp.int32)}


def _check_history(history: Any, verb: str) -> None:
    # Static facts only (keys and shapes), so the check is free under tracing.
    hint = ("build it with history_init(size) and keep what history_record(history, scaler, "
            "finite) returns")
    if not isinstance(history, dict) or set(history) != set(HISTORY_KEYS):
        got = sorted(history) if isinstance(history, dict) else type(history).__name__
        raise TypeError(f"{verb} takes a history (a dict of {', '.join(HISTORY_KEYS)}), got "
                        f"{got}; {hint}")
    shapes = [tuple(getattr(history[k], "shape", (-1, -1))) for k in HISTORY_KEYS[:3]]
    if len(set(shapes)) != 1 or len(shapes[0]) != 1 or tuple(
            getattr(history["count"], "shape", (-1,))) != ():
        raise ValueError(f"{verb}: a history's iteration, scale and skipped are 1-d arrays of one "
                         f"length and count is 0-d, got shapes {shapes} and "
                         f"{getattr(history['count'], 'shape', None)}; {hint}")


def history_record(backend: type[FunctionalGradScaler], set_slot: Any, history: dict[str, Any],
                   scaler: Any, finite: Any) -> dict[str, Any]:
    """``history`` with one more record: iteration ``count + 1``, the scale of ``scaler``
    (before ``update(finite)``; 1.0 when disabled) and ``not finite``, in slot
    ``count % size``. ``set_slot(ring, slot, value)`` writes one element, traceably."""
    _check_history(history, "history_record")
    if not isinstance(scaler, backend):
        raise TypeError(f"history_record(history, scaler, finite) takes a {backend.__name__} "
                        f"(the scaler before update(finite)), got {type(scaler).__name__}")
    check_flag(finite)
    xp = backend.xp
    count = history["count"]
    slot = (count % history["scale"].shape[0]).astype(xp.int32)
    new_count = (count + 1).astype(xp.int32)
    scale = (backend._array(scaler.loss_scale, xp.float32) if scaler.config.enabled
             else backend._array(1.0, xp.float32))
    skipped = xp.logical_not(backend._array(finite, xp.bool_))
    return {"iteration": set_slot(history["iteration"], slot, new_count),
            "scale": set_slot(history["scale"], slot, scale),
            "skipped": set_slot(history["skipped"], slot, skipped),
            "count": new_count}


def scale_history(host: Any, history: dict[str, Any]) -> ScaleHistory:
    """The :class:`ScaleHistory` of a ring (read to the host with ``host``), oldest first."""
    _check_history(history, "scale_history")
    ring = host(history)
    return ScaleHistory.from_ring(ring["iteration"].tolist(), ring["scale"].tolist(),
                                  ring["skipped"].tolist(), int(ring["count"]))


def collapse_message(backend: type[FunctionalGradScaler], scaler: Any,
                     report: OverflowReport | None = None, *, step: Any = None,
                     max_consecutive_skips: int | None = 100) -> str | None:
    """The imperative backends' collapse message for a functional scaler's counters, or None.

    The same rule and wording as :class:`unifiedamp._monitor.CollapseMonitor` (its message is
    built by one), read from ``scaler.consecutive_skips`` and the scale; ``report`` ends it
    with ``"Last overflow: "`` + its summary and cause. ``step`` defaults to
    ``report.step``; when neither is known the message names no step.
    """
    if not isinstance(scaler, backend):
        raise TypeError(f"collapse_message(scaler, ...) takes a {backend.__name__}, got "
                        f"{type(scaler).__name__}")
    if report is not None and not isinstance(report, OverflowReport):
        raise TypeError(f"report must be an OverflowReport (what overflow_report returns) or "
                        f"None, got {type(report).__name__}")
    monitor = CollapseMonitor(max_consecutive_skips, on_collapse="raise")  # validates the limit
    scale, skips = scaler.get_scale(), scaler._host(scaler.consecutive_skips, int)
    if not isinstance(scale, float) or not isinstance(skips, int):
        raise TypeError("collapse_message reads the scaler's counters on the host: call it "
                        "outside jax.jit / mx.compile, with the scaler the step returned")
    if step is None and report is not None and report.step > 0:
        step = report.step
    step = None if step is None else _host_int(step, "step")

    def detail() -> str:
        if report is None:
            return ""
        return report.collapse_detail()

    try:
        monitor.report(-1 if step is None else step, scale, skips, detail)
    except ScaleCollapseError as exc:
        message = str(exc)
    else:
        return None
    if step is None:
        message = message.replace("Loss scale collapsed at step -1:", "Loss scale collapsed:", 1)
    return message


def check_collapse(backend: type[FunctionalGradScaler], scaler: Any,
                   report: OverflowReport | None = None, *, step: Any = None,
                   max_consecutive_skips: int | None = 100, on_collapse: str = "warn",
                   stacklevel: int = 3) -> str | None:
    """:func:`collapse_message`, warned (:class:`ScaleCollapseWarning`) or raised
    (:class:`ScaleCollapseError`); returns the message, or None when nothing collapsed."""
    if on_collapse not in ("warn", "raise"):
        raise ValueError(f"on_collapse must be 'warn' or 'raise', got {on_collapse!r}")
    message = collapse_message(backend, scaler, report, step=step,
                               max_consecutive_skips=max_consecutive_skips)
    if message is None:
        return None
    if on_collapse == "raise":
        raise ScaleCollapseError(message)
    warnings.warn(message, ScaleCollapseWarning, stacklevel=stacklevel)
    return message
