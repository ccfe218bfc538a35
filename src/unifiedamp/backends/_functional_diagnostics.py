"""The functional backends' diagnostics (JAX, MLX), written once with the array namespace.

Per-leaf overflow counts computed inside the traced step (:func:`leaf_counts`) and read into
an :class:`~unifiedamp.diagnostics.OverflowReport` outside it (:func:`build_report`), a ring
of (iteration, scale, skipped) kept in the user's train state (:func:`history_init`,
:func:`history_record`, :func:`scale_history`), and the collapse message the imperative
backends' monitor gives, read from a scaler's skip counters (:func:`collapse_message`).

:func:`public_functions` binds them to one backend: its scaler class, how it reads arrays to
the host, names the leaves of a tree and writes one slot of an array. It returns the six
public functions each backend module exports, with their docstrings and runnable examples
written here once in the backend's words (:class:`Words`).

Length: one module, because the six functions, their docstrings and the words they are
written in are bound to each backend together.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

from unifiedamp._monitor import CollapseMonitor
from unifiedamp._scaler import MAX_HISTORY, check_flag
from unifiedamp.backends._functional import FunctionalGradScaler
from unifiedamp.diagnostics import GradientOverflow, OverflowReport, ScaleHistory
from unifiedamp.errors import ScaleCollapseError, ScaleCollapseWarning


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

    None when no gradient held inf/NaN. ``step`` defaults to the last record of ``history``
    (a :func:`history_init` ring), ``scale`` to its ``scale_used``, else to 0 and NaN
    (unknown).
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
            last_step, last_scale = int(ring["iteration"][slot]), float(ring["scale_used"])
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
HISTORY_KEYS = ("iteration", "scale", "skipped", "count", "scale_used")


def history_init(backend: type[FunctionalGradScaler], size: Any) -> dict[str, Any]:
    """An empty ring of ``size`` records: int32 ``iteration``, float32 ``scale``, bool
    ``skipped`` (each ``(size,)``), the int32 0-d ``count`` of records written, and the
    float32 0-d ``scale_used``, the scale the last recorded update started from (what its
    report needs: the records hold the scale each update left)."""
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
            "skipped": xp.zeros((n,), xp.bool_), "count": backend._array(0, xp.int32),
            "scale_used": backend._array(0.0, xp.float32)}


def _check_history(history: Any, verb: str) -> None:
    # Static facts only (keys and shapes), so the check is free under tracing.
    hint = ("build it with history_init(size) and keep what history_record(history, scaler, "
            "finite) returns")
    if isinstance(history, dict) and set(history) == set(HISTORY_KEYS[:4]):
        raise TypeError(f"{verb}: this history ring was made by an earlier unifiedamp, whose "
                        "records hold the scale each update started from (they now hold the "
                        "scale it left, what get_scale() returns after it); start a new one "
                        "with history_init(size)")
    if not isinstance(history, dict) or set(history) != set(HISTORY_KEYS):
        got = sorted(history) if isinstance(history, dict) else type(history).__name__
        raise TypeError(f"{verb} takes a history (a dict of {', '.join(HISTORY_KEYS)}), got "
                        f"{got}; {hint}")
    shapes = [tuple(getattr(history[k], "shape", (-1, -1))) for k in HISTORY_KEYS[:3]]
    if len(set(shapes)) != 1 or len(shapes[0]) != 1 or any(
            tuple(getattr(history[k], "shape", (-1,))) != () for k in HISTORY_KEYS[3:]):
        scalars = [getattr(history[k], "shape", None) for k in HISTORY_KEYS[3:]]
        raise ValueError(f"{verb}: a history's iteration, scale and skipped are 1-d arrays of one "
                         f"length and count and scale_used are 0-d, got shapes {shapes} and "
                         f"{scalars}; {hint}")


def history_record(backend: type[FunctionalGradScaler], set_slot: Any, history: dict[str, Any],
                   scaler: Any, finite: Any) -> dict[str, Any]:
    """``history`` with one more record: iteration ``count + 1``, the scale
    ``scaler.update(finite)`` leaves (1.0 when disabled) and ``not finite``, in slot
    ``count % size``; ``scale_used``, the scale of ``scaler``. ``set_slot(ring, slot,
    value)`` writes one element, traceably."""
    _check_history(history, "history_record")
    if not isinstance(scaler, backend):
        raise TypeError(f"history_record(history, scaler, finite) takes a {backend.__name__} "
                        f"(the scaler before update(finite)), got {type(scaler).__name__}")
    check_flag(finite)
    xp = backend.xp
    count = history["count"]
    slot = (count % history["scale"].shape[0]).astype(xp.int32)
    new_count = (count + 1).astype(xp.int32)
    used = scale = backend._array(1.0, xp.float32)  # disabled: no scaling
    if scaler.config.enabled:  # the rule once more, on 3 scalars, as the caller's update()
        used = backend._array(scaler.loss_scale, xp.float32)
        # _updated: the caller updates this scaler next, which update() would then refuse.
        scale = backend._array(scaler._updated(finite, None).loss_scale, xp.float32)
    skipped = xp.logical_not(backend._array(finite, xp.bool_))
    return {"iteration": set_slot(history["iteration"], slot, new_count),
            "scale": set_slot(history["scale"], slot, scale),
            "skipped": set_slot(history["skipped"], slot, skipped),
            "count": new_count, "scale_used": used}


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


# ---------------------------------------------------------------- the public functions
#
# Their types, so that a type checker sees each backend's exact signatures, with the scaler
# parameter typed as that backend's class.

Scaler = TypeVar("Scaler", bound=FunctionalGradScaler, contravariant=True)


class OverflowReportFunction(Protocol):
    def __call__(self, counts: Any, *, step: Any = None, scale: Any = None, loss: Any = None,
                 history: Any = None) -> OverflowReport | None: ...


class HistoryInitFunction(Protocol):
    def __call__(self, size: int) -> dict[str, Any]: ...


class HistoryRecordFunction(Protocol[Scaler]):
    def __call__(self, history: dict[str, Any], scaler: Scaler,
                 finite: Any) -> dict[str, Any]: ...


class ScaleHistoryFunction(Protocol):
    def __call__(self, history: dict[str, Any]) -> ScaleHistory: ...


class CollapseMessageFunction(Protocol[Scaler]):
    def __call__(self, scaler: Scaler, report: OverflowReport | None = None, *,
                 step: Any = None, max_consecutive_skips: int | None = 100) -> str | None: ...


class CheckCollapseFunction(Protocol[Scaler]):
    def __call__(self, scaler: Scaler, report: OverflowReport | None = None, *,
                 step: Any = None, max_consecutive_skips: int | None = 100,
                 on_collapse: str = "warn") -> str | None: ...


class Words(NamedTuple):
    """What the six functions' docstrings say differently per backend."""

    #: Where the host functions are called: "outside ``jit``".
    outside: str
    #: How a report names the leaves (a sentence).
    naming: str
    #: What a history is kept in (after "to").
    keep: str
    #: How a history is recorded without a host read.
    traced: str
    #: The examples' import of the array module and its alias: ("jax.numpy", "jnp").
    module: str
    alias: str
    #: How an int32 dtype prints in the examples: "'int32'".
    int32: str
    float32: str
    bool_: str


_OVERFLOW_REPORT = """The :class:`~unifiedamp.diagnostics.OverflowReport` of
:func:`overflow_counts`'s tree, {outside} (it reads the counts to the host once); None
when no gradient held inf/NaN.

{naming} ``checked`` is the number of leaves.

Args:
    counts: What :func:`overflow_counts` returned from the step.
    step: The update's number (from 1). Default: the last record of ``history``, else 0
        (unknown).
    scale: The scale the loss was multiplied by (the scaler's before ``update``):
        return ``scaler.loss_scale`` from the step, or pass ``history``. Default: the
        ``scale_used`` of ``history``, else NaN (unknown).
    loss: The unscaled loss (an array or a number) returned from the step, or a bool
        (``{alias}.isfinite(loss)``): sets ``loss_finite``; None leaves it unknown.
    history: A :func:`history_init` ring that recorded this step last.

Example:
    >>> import {module} as {alias}
    >>> inf, nan = float("inf"), float("nan")
    >>> grads = {{"b": {alias}.zeros(2), "w": {alias}.array([[1.0, -inf], [nan, -4.0]])}}
    >>> report = overflow_report(overflow_counts(grads), step=3, scale=1024.0, loss=2.5)
    >>> report.names, report.overflows[0], report.checked, report.loss_finite
    (['w'], GradientOverflow('w', shape=(2, 2), inf=1, nan=1, max_finite=4.0), 2, True)
    >>> overflow_report(overflow_counts({{"w": {alias}.ones(3)}})) is None
    True
"""

_HISTORY_INIT = """An empty ring of the last ``size`` updates, to {keep}: a dict of ``iteration``
(int32), ``scale`` (float32: the scale each update left), ``skipped`` (bool), each
``(size,)``, ``count`` (int32 0-d, records written) and ``scale_used`` (float32 0-d, the scale
the last recorded update started from, for its report), one buffer each.

Raises:
    TypeError: ``size`` is not an int (a bool neither).
    ValueError: ``size`` is below 1, or above ``unifiedamp.MAX_HISTORY``.

Example:
    >>> sorted((k, v.shape, str(v.dtype)) for k, v in history_init(4).items())
    [('count', (), {int32}), ('iteration', (4,), {int32}), ('scale', (4,), {float32}),
     ('scale_used', (), {float32}), ('skipped', (4,), {bool_})]
"""

_HISTORY_RECORD = """``history`` with this update recorded, {traced}: iteration
``count + 1``, the scale ``scaler.update(finite)`` leaves (what ``get_scale()`` returns
after the update; 1.0 when disabled) and whether the step was skipped (``not finite``), in
slot ``count % size``.

Call it with the scaler the step started with, next to ``update``::

    history = history_record(history, scaler, finite)
    scaler = scaler.update(finite)

Example:
    >>> scaler, history = {scaler}(8.0, growth_interval=1), history_init(2)
    >>> for finite in [True, False, True]:  # 8 -> 16, backed off to 8, -> 16
    ...     history = history_record(history, scaler, finite)
    ...     scaler = scaler.update(finite)
    >>> scale_history(history).as_list()     # the last 2 of 3: iterations 2 and 3
    [(2, 8.0, True), (3, 16.0, False)]
"""

_SCALE_HISTORY = """The ring as a :class:`~unifiedamp.diagnostics.ScaleHistory`, oldest record
first (reads it to the host: call it {outside}, when you log or plot).

Example:
    >>> scale_history(history_init(3)).as_list()
    []
"""

_COLLAPSE_MESSAGE = """The collapse warning's text for this scaler, or None: the imperative
backends' message (same rule, same words), read from ``consecutive_skips`` and the scale.

A collapse is ``max_consecutive_skips`` skipped steps in a row (None: not checked) or a
scale below float32's smallest normal number. ``report`` (:func:`overflow_report` of
the last skipped step) ends the message with ``"Last overflow: "``, its summary and
whether the loss itself was inf/NaN (then the fixes: lower learning rate, bfloat16,
clipping). ``step`` names the step (default ``report.step``). Reads the scaler's counters:
call it {outside}, e.g. where you log. :func:`check_collapse` warns with it.

Example:
    >>> scaler = {scaler}(8.0).update(False).update(False)
    >>> print(collapse_message(scaler, step=2, max_consecutive_skips=2))
    Loss scale collapsed at step 2: scale 2.0 (0x40000000); the gradients were inf/NaN at
    each of the last 2 steps, ...
    >>> collapse_message(scaler.update(True), max_consecutive_skips=2) is None
    True
"""

_CHECK_COLLAPSE = """Warns :class:`unifiedamp.ScaleCollapseWarning` (or raises
:class:`unifiedamp.ScaleCollapseError` with ``on_collapse="raise"``) with
:func:`collapse_message` when the scale collapsed; returns the message, or None.

Stateless: it warns at every call that finds a collapse, so call it where you log
(every N steps), with the scaler the step returned.

Example:
    >>> import warnings
    >>> scaler = {scaler}(8.0).update(False).update(False)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = check_collapse(scaler, max_consecutive_skips=2)
    >>> caught[0].category.__name__, str(caught[0].message)[:22]
    ('ScaleCollapseWarning', 'Loss scale collapsed: ')
    >>> check_collapse(scaler, max_consecutive_skips=2, on_collapse="raise")
    Traceback (most recent call last):
    ...
    unifiedamp.errors.ScaleCollapseError: Loss scale collapsed: scale 2.0 ...
"""


def public_functions(
        backend: type[Scaler], *, module: str, words: Words, host: Callable[[Any], Any],
        named_counts: Callable[[Any], list[tuple[str, Any]]], asarray: Callable[[Any], Any],
        set_slot: Callable[[Any, Any, Any], Any],
) -> tuple[OverflowReportFunction, HistoryInitFunction, HistoryRecordFunction[Scaler],
           ScaleHistoryFunction, CollapseMessageFunction[Scaler], CheckCollapseFunction[Scaler]]:
    """``overflow_report, history_init, history_record, scale_history, collapse_message,
    check_collapse`` of one backend, as its module ``module`` exports them.

    Args:
        backend: The backend's scaler class.
        module: The public module (the functions' ``__module__``, where doctest finds them).
        words: The docstrings' backend-specific words.
        host: A tree of arrays -> the same tree of NumPy arrays, read in one transfer.
        named_counts: :func:`overflow_counts`'s tree -> ``(dotted name, LeafCounts)`` pairs,
            in tree order.
        asarray: A loss (a number or an array) -> an array of the backend.
        set_slot: ``(ring, slot, value) -> ring`` with ``ring[slot] = value``, traceably.
    """

    def overflow_report(counts: Any, *, step: Any = None, scale: Any = None, loss: Any = None,
                        history: Any = None) -> OverflowReport | None:
        if loss is not None and not isinstance(loss, bool):
            loss = asarray(loss)
        return build_report(named_counts(counts), host, step=step, scale=scale,
                            loss_finite=loss_is_finite(backend.xp, loss), history=history)

    def history_init_(size: int) -> dict[str, Any]:
        return history_init(backend, size)

    def history_record_(history: dict[str, Any], scaler: Scaler,
                        finite: Any) -> dict[str, Any]:
        return history_record(backend, set_slot, history, scaler, finite)

    def scale_history_(history: dict[str, Any]) -> ScaleHistory:
        return scale_history(host, history)

    def collapse_message_(scaler: Scaler, report: OverflowReport | None = None, *,
                          step: Any = None, max_consecutive_skips: int | None = 100
                          ) -> str | None:
        return collapse_message(backend, scaler, report, step=step,
                                max_consecutive_skips=max_consecutive_skips)

    def check_collapse_(scaler: Scaler, report: OverflowReport | None = None, *,
                        step: Any = None, max_consecutive_skips: int | None = 100,
                        on_collapse: str = "warn") -> str | None:
        # stacklevel 3: the warning names the caller of this function.
        return check_collapse(backend, scaler, report, step=step,
                              max_consecutive_skips=max_consecutive_skips,
                              on_collapse=on_collapse, stacklevel=3)

    fill = {**words._asdict(), "scaler": backend.__name__}
    functions = ((overflow_report, _OVERFLOW_REPORT), (history_init_, _HISTORY_INIT),
                 (history_record_, _HISTORY_RECORD), (scale_history_, _SCALE_HISTORY),
                 (collapse_message_, _COLLAPSE_MESSAGE), (check_collapse_, _CHECK_COLLAPSE))
    for function, doc in functions:
        name = function.__name__.rstrip("_")
        function.__name__ = function.__qualname__ = name
        function.__module__ = module
        function.__doc__ = doc.format(**fill)
        if "scaler" in function.__annotations__:  # what help() shows: the class, not Scaler
            function.__annotations__["scaler"] = backend.__name__
    return (overflow_report, history_init_, history_record_, scale_history_,
            collapse_message_, check_collapse_)
