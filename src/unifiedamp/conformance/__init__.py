"""Runs the spec's test vectors against a scaler and says exactly where it diverges.

A backend is driven through an *adapter*: an object with

- ``new(config) -> handle``: a fresh scaler (and whatever it trains) for a config;
- ``iterate(handle, kind) -> handle``: one training iteration whose gradients
  are all finite (``"F"``), hold an inf (``"I"``) or a NaN (``"N"``);
- ``reconfigure(handle, changes) -> handle``: apply config changes at run time;
- ``read(handle) -> ScalerState``: the scale and trackers now.

Imperative scalers with torch's verbs need only :class:`ImperativeAdapter`.
Backends expose theirs as the class method ``conformance_adapter()``.

Example:
    >>> from unifiedamp import spec
    >>> from unifiedamp.backends.numpy import NumpyGradScaler
    >>> adapter = NumpyGradScaler.conformance_adapter()
    >>> print(run_vector(adapter, spec.VECTORS[0]))
    None
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState, Vector

__all__ = ["Divergence", "ImperativeAdapter", "run_vector"]


class ImperativeAdapter:
    """Drives a scaler with torch's verbs: ``step(optimizer)``, ``update()``, ``set_*``.

    Args:
        scaler_cls: Builds the scaler from canonical keyword arguments.
        make_problem: Returns ``(optimizer, set_grads)`` where ``set_grads(kind)``
            fills the optimizer's gradients as if backpropagated from a scaled loss.
    """

    def __init__(self, scaler_cls: Callable[..., Any],
                 make_problem: Callable[[], tuple[Any, Callable[[str], None]]]):
        self.scaler_cls = scaler_cls
        self.make_problem = make_problem

    def new(self, config: ScalerConfig) -> Any:
        return self.scaler_cls(**config.to_dict()), *self.make_problem()

    def iterate(self, handle: Any, kind: str) -> Any:
        scaler, optimizer, set_grads = handle
        set_grads(kind)
        scaler.step(optimizer)
        scaler.update()
        return handle

    def reconfigure(self, handle: Any, changes: dict[str, Any]) -> Any:
        for name, value in changes.items():
            getattr(handle[0], f"set_{name}")(value)
        return handle

    def read(self, handle: Any) -> ScalerState:
        d = handle[0].state_dict()
        return ScalerState(d["scale"], d["growth_tracker"], d["hysteresis_tracker"])


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


def _same(a: ScalerState, b: ScalerState) -> bool:
    # Scales compared as float32 bit patterns; trackers as ints.
    return (spec.f32_hex(a.scale) == spec.f32_hex(b.scale)
            and int(a.growth_tracker) == int(b.growth_tracker)
            and int(a.hysteresis_tracker) == int(b.hysteresis_tracker))


def run_vector(adapter: Any, vector: Vector) -> Divergence | None:
    """Runs one vector through an adapter; the first divergence from the reference, or None."""
    expected = spec.run_reference(vector)
    config = ScalerConfig(**vector.config)
    handle = adapter.new(config)
    for i, kind in enumerate(vector.steps):
        if i in vector.changes:
            config = config.replace(**vector.changes[i])
            handle = adapter.reconfigure(handle, vector.changes[i])
        handle = adapter.iterate(handle, kind)
        got = adapter.read(handle)
        got = ScalerState(float(got.scale), int(got.growth_tracker), int(got.hysteresis_tracker))
        if not _same(expected[i], got):
            return Divergence(vector.name, i + 1, expected[i], got, config.to_dict())
    return None
