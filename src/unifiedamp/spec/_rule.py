"""The rule: the dynamic state and the reference update, in float32 arithmetic."""

from __future__ import annotations

import math
from collections import namedtuple

from unifiedamp.spec._config import ScalerConfig
from unifiedamp.spec._float32 import f32, f32_from_bits

__all__ = ["MIN_UNSCALABLE", "ScalerState", "unscale_overflows", "update"]


# collections.namedtuple, not typing.NamedTuple: ``import typing`` (with re and enum) is
# among what a bare ``import unifiedamp`` must not load (tests/core/test_import.py).
class ScalerState(namedtuple("ScalerState", ["scale", "growth_tracker", "hysteresis_tracker"],
                             defaults=[0, 0])):
    """The dynamic part of a scaler: what a checkpoint must carry.

    Attributes:
        scale: The current scale, a float32 value held in a Python float.
        growth_tracker: Consecutive finite updates since the last growth or backoff.
        hysteresis_tracker: Consecutive non-finite updates since the last backoff.

    Example:
        >>> ScalerState.initial(ScalerConfig(0.1))
        ScalerState(scale=0.10000000149011612, growth_tracker=0, hysteresis_tracker=0)
    """

    __slots__ = ()

    @classmethod
    def initial(cls, config: ScalerConfig) -> ScalerState:
        """The state before the first update: ``f32(init_scale)``, trackers at 0."""
        return cls(f32(config.init_scale), 0, 0)


def update(config: ScalerConfig, state: ScalerState, found_inf: bool) -> ScalerState:
    """The reference update: one iteration of the spec, in float32 arithmetic.

    Each product of two float32 values is exact in float64 (24 + 24 bits < 53),
    so rounding that product once to float32 is exactly an IEEE float32 multiply.

    Example:
        >>> config = ScalerConfig(1.0, growth_factor=1.1, growth_interval=1)
        >>> update(config, ScalerState.initial(config), False).scale
        1.100000023841858
    """
    scale, growth, hyst = state
    if not config.dynamic:
        return ScalerState(scale, 0, 0)
    if found_inf:
        growth, hyst = 0, hyst + 1
        if hyst >= config.hysteresis:
            scale = f32(scale * f32(config.backoff_factor))
            if config.min_scale is not None:
                scale = max(scale, f32(config.min_scale))
            hyst = 0
        return ScalerState(scale, growth, hyst)
    hyst, growth = 0, growth + 1
    if growth >= config.growth_interval:
        candidate = f32(scale * f32(config.growth_factor))
        if config.max_scale is not None:
            candidate = min(candidate, f32(config.max_scale))
        if math.isfinite(candidate):
            scale = candidate
        growth = 0
    return ScalerState(scale, growth, hyst)


#: The smallest float32 scale whose reciprocal is finite in float32 (bits 0x00200001,
#: about 2.94e-39, a subnormal). Devices that flush subnormals compare bit patterns.
MIN_UNSCALABLE = f32_from_bits(0x00200001)


def unscale_overflows(scale: float) -> bool:
    """Whether ``f32(1 / scale)`` is inf: a scale of 0 or below :data:`MIN_UNSCALABLE`.

    Unscaling multiplies by that reciprocal, so every gradient would come out inf
    or NaN: an unscale check at such a scale finds inf whatever the gradients
    hold, and the step is skipped instead of writing inf into the parameters.
    The rule's backoffs can take the scale there (to 0 after about 166 of them
    from the default scale, without ``min_scale``).

    Example:
        >>> unscale_overflows(2.0**-127), unscale_overflows(2.0**-128), unscale_overflows(0.0)
        (False, True, True)
    """
    return scale < MIN_UNSCALABLE
