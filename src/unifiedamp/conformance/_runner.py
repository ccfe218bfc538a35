"""Runs step sequences through an adapter and compares them with the reference, step by step.

After every step the scale (as a float32 value) and the trackers are compared
with the reference, and, where the adapter can show its parameters and optimizer
state, whether the step was skipped and whether they are all still finite.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from unifiedamp import spec
from unifiedamp.conformance._causes import Observed, explain
from unifiedamp.spec import ScalerConfig, ScalerState, Vector

__all__ = ["Divergence", "describe_scale", "normalise", "run_steps", "run_vector", "same"]


class Divergence(NamedTuple):
    """Where a scaler left the reference: the first differing step (from 1) of ``steps``.

    ``what`` says what differed: ``"state"`` (the scale or a tracker), ``"skip"``
    (the step was skipped where the reference steps, or the reverse) or
    ``"finite"`` (a parameter or optimizer-state value became inf or NaN) or ``"raised"``
    (the scaler raised where the spec takes the step). ``causes``:
    the departures from the spec that reproduce the whole run (:mod:`._causes`).
    """

    vector: str
    step: int
    expected: ScalerState
    got: ScalerState
    config: dict[str, Any]
    steps: str = ""
    what: str = "state"
    detail: str = ""
    causes: tuple[str, ...] = ()

    def __str__(self) -> str:
        e, g = self.expected, self.got
        causes = "; ".join(self.causes)
        where = (f"{f'[{causes}] ' if causes else ''}{self.vector}: "
                 f"diverged at step {self.step}" + (f" of {self.steps!r}" if self.steps else ""))
        if self.what == "raised":
            return f"{where}: {self.detail}; config {self.config}"
        if self.what != "state":
            return (f"{where}: {self.detail}; scale {describe_scale(g.scale)} (the spec's "
                    f"{describe_scale(e.scale)}); config {self.config}")
        return (f"{where}: expected scale {describe_scale(e.scale)}, growth_tracker "
                f"{e.growth_tracker}, hysteresis_tracker {e.hysteresis_tracker}; got scale "
                f"{describe_scale(g.scale)}, growth_tracker {_tracker(g.growth_tracker)}, "
                f"hysteresis_tracker {_tracker(g.hysteresis_tracker)}; config {self.config}")


def _tracker(value: int | None) -> str:
    return "(not compared)" if value is None else str(value)


def describe_scale(scale: float) -> str:
    """A scale with its float32 bits, or why it has none.

    Example:
        >>> describe_scale(1024.0)
        '1024.0 (float32 0x44800000)'
        >>> describe_scale(7.006e-46)
        '7.006e-46 (not a float32 value: rounds to 0.0, 0x00000000)'
    """
    if scale != scale or spec.f32(scale) == scale:
        return f"{scale!r} (float32 {spec.f32_hex(scale)})"
    return f"{scale!r} (not a float32 value: rounds to {spec.f32(scale)!r}, {spec.f32_hex(scale)})"


def normalise(state: Any) -> ScalerState:
    """A scaler's state as Python numbers (its scale may be a 0-d array or a tensor); a
    tracker the adapter does not map stays ``None``."""
    scale, growth, hyst = state
    return ScalerState(float(scale), None if growth is None else int(growth),
                       None if hyst is None else int(hyst))


def same(a: ScalerState, b: ScalerState, compare: str = "full") -> bool:
    """Scales equal as float32 values (a scale that is no float32 value never matches),
    trackers equal as ints; under ``"scale_and_skip"`` a tracker that either side
    does not have (``None``) is not compared.

    Example:
        >>> same(ScalerState(2.0, 1, 0), ScalerState(2.0, None, None), "scale_and_skip")
        True
        >>> same(ScalerState(2.0, 1, 0), ScalerState(2.0, None, None))
        False
    """
    if not (a.scale == b.scale and spec.f32(b.scale) == b.scale):
        return False
    return all(x == y or (compare == "scale_and_skip" and None in (x, y))
               for x, y in zip(a[1:], b[1:], strict=True))


def run_vector(adapter: Any, vector: Vector, *, compiled: bool = False) -> Divergence | None:
    """Runs one vector; the first divergence from the reference, or None.

    Example:
        >>> from unifiedamp.backends.numpy import NumpyGradScaler
        >>> print(run_vector(NumpyGradScaler.conformance_adapter(), spec.VECTORS[0]))
        None
    """
    return _run(adapter, ScalerConfig(**vector.config), vector.steps, vector.name,
                changes=vector.changes, compiled=compiled)


def run_steps(adapter: Any, config: ScalerConfig, steps: str, name: str = "steps",
              handle: Any = None, start: ScalerState | None = None) -> Divergence | None:
    """Runs ``steps`` (``F``/``I``/``N``, one optimizer) against the reference from ``start``."""
    return _run(adapter, config, steps, name, handle=handle, start=start)


def _run(adapter: Any, config: ScalerConfig, steps: str, name: str, *,
         changes: dict[int, dict[str, Any]] | None = None, compiled: bool = False,
         handle: Any = None, start: ScalerState | None = None) -> Divergence | None:
    compare = getattr(adapter, "compare", "full")
    handle = adapter.new(config) if handle is None else handle
    iterate = adapter.compiled_iterate if compiled else adapter.iterate
    watch = callable(getattr(adapter, "snapshot", None))
    # What one step leaves is what the next starts from: one snapshot per step.
    before = _bits(adapter.snapshot(handle)) if watch else []
    first_config, state = config, start or ScalerState.initial(config)
    observed: list[Observed] = []
    first: Divergence | None = None
    poisoned = False
    for i, kind in enumerate(steps):
        if changes and i in changes:
            config = config.replace(**changes[i])
            handle = adapter.reconfigure(handle, changes[i])
        found_inf = kind != "F" or spec.unscale_overflows(state.scale)
        state = spec.update(config, state, found_inf)
        try:
            handle = iterate(handle, kind)
            got = normalise(adapter.read(handle))
        except Exception as exc:  # the scaler's own error is a verdict, not a crash
            if first is None:
                return Divergence(name, i + 1, state, state, config.to_dict(), steps, "raised",
                                  f"it raised {type(exc).__name__}: {exc}",
                                  (f"raises {type(exc).__name__}",))
            break  # it raised after leaving the spec: explain the steps it took
        problem, skipped = None, None
        if watch:
            after = adapter.snapshot(handle)
            after_bits = _bits(after)
            skipped = _unchanged(after_bits, before)
            problem = _step_problem(after, skipped, kind, found_inf)
            poisoned = problem is not None and problem[0] == "finite"
            before = after_bits
        observed.append(Observed(got, skipped))
        if first is None and (problem is not None or not same(state, got, compare)):
            what, detail = problem or ("state", "")
            first = Divergence(name, i + 1, state, got, config.to_dict(), steps, what,
                               detail=detail)
        if poisoned:
            break  # inf/NaN weights give non-finite gradients whatever the step: no evidence
    if first is None:
        return None
    # Reported trackers only: a scale_and_skip adapter's own counters mean something else.
    if compare != "full":
        observed = [Observed(ScalerState(o.state.scale, None, None), o.skipped)
                    for o in observed]
    return first._replace(causes=tuple(explain(first_config, steps, observed, changes,
                                               start)))


_GRADIENTS = {"F": "finite gradients", "I": "an inf", "N": "a NaN"}


def _step_problem(after: list[Any], skipped: bool | None, kind: str,
                  found_inf: bool) -> tuple[str, str] | None:
    """What is wrong with a step seen through the parameters and optimizer state:
    ``("finite", why)``, ``("skip", why)`` or ``None``."""
    if not all(np.isfinite(a).all() for a in map(np.asarray, after)
               if np.issubdtype(a.dtype, np.inexact)):
        return "finite", (f"a step with {_GRADIENTS[kind]} left a parameter or optimizer-state "
                          "value inf or NaN")
    if skipped is None or skipped == found_inf:
        return None
    why = ", and 1/scale overflows float32" if found_inf and kind == "F" else ""
    return "skip", (f"the step was {'skipped' if skipped else 'taken'}; the reference "
                    f"{'skips' if found_inf else 'takes'} it ({_GRADIENTS[kind]}{why})")


def _unchanged(after: list[Any], before: list[Any]) -> bool:
    """Whether a step left everything as it was. Optimizers that build their state on the
    first step (torch's fused Adam on CUDA, MLX) build it on a skipped first step too: state
    that appears is unchanged while it holds its initial zeros."""
    new = after[len(before):]
    return after[:len(before)] == before and all(not any(raw) for _, _, raw in new)


def _bits(arrays: list[Any]) -> list[tuple[str, tuple[int, ...], bytes]]:
    return [(str(a.dtype), a.shape, a.tobytes()) for a in map(np.asarray, arrays)]
