"""The spec's update rule on every Keras backend: its parameters as the data a variable
holds (:func:`rule_values`), and one update as device ops (:func:`next_state`), which read
the rule from that data, so one trace serves every config."""

from __future__ import annotations

import math
from typing import Any, cast

from keras import ops

from unifiedamp.backends._float32_bits import EXP_MASK
from unifiedamp.spec import ScalerConfig, f32, f32_bits

from ._paths import F32, unscale_factors


def rule_values(config: ScalerConfig) -> list[int]:
    """The rule's parameters as the int32 vector ``scaler_rule`` holds: f32(growth_factor)
    and f32(backoff_factor) each as the bits of its significand (in [1, 2)) and its exponent
    (split here, not in every step), growth_interval, hysteresis, the bits of min_scale (0
    for none: every scale is above), of max_scale (inf for none), dynamic."""
    c = config
    factors = []
    for factor in (c.growth_factor, c.backoff_factor):
        mantissa, exponent = math.frexp(f32(factor))  # exact, subnormals included
        factors += [f32_bits(mantissa * 2), exponent - 1]
    return [*factors, c.growth_interval, c.hysteresis,
            0 if c.min_scale is None else f32_bits(c.min_scale),
            EXP_MASK if c.max_scale is None else f32_bits(c.max_scale), int(c.dynamic)]


def next_state(scale: Any, growth: Any, hyst: Any, rule: Any, finite: Any, factors: Any
               ) -> tuple[Any, Any, Any, Any]:
    """The spec's update as device ops: from the scale (float32), both trackers, the rule
    (:func:`rule_values`), the flag and the scale's unscale factors, the new scale's bits,
    its unscale factors and both trackers. A function of tensors alone, so that a backend
    that traces can trace it once (:meth:`BackendPaths.compiled`)."""
    grow_n, grow_e, back_n, back_e, interval, hysteresis, min_bits, max_bits, dynamic = (
        cast("list[Any]", ops.unstack(rule)))
    # dynamic=False: the scale stays, the trackers are reset.
    dynamic = ops.not_equal(dynamic, 0)
    counting_g = ops.logical_and(dynamic, finite)
    counting_h = ops.logical_and(dynamic, ops.logical_not(finite))
    growth, hyst = growth + 1, hyst + 1
    full_g = growth >= ops.cast(interval, growth.dtype)
    full_h = hyst >= ops.cast(hysteresis, hyst.dtype)
    grow, back_off = ops.logical_and(counting_g, full_g), ops.logical_and(counting_h, full_h)
    zero_g, zero_h, bits = ops.zeros_like(growth), ops.zeros_like(hyst), F32.bits(scale)
    growth = ops.where(counting_g, ops.where(full_g, zero_g, growth), zero_g)
    hyst = ops.where(counting_h, ops.where(full_h, zero_h, hyst), zero_h)

    def moved() -> tuple[Any, Any]:
        # One product, its factor chosen by the outcome; max_bits is inf's without a
        # max_scale (an overflow keeps the scale); then f32(1 / scale) (180 ops).
        product = F32.mul_bits(bits, F32.from_bits(ops.where(grow, grow_n, back_n)),
                               ops.where(grow, grow_e, back_e))
        grown = ops.minimum(product, max_bits)
        new = ops.where(grow, ops.where(F32.is_finite(grown), grown, bits),
                        ops.maximum(product, min_bits))
        return new, unscale_factors(new)

    # In a cond, run only when the scale moves; the step that keeps it first (what
    # tests/keras/test_graph_ops_keras.py counts).
    new_bits, factors = cast("tuple[Any, Any]", ops.cond(
        ops.logical_not(ops.logical_or(grow, back_off)), lambda: (bits, factors), moved))
    return new_bits, factors, growth, hyst
