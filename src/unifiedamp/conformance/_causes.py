"""Why a scaler left the spec: the departures from the rule that reproduce what it did.

A divergence is named by its cause, not by the test that met it. The reference
update is replayed over the whole step sequence with candidate departures from
the spec (:data:`DEPARTURES`: one at a time, then pairs, then triples), and the
smallest sets that reproduce every step the scaler took (scale, the trackers it
reports, whether it skipped) are its causes. Replaying the whole sequence, not
only up to the first divergence, finds every distinct departure in it: a growth
one step late, then a clamp at float32's maximum. When no set fits, the cause is
``unexplained: <what differs>``.

Example:
    >>> from unifiedamp.spec import ScalerConfig, ScalerState
    >>> config = ScalerConfig(1024.0, growth_interval=2)
    >>> late = [Observed(ScalerState(1024.0, 1, 0)), Observed(ScalerState(1024.0, 2, 0)),
    ...         Observed(ScalerState(2048.0, 0, 0))]
    >>> explain(config, "FFF", late)
    ['grows one step late']
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["DEPARTURES", "Observed", "explain", "replay"]

#: Each departure, and what it does instead of the spec, in one line.
DEPARTURES = {
    "grows one step late": "grows on the (growth_interval + 1)-th finite step",
    "grows one step early": "grows on the (growth_interval - 1)-th finite step",
    "first growth one step late":
        "grows first on the (growth_interval + 1)-th finite step after the start or an "
        "overflow, then every growth_interval steps",
    "grows only when the tracker equals the interval":
        "tests tracker + 1 == growth_interval, so a tracker past the interval never grows",
    "counts modulo the interval":
        "counts finite steps modulo growth_interval, so a tracker past it wraps around",
    "multiplies by a float64 factor":
        "multiplies the scale by the factor as a float64 and rounds once to float32",
    "first update in float64": "computes its first update from float64 values",
    "keeps the scale in float64": "keeps the scale as a float64, never rounded to float32",
    "growth overflows to inf": "lets a growth past float32's maximum make the scale inf",
    "clamps growth at float32's maximum": "clamps a growth past float32's maximum to it",
    "floor of 1": "never backs off below 1.0",
    "floor at the smallest normal float32": "never backs off below 2**-126 (no min_scale)",
    "floor at the smallest float32": "never backs off below 2**-149 (no min_scale)",
    "flushes subnormals to zero": "flushes a subnormal scale to 0",
    "flushes a subnormal 1/scale to zero":
        "unscales by 1/scale flushed to 0 above a scale of 2**126, so a finite step there "
        "applies zero gradients (nothing moves, as if skipped) and counts as finite",
    "takes a finite step whose 1/scale overflows":
        "checks the gradients before unscaling, so a finite step at a scale whose "
        "reciprocal overflows float32 is taken (and counts as finite)",
    "skips the step that grows": "skips the finite step whose update grows the scale",
    "steps on inf/NaN gradients": "backs off as the spec does but takes the step",
    "hysteresis not refilled by finite steps":
        "counts overflows since the last growth, not consecutive ones",
    "hysteresis not re-armed at a backoff": "backs off again at every later overflow",
    "the update ignores overflows": "skips the step but updates the scale as if it were finite",
    "NaN taken as finite": "counts a NaN gradient as finite",
    "static mode keeps the trackers": "leaves the trackers as they are in static mode",
}

_ORDER = {name: i for i, name in enumerate(DEPARTURES)}
_GROWTH_TIMING = ("grows one step late", "grows one step early", "first growth one step late",
                  "grows only when the tracker equals the interval", "counts modulo the interval")
_ARITHMETIC = ("multiplies by a float64 factor", "keeps the scale in float64")
_OVERFLOW = ("growth overflows to inf", "clamps growth at float32's maximum")
_FLOOR = {"floor of 1": 1.0, "floor at the smallest normal float32": spec.FLOAT32_MIN_NORMAL,
          "floor at the smallest float32": 2.0**-149}
#: Departures that exclude each other: a set holds at most one of each group.
_EXCLUSIVE = (_GROWTH_TIMING, _ARITHMETIC, _OVERFLOW, tuple(_FLOOR))


class Observed(NamedTuple):
    """What a scaler did at one step: its state (a tracker it does not report is
    ``None``) and whether it skipped the step (``None`` where nobody looked)."""

    state: ScalerState
    skipped: bool | None = None


def _mul(scale: float, factor: float, d: frozenset[str], first: bool) -> float:
    if "keeps the scale in float64" in d:
        product = scale * factor
    elif "multiplies by a float64 factor" in d or ("first update in float64" in d and first):
        product = spec.f32(scale * factor)
    else:
        product = spec.f32(scale * spec.f32(factor))
    if "flushes subnormals to zero" in d and abs(product) < spec.FLOAT32_MIN_NORMAL:
        return 0.0
    return product


def _found_inf(kind: str, scale: float, d: frozenset[str]) -> bool:
    if kind == "F":
        if math.isinf(scale):  # a departure reached inf: the scaled gradients are inf too
            return True
        return "takes a finite step whose 1/scale overflows" not in d and \
            spec.unscale_overflows(scale)
    return not (kind == "N" and "NaN taken as finite" in d)


def _grows(growth: int, interval: int, d: frozenset[str]) -> bool:
    """Whether the finite update whose tracker becomes ``growth`` grows."""
    if "grows one step late" in d:
        return growth > interval
    if "grows one step early" in d:
        return growth >= interval - 1
    if "grows only when the tracker equals the interval" in d:
        return growth == interval
    if "counts modulo the interval" in d:
        return (growth - 1) % interval == interval - 1
    return growth >= interval


def _update(config: ScalerConfig, state: ScalerState, found_inf: bool, d: frozenset[str],
            first: bool) -> ScalerState:
    """:func:`unifiedamp.spec.update` with the departures ``d``."""
    scale, growth, hyst = state
    if not config.dynamic:
        return state if "static mode keeps the trackers" in d else ScalerState(scale, 0, 0)
    if found_inf:
        growth, hyst = -1 if "first growth one step late" in d else 0, hyst + 1
        if hyst >= config.hysteresis:
            scale = _mul(scale, config.backoff_factor, d, first)
            floor = next((_FLOOR[f] for f in _FLOOR if f in d and (
                f == "floor of 1" or config.min_scale is None)), config.min_scale)
            if floor is not None:
                scale = max(scale, spec.f32(floor))
            if "hysteresis not re-armed at a backoff" not in d:
                hyst = 0
        return ScalerState(scale, growth, hyst)
    if "hysteresis not refilled by finite steps" not in d:
        hyst = 0
    growth += 1
    if _grows(growth, config.growth_interval, d):
        candidate = _mul(scale, config.growth_factor, d, first)
        if config.max_scale is not None:
            candidate = min(candidate, spec.f32(config.max_scale))
        if math.isfinite(candidate) or "growth overflows to inf" in d:
            scale = candidate
        elif "clamps growth at float32's maximum" in d:
            scale = spec.f32_from_bits(0x7F7FFFFF)
        growth, hyst = 0, 0
    elif "counts modulo the interval" in d:
        growth %= config.growth_interval
    return ScalerState(scale, growth, hyst)


def replay(config: ScalerConfig, steps: str, departures: Iterable[str] = (),
           changes: dict[int, dict[str, Any]] | None = None,
           start: ScalerState | None = None) -> list[Observed]:
    """The spec's trajectory over ``steps`` with ``departures``: each step's state and
    whether it is skipped.

    Example:
        >>> [o.state.scale for o in replay(ScalerConfig(2.0**127, growth_interval=1), "FF",
        ...                                ["growth overflows to inf"])]
        [inf, inf]
    """
    d = frozenset(departures)
    unknown = d - set(DEPARTURES)
    if unknown:
        raise ValueError(f"unknown departures {sorted(unknown)}: one of {sorted(DEPARTURES)}")
    state = start or ScalerState.initial(config)
    if "first growth one step late" in d and start is None:
        state = state._replace(growth_tracker=-1)
    out = []
    for i, kind in enumerate(steps):
        if changes and i in changes:
            config = config.replace(**changes[i])
        if "flushes subnormals to zero" in d and abs(state.scale) < spec.FLOAT32_MIN_NORMAL:
            state = state._replace(scale=0.0)  # a subnormal input is 0 to such a device
        found_inf = _found_inf(kind, state.scale, d)
        new = _update(config, state, found_inf and "the update ignores overflows" not in d, d,
                      first=i == 0 and start is None)
        grew = not found_inf and new.scale != state.scale and new.growth_tracker == 0
        skipped = (found_inf and "steps on inf/NaN gradients" not in d) or (
            grew and "skips the step that grows" in d) or (
            "flushes a subnormal 1/scale to zero" in d and not found_inf
            and state.scale > 2.0**126)
        out.append(Observed(new, skipped))
        state = new
    return out


def _same_value(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


def _matches(predicted: Sequence[Observed], observed: Sequence[Observed]) -> bool:
    for p, o in zip(predicted, observed, strict=False):
        if not _same_value(p.state.scale, o.state.scale):
            return False
        if any(g is not None and g != e for e, g in zip(p.state[1:], o.state[1:], strict=True)):
            return False
        if o.skipped is not None and o.skipped != p.skipped:
            return False
    return True


def _sets(size: int) -> Iterable[frozenset[str]]:
    for combo in itertools.combinations(DEPARTURES, size):
        if all(len(set(combo) & set(group)) <= 1 for group in _EXCLUSIVE):
            yield frozenset(combo)


def explain(config: ScalerConfig, steps: str, observed: Sequence[Observed],
            changes: dict[int, dict[str, Any]] | None = None,
            start: ScalerState | None = None) -> list[str]:
    """The causes of a trajectory: the departures of the smallest set that reproduces
    ``observed`` (the scaler's steps, from the first; it may stop early where the scaler
    raised); of several such sets, the one whose departures come first in
    :data:`DEPARTURES`; ``["unexplained: ..."]`` when no set of up to three departures
    fits, and ``[]`` when the spec itself reproduces it.

    Example:
        >>> from unifiedamp.spec import ScalerConfig, ScalerState
        >>> config = ScalerConfig(2.0**126, growth_interval=1)
        >>> seen = [Observed(ScalerState(2.0**127, 0, 0)), Observed(ScalerState(math.inf, 0, 0))]
        >>> explain(config, "FF", seen)
        ['growth overflows to inf']
    """
    steps = steps[:len(observed)]
    for size in range(4):
        fits = [d for d in _sets(size)
                if _matches(replay(config, steps, d, changes, start), observed)]
        if fits:
            # Several sets fit where the run never tells them apart (one multiply cannot
            # tell a float64 factor from a first update in float64): name the set whose
            # departures come first in DEPARTURES, the commoner ones.
            best = min(fits, key=lambda d: sorted(_ORDER[x] for x in d))
            return sorted(best, key=_ORDER.__getitem__)
    return [f"unexplained: {_first_difference(config, steps, observed, changes, start)}"]


def _first_difference(config: ScalerConfig, steps: str, observed: Sequence[Observed],
                      changes: dict[int, dict[str, Any]] | None,
                      start: ScalerState | None) -> str:
    for i, (p, o) in enumerate(zip(replay(config, steps, (), changes, start), observed,
                                   strict=False)):
        if not _matches([p], [o]):
            return (f"at step {i + 1} of {steps!r} the scaler holds {tuple(o.state)}"
                    f"{'' if o.skipped is None else (' skipped' if o.skipped else ' stepped')}"
                    f", the spec {tuple(p.state)}{' skipped' if p.skipped else ' stepped'}")
    return "its steps match the spec's scale and trackers"
