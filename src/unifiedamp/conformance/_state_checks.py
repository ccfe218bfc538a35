"""The state tests' checks: the adapter's own save first, then what a load restores, then
the run that continues from it; each failure named by its cause."""

from __future__ import annotations

import json
from typing import Any

from unifiedamp import spec
from unifiedamp.conformance._runner import describe_scale, normalise, run_steps, same
from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["check_loaded", "check_resume", "check_saved", "load_causes"]


def load_causes(saved: ScalerState, got: ScalerState, compare: str) -> str:
    """``[cause]`` of a load that did not give back the saved state: a saved scale that is
    no float32 value (the scaler reports one it does not run with), else the fields lost."""
    if spec.f32(saved.scale) != saved.scale:
        return "[reports a scale that is no float32 value]"
    lost = [] if saved.scale == got.scale and spec.f32(got.scale) == got.scale else ["scale"]
    lost += [name for name, a, b in zip(("growth_tracker", "hysteresis_tracker"), saved[1:],
                                        got[1:], strict=True)
             if a != b and not (compare == "scale_and_skip" and None in (a, b))]
    return f"[load does not restore the {' and the '.join(lost)}]"


def check_saved(saved: dict[str, Any], state: ScalerState, where: str) -> None:
    """The adapter's ``save()`` writes a canonical dict with the scale its ``read()``
    reports: otherwise the bug is the adapter's, not the scaler's, and is named so. (A
    tracker the scaler's own state dict does not carry is the scaler's loss, named at load.)"""
    try:
        _, written = spec.parse_state_dict(saved)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"[the adapter's save() writes no canonical state dict] {where}: "
                             f"{exc}") from None
    if spec.f32(state.scale) == state.scale:
        assert written.scale == state.scale, (
            f"[the adapter's save() writes a scale its read() does not report] {where}: read "
            f"{describe_scale(state.scale)}, saved {describe_scale(written.scale)}")


def check_loaded(adapter: Any, expected: ScalerState, handle: Any) -> None:
    """The state read right after a load is the one loaded."""
    got = normalise(adapter.read(handle))
    assert same(expected, got, getattr(adapter, "compare", "full")), (
        f"{load_causes(expected, got, getattr(adapter, 'compare', 'full'))} loading the state "
        f"{tuple(expected)} gave {tuple(got)}")


def check_resume(source: Any, target: Any, config: ScalerConfig, prefix: str, rest: str,
                 fresh: ScalerConfig) -> None:
    """Saves ``source`` after ``prefix``, loads it into ``target`` built with ``fresh`` and
    runs ``rest``: the save, the state and config restored, the continued run."""
    handle = source.new(config)
    for kind in prefix:
        handle = source.iterate(handle, kind)
    saved_state = normalise(source.read(handle))
    saved = json.loads(json.dumps(source.save(handle)))  # through JSON, as a checkpoint would
    where = f"saved by {source.name} after {prefix!r}, loaded by {target.name}"
    check_saved(saved, saved_state, where)
    resumed = target.load(target.new(fresh), saved)
    got = normalise(target.read(resumed))
    modes = {getattr(source, "compare", "full"), getattr(target, "compare", "full")}
    compare = "full" if modes == {"full"} else "scale_and_skip"
    assert same(saved_state, got, compare), (
        f"{load_causes(saved_state, got, compare)} {where}: expected scale "
        f"{describe_scale(saved_state.scale)}, trackers "
        f"{saved_state.growth_tracker}, {saved_state.hysteresis_tracker}; got scale "
        f"{describe_scale(got.scale)}, trackers {got.growth_tracker}, {got.hysteresis_tracker}")
    written = target.save(resumed)["config"]
    lost = sorted(k for k, v in config.to_dict().items() if written.get(k) != v)
    assert not lost, (
        f"[load does not restore the config] {where}: the loaded scaler's config has "
        + ", ".join(f"{k}={written.get(k)!r} (saved {config.to_dict()[k]!r})" for k in lost))
    if None in saved_state:  # a scaler without the canonical trackers: the spec's state
        saved_state = spec.run_reference(spec.Vector("prefix", config.to_dict(), prefix, ()))[-1]
    divergence = run_steps(target, config, rest, name=where, handle=resumed, start=saved_state)
    assert divergence is None, str(divergence)
