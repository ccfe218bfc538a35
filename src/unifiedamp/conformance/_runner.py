"""Runs step sequences through an adapter and compares them with the reference."""

from __future__ import annotations

from typing import Any, NamedTuple

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState, Vector


class Divergence(NamedTuple):
    """Where a backend's trajectory left the reference: the first differing step (from 1)."""

    vector: str
    step: int
    expected: ScalerState
    got: ScalerState
    config: dict[str, Any]

    def __str__(self) -> str:
        e, g = self.expected, self.got
        return (
            f"{self.vector}: diverged at step {self.step}: expected scale {e.scale!r} "
            f"({spec.f32_hex(e.scale)}), growth_tracker {e.growth_tracker}, hysteresis_tracker "
            f"{e.hysteresis_tracker}; got scale {g.scale!r} ({spec.f32_hex(g.scale)}), "
            f"growth_tracker {g.growth_tracker}, hysteresis_tracker {g.hysteresis_tracker}; "
            f"config {self.config}"
        )


def normalise(state: Any) -> ScalerState:
    """A backend's state as Python numbers (its scale may be a 0-d array or a tensor)."""
    scale, growth, hyst = state
    return ScalerState(float(scale), int(growth), int(hyst))


def same(a: ScalerState, b: ScalerState) -> bool:
    """Scales equal as float32 values (a scale that is no float32 value never matches)."""
    return (a.scale == b.scale and spec.f32(b.scale) == b.scale
            and a.growth_tracker == b.growth_tracker
            and a.hysteresis_tracker == b.hysteresis_tracker)


def run_vector(adapter: Any, vector: Vector, *, compiled: bool = False) -> Divergence | None:
    """Runs one vector; the first divergence from the reference, or None.

    Example:
        >>> from unifiedamp.backends.numpy import NumpyGradScaler
        >>> print(run_vector(NumpyGradScaler.conformance_adapter(), spec.VECTORS[0]))
        None
    """
    expected = spec.run_reference(vector)
    config = ScalerConfig(**vector.config)
    handle = adapter.new(config)
    iterate = adapter.compiled_iterate if compiled else adapter.iterate
    for i, kind in enumerate(vector.steps):
        if i in vector.changes:
            config = config.replace(**vector.changes[i])
            handle = adapter.reconfigure(handle, vector.changes[i])
        handle = iterate(handle, kind)
        got = normalise(adapter.read(handle))
        if not same(expected[i], got):
            return Divergence(vector.name, i + 1, expected[i], got, config.to_dict())
    return None


def run_steps(adapter: Any, config: ScalerConfig, steps: str, name: str = "steps",
              handle: Any = None, start: ScalerState | None = None) -> Divergence | None:
    """Runs ``steps`` (``F``/``I``/``N``, one optimizer) against the reference from ``start``."""
    handle = adapter.new(config) if handle is None else handle
    state = start or ScalerState.initial(config)
    for i, kind in enumerate(steps):
        state = spec.update(config, state, kind != "F" or spec.unscale_overflows(state.scale))
        handle = adapter.iterate(handle, kind)
        got = normalise(adapter.read(handle))
        if not same(state, got):
            return Divergence(name, i + 1, state, got, config.to_dict())
    return None
