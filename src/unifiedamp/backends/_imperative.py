"""What the imperative backends share (numpy, paddle; torch and keras use some of it).

An imperative scaler changes itself: ``update()`` applies the rule to its own state, after
``unscale_``/``step`` have checked an iteration's gradients. Here, written once:

- the arguments of ``update()`` (:func:`update_arguments`) and the error of a
  ``load_state_dict`` between an iteration's checks and its update
  (:func:`mid_iteration_load_error`);
- the options ``diagnose`` and ``history`` (:func:`diagnostics_options`) and the pairs
  ``watch()`` takes (:func:`watched_pairs`);
- the counters and the config and state of a scaler that decides on the host
  (:class:`HostCounters`, :class:`HostState`);
- the diagnostics: :class:`WatchedNames` (``watch`` and the names it gives, torch's too),
  :class:`ImperativeDiagnostics` (with ``overflow_report``, ``history`` and the collapse
  warning's detail, for the scalers that decide on the host), the skipped update it keeps
  (:class:`LastUpdate`) and the note of its report (:func:`report_note`).

The facade's own helpers (what a flag and a ``new_scale`` are, ``MAX_HISTORY``) stay in
``unifiedamp._scaler``: the functional backends use them too.

Length: the diagnostics mixin is half of it, with the examples its members show for every
imperative backend; the helpers before it are what the mixin and the backends' ``update()``
call. Split, a reader would follow one skipped update (``LastUpdate``, ``report_note``,
the mixin) across modules.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from unifiedamp import spec
from unifiedamp._scaler import MAX_HISTORY, check_flag, is_flag
from unifiedamp.diagnostics import OverflowReport, ScaleHistory
from unifiedamp.spec import ScalerConfig, ScalerState, unscale_overflows


def scale_before_skip(config: ScalerConfig, after: float, hysteresis_after: int
                      ) -> tuple[float, bool]:
    """The scale a skipped update started from, from the state it left: ``(scale, exact)``.

    After an inf the spec multiplies the scale by ``f32(backoff_factor)`` when the
    hysteresis tracker reaches ``hysteresis`` (the tracker is then 0; it is >= 1 when it
    held) and clamps at ``min_scale``. The product is inverted in float32; it is exact
    when one float32 maps to ``after`` (always for a power-of-two backoff such as 0.5),
    and not at the ``min_scale`` clamp. Used when no history ring holds the value and
    ``diagnose`` did not read it before the update.

    Example:
        >>> scale_before_skip(ScalerConfig(), 32768.0, 0)
        (65536.0, True)
        >>> scale_before_skip(ScalerConfig(hysteresis=2), 1024.0, 1)  # held: no backoff
        (1024.0, True)
    """
    if not config.dynamic or (config.hysteresis > 1 and hysteresis_after != 0):
        return after, True
    backoff = spec.f32(config.backoff_factor)
    guess = np.float32(spec.f32(after / backoff))
    if config.min_scale is not None and after == spec.f32(config.min_scale):
        return float(guess), False  # anything from min_scale to min_scale / backoff
    nearby = [guess]
    for direction in (-np.inf, np.inf):
        x = guess
        for _ in range(2):
            x = np.nextafter(x, np.float32(direction))
            nearby.append(x)
    # A float32 product of float32 values, rounded once: as the update computes it.
    sources = {float(x) for x in nearby if spec.f32(float(x) * backoff) == after}
    return (sources.pop(), True) if len(sources) == 1 else (float(guess), False)


class Flags(NamedTuple):
    """The flags a backend's ``update`` takes, for :func:`update_arguments`: their types,
    and the words of the error for another framework's flag."""

    types: tuple[type, ...]
    backend: str  # "torch"
    takes: str  # "(a 0-d bool tensor) or a bool"
    convert: str  # "torch.as_tensor"


def update_arguments(finite: Any, new_scale: Any,
                     flags: Flags | None = None) -> tuple[Any, Any]:
    """``(finite, new_scale)`` of an imperative ``update(finite=None, *, new_scale=None)``.

    A flag (a bool, or a 0-d bool array/tensor: what ``unscale`` returns) is checked
    (:func:`~unifiedamp._scaler.check_flag`), and refused unless it is one of ``flags``'s
    types (another framework's bool tensor). A plain number as the first argument is
    torch's positional ``update(new_scale)``, as torch documents it. Anything else first (a
    float or int tensor/array, a list) is refused: taken as a scale, ``update(f.float())``
    would set the scale to 1.0 and count no step; a tensor scale goes by keyword.

    Example:
        >>> update_arguments(True, None), update_arguments(1024.0, None)
        ((True, None), (None, 1024.0))
        >>> update_arguments([True, False], None)
        Traceback (most recent call last):
        ...
        TypeError: update() got list [True, False] as its flag: ... pass new_scale=... by ...
        >>> update_arguments(1024.0, 8.0)
        Traceback (most recent call last):
        ...
        TypeError: update() got new_scale twice (1024.0 and 8.0): pass it once
    """
    if finite is None:
        return finite, new_scale
    if is_flag(finite):
        check_flag(finite)
        if flags is not None and not isinstance(finite, flags.types):
            raise TypeError(
                f"update() got a {type(finite).__name__} flag ({finite!r:.80}): the "
                f"{flags.backend} backend takes the flag its unscale() returns {flags.takes}; "
                f"convert it with {flags.convert}, or use the backend of its framework")
        return finite, new_scale
    if not isinstance(finite, numbers.Real):
        raise TypeError(
            f"update() got {type(finite).__name__} {finite!r:.80} as its flag: the flag is a "
            "bool or the 0-d bool array/tensor unscale() returns (all_finite(grads) too); to "
            "set the scale, pass new_scale=... by keyword (or a plain number first, as in "
            "torch)")
    if new_scale is not None:
        raise TypeError(f"update() got new_scale twice ({finite!r} and {new_scale!r}): pass "
                        "it once")
    return None, finite


def mid_iteration_load_error() -> RuntimeError:
    """What an imperative backend's ``load_state_dict`` raises between an iteration's
    checks (``unscale_``/``step``) and its ``update()``, before changing anything."""
    return RuntimeError(
        "load_state_dict() was called between step()/unscale_() and update(): update() would "
        "apply this iteration's inf checks to the loaded state. Call update() first, or load "
        "before the iteration's first unscale_()/step(); nothing was loaded")


def diagnostics_options(diagnose: Any, history: Any) -> int:
    """Checks the imperative backends' ``diagnose`` and ``history`` options; the ring size.

    Example:
        >>> diagnostics_options(True, 1024)
        1024
        >>> diagnostics_options(False, -1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: history must be an int >= 0 (...), got -1: pass e.g. history=1000
    """
    if not isinstance(diagnose, bool):
        raise TypeError(f"diagnose must be True or False, got {diagnose!r}: pass diagnose=True "
                        "to keep the overflow report of each skipped step (computed only then)")
    is_int = isinstance(history, numbers.Integral) and not isinstance(history, bool)
    if not is_int or not 0 <= int(history) <= MAX_HISTORY:
        raise (ValueError if is_int else TypeError)(
            f"history must be an int >= 0 (the number of updates the ring keeps; 0 keeps "
            f"none) and at most {MAX_HISTORY} (MAX_HISTORY), got {history!r}: pass e.g. "
            "history=1000")
    return int(history)


def watched_pairs(model: Any, is_parameter: Any, what: str) -> list[tuple[str, Any]]:
    """The ``(name, parameter)`` pairs ``watch(model)`` takes: from ``named_parameters()``,
    a dict ``name -> parameter`` or an iterable of pairs; every one checked (a str name,
    ``is_parameter(parameter)``) before any is returned. ``what`` names the parameter type
    in errors.

    Example:
        >>> watched_pairs({"w": 1.0}, lambda p: isinstance(p, float), "float")
        [('w', 1.0)]
        >>> watched_pairs([("w", "x")], lambda p: isinstance(p, float), "float")
        Traceback (most recent call last):
        ...
        TypeError: watch(): item 0 must be a (name, float) pair with a str name, got ('w', 'x')
    """
    items = model.named_parameters() if hasattr(model, "named_parameters") else model
    if isinstance(items, dict):
        items = items.items()
    try:
        pairs = list(items)
    except TypeError:
        raise TypeError(f"watch() takes a model (named_parameters()), a dict name -> {what} or "
                        f"an iterable of (name, {what}) pairs, got {type(model).__name__}"
                        ) from None
    for k, item in enumerate(pairs):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and is_parameter(item[1])):
            raise TypeError(f"watch(): item {k} must be a (name, {what}) pair with a str name, "
                            f"got {item!r:.80}")
    return pairs


class HostCounters:
    """The update counters of the imperative scalers that decide on the host (numpy,
    paddle, and keras's ``update(finite)`` without ``wrap``): ``_count(found_inf)`` once
    per update made.

    Example:
        >>> counters = HostCounters()
        >>> counters._count(True); counters._count(False)
        >>> counters.num_steps, counters.num_skipped_steps, counters.last_step_skipped
        (2, 1, False)
    """

    _updates = 0
    _skipped = 0
    _last_skipped = False

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last update's gradients were not all finite (its step skipped)."""
        return self._last_skipped

    @property
    def num_skipped_steps(self) -> int:
        """Updates whose gradients were not all finite."""
        return self._skipped

    @property
    def num_steps(self) -> int:
        """Updates made (``update(new_scale=...)`` and a disabled scaler count none)."""
        return self._updates

    def _count(self, found_inf: bool) -> None:
        self._updates += 1
        self._skipped += int(found_inf)
        self._last_skipped = found_inf

    def _counters(self) -> dict[str, Any]:
        """The counters by attribute name, for a copy's state (``_restore_counters``)."""
        return {"_updates": self._updates, "_skipped": self._skipped,
                "_last_skipped": self._last_skipped}

    def _restore_counters(self, saved: Mapping[str, Any]) -> None:
        self._updates = saved.get("_updates", 0)
        self._skipped = saved.get("_skipped", 0)
        self._last_skipped = saved.get("_last_skipped", False)


class HostState(HostCounters):
    """The members of a scaler that keeps its config (``_config``) and state (``_state``,
    a :class:`~unifiedamp.spec.ScalerState`) on the host, with its counters.

    Example:
        >>> import unifiedamp as ua
        >>> scaler = ua.GradScaler(8.0, enabled=False, backend="numpy")
        >>> scaler.get_scale(), scaler.state.scale, scaler.is_enabled()
        (1.0, 8.0, False)
    """

    _config: ScalerConfig
    _state: ScalerState

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._state}, {self._config})"

    @property
    def config(self) -> ScalerConfig:
        """The validated configuration."""
        return self._config

    @property
    def state(self) -> ScalerState:
        """The scale and both trackers, as Python numbers."""
        return self._state

    def is_enabled(self) -> bool:
        """Whether the scaler scales at all (``enabled=False``: every verb passes through)."""
        return self._config.enabled

    def get_scale(self) -> float:
        """The current scale; 1.0 when disabled, as in torch."""
        return self._state.scale if self._config.enabled else 1.0


class LastUpdate:
    """An update that skipped (or may have: ``found`` a flag still on the device), kept
    until the next update for ``overflow_report()``: the optimizers it checked, the
    ``scale()`` input, and the report once computed.

    Attributes:
        step, scale: The update (counted from 1) and the scale it started from.
        optimizers: The optimizers checked in that iteration (their gradients are read
            when the report is computed).
        loss: The one array/tensor given to ``scale()`` that iteration, else None.
        functional_only: Only the functional ``unscale(grads)`` found the inf/NaN.
        distributed: ``found_inf`` was agreed across ranks.
        prechecked: Backend-specific counts taken before a kernel changed the gradients
            (paddle on CPU): optimizer id -> parameter index -> counts.
        found: True, or the update's found_inf flag as the backend holds it (a device
            tensor), read on the host only when the report is asked for.
        report: The :class:`OverflowReport`, once computed.
    """

    def __init__(self, step: int, scale: float, optimizers: list[Any], loss: Any,
                 functional_only: bool, distributed: bool = False,
                 prechecked: dict[int, dict[int, tuple[Any, ...]]] | None = None,
                 found: Any = True):
        self.step = step
        self.scale = scale
        self.optimizers = optimizers
        self.loss = loss
        self.functional_only = functional_only
        self.distributed = distributed
        self.prechecked = prechecked or {}
        self.found = found
        self.report: Any = None

    def detached(self, report: Any) -> LastUpdate:
        """A copy that keeps ``report`` and none of the objects the update refers to
        (what a pickled or deep-copied scaler carries)."""
        last = LastUpdate(self.step, self.scale, [], None, self.functional_only,
                          self.distributed)
        last.report = report
        return last


def report_note(last: LastUpdate, named: bool, checked: int, at_update: bool, *,
                items: str, clear: str, zeroed: str = "", changed: str = "") -> str:
    """What a report's list alone does not say: why it names no gradient, why it names
    them all, or why its counts are not the gradients' (``zeroed``: the backend's words
    when a kernel changed them). ``items``: what the functional unscale takes ("arrays",
    "tensors"); ``clear``: the verb that clears gradients; ``changed``: how they change.

    Example:
        >>> last = LastUpdate(3, 1024.0, [], None, functional_only=True)
        >>> report_note(last, False, 0, True, items="arrays", clear="zero_grad")[:40]
        'The inf/NaN was found by the functional '
    """
    if unscale_overflows(last.scale):
        return (f"The scale {last.scale:g} is so small that 1/scale overflows float32: every "
                "check finds inf and every unscaled gradient is inf/NaN, whatever the "
                "gradients were (set min_scale to keep a floor).")
    if zeroed:
        return zeroed
    if named:
        return ""
    if last.functional_only:
        return (f"The inf/NaN was found by the functional unscale(grads), whose {items} the "
                "report does not see.")
    if last.distributed:
        return "found_inf is agreed across ranks: another rank's gradients held the inf/NaN."
    if at_update:
        return ""
    if not checked:
        return (f"The gradients were cleared ({clear}) before overflow_report() was called: "
                "build the scaler with diagnose=True to keep the report of each skipped step.")
    return (f"No gradient holds inf/NaN any more: they changed after the skipped update"
            f"{changed}. Build the scaler with diagnose=True to keep the report of each "
            "skipped step.")


class WatchedNames:
    """``watch()`` and the names it gives the gradients of a report.

    Hooks: ``_parameter_type`` and ``_parameter_kind``, what ``watch()`` takes and its name
    in errors; ``_watch_weakly``, hold the parameters by weak reference (torch: watching
    keeps nothing alive). The scaler sets ``_watched = {}`` in ``__init__``.
    """

    _parameter_type: Any = object
    _parameter_kind = "parameter"
    _watch_weakly = False
    #: watch()'s names: id(parameter) -> (name, the parameter or a weak reference to it).
    _watched: dict[int, tuple[str, Any]]

    def watch(self, model: Any) -> None:
        """Names the parameters in :meth:`overflow_report`.

        ``model`` is an object with ``named_parameters()`` (a ``torch.nn.Module``, DDP, a
        ``paddle.nn.Layer``), a dict ``name -> parameter`` or an iterable of ``(name,
        parameter)`` pairs; the parameters are matched to the optimizer's by identity (the
        same objects, not copies or views; torch holds them weakly: watching keeps nothing
        alive). Calls add up (a later name for the same parameter wins); every pair is
        checked before any is kept. A copy of the scaler (``copy.deepcopy``, pickle)
        forgets the names: watch again. Unwatched parameters are named by their place in
        the optimizer: ``params[i]`` on NumPy, ``param_groups[g][i]`` on torch and Paddle,
        with ``optimizers[k].`` in front when several optimizers were checked.

        Example:
            >>> import numpy as np
            >>> from unifiedamp.backends.numpy import NumpyGradScaler, SGD
            >>> w, b = np.ones(2, np.float32), np.zeros(1, np.float32)
            >>> scaler, opt = NumpyGradScaler(8.0), SGD([w, b])
            >>> scaler.watch({"w": w, "b": b})
            >>> opt.grads = [np.array([np.inf, 8], np.float32), np.zeros(1, np.float32)]
            >>> scaler.step(opt); _ = scaler.update()
            >>> scaler.overflow_report().names
            ['w']
        """
        pairs = watched_pairs(model, lambda p: isinstance(p, self._parameter_type),
                              self._parameter_kind)
        if self._watch_weakly:
            self._watched = {key: entry for key, entry in self._watched.items()
                             if entry[1]() is not None}
            self._watched.update((id(p), (name, weakref.ref(p))) for name, p in pairs)
        else:
            self._watched.update((id(p), (name, p)) for name, p in pairs)

    def _gradient_name(self, param: Any, fallback: str, k: int, several: bool) -> str:
        """``watch()``'s name of ``param``, else ``fallback`` (its place in optimizer
        ``k``, prefixed with ``optimizers[k].`` when ``several`` were checked)."""
        entry = self._watched.get(id(param))
        if entry is not None:
            held = entry[1]() if self._watch_weakly else entry[1]
            if held is param:
                return entry[0]
        return f"optimizers[{k}].{fallback}" if several else fallback


class ImperativeDiagnostics(WatchedNames):
    """``watch``, ``overflow_report`` and ``history`` of an imperative scaler that decides
    on the host (numpy, paddle), and the collapse warning's detail, written once.

    A backend calls :meth:`_init_diagnostics` in ``__init__``; in ``update()``,
    :meth:`_record` (every update) and :meth:`_remember_update` (with the
    :class:`LastUpdate` of a skip, or None); it notes the optimizers it checks in
    ``_checked`` and the single input of ``scale()`` in ``_scale_input``, and clears both
    with :meth:`_forget_iteration`. Its hooks, besides :class:`WatchedNames`':

    - ``_compute_report(last, at_update)``: the report of a skipped update from the
      gradients of ``last.optimizers`` as they are now (``at_update``: inside the update).
    - ``_to_ring(values)``, ``_from_ring(stored)``: where the ring's scales and skip flags
      live (default: host arrays; a backend may keep them on its device).
    - ``_found_on_host(found)``: reads ``LastUpdate.found`` (default: ``bool``).

    The ring's iterations are counted on the host (``_updates``, from the counters).
    """

    _updates: int

    # What the diagnostics hold, set by _init_diagnostics.
    #: diagnose=True: the report of a skipped update is computed inside it.
    _diagnose: bool
    #: The optimizers checked since the last update: id -> optimizer.
    _checked: dict[int, Any]
    #: The single array/tensor (or float) given to scale() this iteration, for loss_finite.
    _scale_input: Any
    #: The last update, if it skipped (or may have, on a device flag).
    _last: LastUpdate | None
    #: The history ring: record k (from 0) is in slot k % size; _ring_count written so far.
    _ring_iterations: np.ndarray
    _ring_scales: Any
    _ring_skipped: Any
    _ring_count: int

    def _init_diagnostics(self, diagnose: bool, history_size: int) -> None:
        """Sets every diagnostics attribute of a new scaler (``diagnostics_options`` has
        checked the options)."""
        self._diagnose = diagnose
        self._watched = {}
        self._checked = {}
        self._scale_input = None
        self._last = None
        self._ring_iterations = np.zeros(history_size, np.int64)
        self._ring_scales = self._to_ring(np.zeros(history_size, np.float32))
        self._ring_skipped = self._to_ring(np.zeros(history_size, bool))
        self._ring_count = 0

    # ------------------------------------------------------------ backend hooks

    def _compute_report(self, last: LastUpdate, at_update: bool) -> OverflowReport:
        raise NotImplementedError

    def _to_ring(self, values: np.ndarray) -> Any:
        return values

    def _from_ring(self, stored: Any) -> np.ndarray:
        return np.asarray(stored)

    def _found_on_host(self, found: Any) -> bool:
        return bool(found)

    # ------------------------------------------------------------ the members

    def overflow_report(self) -> OverflowReport | None:
        """Which gradients held inf/NaN at the last update, if it skipped; else None
        (also after a manual ``update(new_scale)`` and on a disabled scaler).

        With ``diagnose=True`` the report was computed during that ``update()``. Without,
        it is computed now (once, then kept), from the gradients of the optimizers checked
        in that iteration as they are now: once they are cleared (``zero_grad()``,
        ``clear_grad()``) the report lists none and says so, and its note says where a
        kernel changed them. ``max_finite`` is of the unscaled gradient. ``loss_finite``
        is whether the one array or tensor given to ``scale()`` that iteration was finite
        (None when ``scale()`` got a container or was not called).

        Example:
            >>> import numpy as np
            >>> from unifiedamp.backends.numpy import NumpyGradScaler, SGD
            >>> scaler, opt = NumpyGradScaler(4.0), SGD([np.ones(3, np.float32)])
            >>> loss = scaler.scale(np.float32(0.5))
            >>> opt.grads = [np.array([8.0, np.nan, -np.inf], np.float32)]
            >>> scaler.step(opt); _ = scaler.update()
            >>> print(scaler.overflow_report())  # doctest: +NORMALIZE_WHITESPACE
            Step 1 was skipped at scale 4: 1 of 1 gradients held inf/NaN.
              params[0] (3,): 1 inf, 1 NaN, largest finite |g| 2
            The loss was finite before scaling: the scaled gradients overflowed float16 and
            the scaler backs off, as designed.
        """
        return self._report_of_last(at_update=False)

    def _report_of_last(self, at_update: bool) -> OverflowReport | None:
        last = self._last
        if last is None:
            return None
        if last.report is None:
            if not self._found_on_host(last.found):
                self._last = None  # it did not skip: nothing to report
                return None
            last.report = self._compute_report(last, at_update)
        return last.report

    def history(self) -> ScaleHistory:
        """The last ``history`` updates (oldest first): iteration (counted from 1), the scale
        that update left (what :meth:`get_scale` returns after it), and whether it skipped.
        A manual ``update(new_scale)`` is not recorded.

        Raises:
            ValueError: The scaler was built with ``history=0`` (the default).

        Example:
            >>> import numpy as np
            >>> from unifiedamp.backends.numpy import NumpyGradScaler, SGD
            >>> scaler, opt = NumpyGradScaler(4.0, history=2), SGD([np.ones(1, np.float32)])
            >>> for g in (1.0, np.inf, 1.0):
            ...     opt.grads = [np.array([g], np.float32)]
            ...     scaler.step(opt); _ = scaler.update()
            >>> scaler.history().as_list()  # 4 -> 4, backed off to 2, -> 2 (no growth yet)
            [(2, 2.0, True), (3, 2.0, False)]
        """
        if not len(self._ring_iterations):
            raise ValueError("this scaler keeps no history (history=0): build it with "
                             "history=N (e.g. history=1000) to keep the last N updates")
        return ScaleHistory.from_ring(self._ring_iterations, self._from_ring(self._ring_scales),
                                      self._from_ring(self._ring_skipped), self._ring_count)

    def _record(self, scale: float, skipped: bool) -> None:
        """Writes update ``_updates`` (``scale``: the scale it left) into the ring, if there
        is one."""
        size = len(self._ring_iterations)
        if size:
            slot = self._ring_count % size
            self._ring_iterations[slot] = self._updates
            self._ring_scales[slot] = scale
            self._ring_skipped[slot] = skipped
            self._ring_count += 1

    def _remember_update(self, last: LastUpdate | None) -> None:
        """Keeps ``last`` (the update just made, if it skipped) for :meth:`overflow_report`;
        with ``diagnose=True`` its report is computed now, while its gradients are there."""
        self._last = last
        if self._diagnose:
            self._report_of_last(at_update=True)

    def _forget_iteration(self) -> None:
        """After an update: what the next update's report needs starts again."""
        self._checked = {}
        self._scale_input = None

    def _collapse_detail(self) -> str:
        # Called by the monitor inside update(), only when it reports a collapse:
        # the gradients of the skipped update are still there.
        report = self.overflow_report()
        return "" if report is None else report.collapse_detail()

    # ------------------------------------------------------------ copies

    def _diagnostics_state(self) -> dict[str, Any]:
        """What a copy (pickle, deepcopy) keeps of the diagnostics, by attribute name: the
        ring as host arrays and the last skipped update's report, computed now; not the
        ``watch()`` names, optimizers, gradients or loss the scaler refers to (they may not
        pickle, and a copy must not keep them alive)."""
        report = self.overflow_report()
        return {"_diagnose": self._diagnose, "_watched": {}, "_checked": {},
                "_scale_input": None,
                "_last": None if self._last is None else self._last.detached(report),
                "_ring_iterations": self._ring_iterations,
                "_ring_scales": self._from_ring(self._ring_scales),
                "_ring_skipped": self._from_ring(self._ring_skipped),
                "_ring_count": self._ring_count}

    def _restore_diagnostics(self, saved: Mapping[str, Any]) -> None:
        """Sets every diagnostics attribute from :meth:`_diagnostics_state`'s dict (none
        kept when it has none: a scaler copied before it had diagnostics)."""
        self._diagnose = saved.get("_diagnose", False)
        self._watched = {}
        self._checked = {}
        self._scale_input = None
        self._last = saved.get("_last")
        self._ring_iterations = saved.get("_ring_iterations", np.zeros(0, np.int64))
        self._ring_scales = self._to_ring(saved.get("_ring_scales", np.zeros(0, np.float32)))
        self._ring_skipped = self._to_ring(saved.get("_ring_skipped", np.zeros(0, bool)))
        self._ring_count = saved.get("_ring_count", 0)
