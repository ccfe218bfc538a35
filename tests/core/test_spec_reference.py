"""The reference update against hand-computed traces and an independent float32 model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState, update


def trace(config: ScalerConfig, steps: str) -> list[ScalerState]:
    state, out = ScalerState.initial(config), []
    for kind in steps:
        state = update(config, state, kind != "F")
        out.append(state)
    return out


def test_growth_on_the_nth_finite_step():
    got = trace(ScalerConfig(1024.0, growth_interval=3), "FFFFFF")
    assert [s.scale for s in got] == [1024, 1024, 2048, 2048, 2048, 4096]
    assert [s.growth_tracker for s in got] == [1, 2, 0, 1, 2, 0]


def test_backoff_resets_growth_tracker():
    got = trace(ScalerConfig(1024.0, growth_interval=3), "IFFFIIFFFF")
    assert [s.scale for s in got] == [512, 512, 512, 1024, 512, 256, 256, 256, 512, 512]
    assert [s.growth_tracker for s in got] == [0, 1, 2, 0, 0, 0, 1, 2, 0, 1]


def test_hysteresis_two_backs_off_on_the_second_consecutive_inf():
    got = trace(ScalerConfig(1024.0, growth_interval=3, hysteresis=2), "IIFIFII")
    assert [s.scale for s in got] == [1024, 512, 512, 512, 512, 512, 256]
    assert [s.hysteresis_tracker for s in got] == [1, 0, 0, 1, 0, 1, 0]
    assert [s.growth_tracker for s in got] == [0, 0, 1, 0, 1, 0, 0]


def test_min_scale_clamps_a_backoff():
    got = trace(ScalerConfig(4.0, min_scale=1.5), "III")
    assert [s.scale for s in got] == [2.0, 1.5, 1.5]


def test_max_scale_clamps_a_growth():
    got = trace(ScalerConfig(4.0, growth_interval=1, max_scale=10.0), "FFF")
    assert [s.scale for s in got] == [8.0, 10.0, 10.0]


def test_growth_that_overflows_float32_keeps_the_scale_and_resets_the_tracker():
    top = 2.0**127
    got = trace(ScalerConfig(top, growth_interval=2), "FFF")
    assert [s.scale for s in got] == [top, top, top]
    assert [s.growth_tracker for s in got] == [1, 0, 1]


def test_non_power_of_two_factors_round_in_float32_at_every_step():
    config = ScalerConfig(1.0, 1.1, 0.7, 1)
    got = [s.scale for s in trace(config, "FFFI")]
    assert got == [1.100000023841858, 1.2100000381469727, 1.3310000896453857,
                   0.9317000508308411]
    # Carrying the scale in float64 and rounding once at the end gives other bits:
    assert spec.f32(1.1 * 1.1 * 1.1 * 0.7) == 0.9316999912261963 != got[-1]
    # Each is exactly numpy's float32 product.
    s = np.float32(1.0)
    for factor in (1.1, 1.1, 1.1, 0.7):
        s = s * np.float32(factor)
    assert float(s) == got[-1]


def test_static_mode_keeps_the_scale_and_resets_trackers():
    got = trace(ScalerConfig(1024.0, growth_interval=1, dynamic=False), "FIFN")
    assert got == [ScalerState(1024.0, 0, 0)] * 4


def test_lowered_interval_grows_on_the_next_finite_step():
    config = ScalerConfig(1024.0, growth_interval=5)
    state = ScalerState.initial(config)
    for _ in range(3):
        state = update(config, state, False)
    assert state == ScalerState(1024.0, 3, 0)
    lowered = config.replace(growth_interval=2)
    state = update(lowered, state, False)
    # torch tests tracker == interval and would never grow again; the spec uses >=.
    assert state == ScalerState(2048.0, 0, 0)


def test_nan_counts_like_inf_and_interval_one_grows_every_step():
    assert [s.scale for s in trace(ScalerConfig(8.0, growth_interval=1), "FFNF")] == [
        16, 32, 16, 32]


def test_growth_factor_one_and_backoff_factor_one_keep_the_scale():
    assert [s.scale for s in trace(ScalerConfig(8.0, 1.0, growth_interval=1), "FF")] == [8, 8]
    assert [s.scale for s in trace(ScalerConfig(8.0, backoff_factor=1.0), "II")] == [8, 8]


def test_init_scale_is_rounded_to_float32():
    assert ScalerState.initial(ScalerConfig(0.1)).scale == float(np.float32(0.1))


def test_backoff_can_underflow_to_subnormal_and_zero_without_min_scale():
    config = ScalerConfig(2.0**-148, growth_interval=1)
    got = trace(config, "III")
    assert [s.scale for s in got] == [2.0**-149, 0.0, 0.0]


@pytest.mark.parametrize("vector", spec.VECTORS, ids=lambda v: v.name)
def test_every_shipped_vector_matches_its_hand_computed_scales(vector):
    assert [s.scale for s in spec.run_reference(vector)] == [float(x) for x in vector.scales]
    assert len(vector.scales) == len(vector.steps)


def test_f32_rounds_to_nearest_even_and_overflows_to_inf():
    assert spec.f32(1 + 2.0**-24) == 1.0  # a tie, rounds to even
    assert spec.f32(1 + 3 * 2.0**-24) == 1 + 2.0**-22
    assert spec.f32(3.4028235e38) == float(np.finfo(np.float32).max)
    assert spec.f32(3.5e38) == math.inf and spec.f32(-3.5e38) == -math.inf
    assert spec.f32_hex(0.5) == "0x3f000000"


# An independent model of the spec in numpy float32, to cross-check the
# struct-based reference on random configs and step sequences.
def numpy_model(config: ScalerConfig, steps: list[bool]) -> list[tuple[np.float32, int, int]]:
    scale, growth, hyst, out = np.float32(config.init_scale), 0, 0, []
    g, b = np.float32(config.growth_factor), np.float32(config.backoff_factor)
    for found_inf in steps:
        if not config.dynamic:
            growth = hyst = 0
        elif found_inf:
            growth, hyst = 0, hyst + 1
            if hyst >= config.hysteresis:
                scale, hyst = scale * b, 0
                if config.min_scale is not None:
                    scale = max(scale, np.float32(config.min_scale))
        else:
            hyst, growth = 0, growth + 1
            if growth >= config.growth_interval:
                with np.errstate(over="ignore"):
                    cand = scale * g
                if config.max_scale is not None:
                    cand = min(cand, np.float32(config.max_scale))
                if np.isfinite(cand):
                    scale = cand
                growth = 0
        out.append((scale, growth, hyst))
    return out


def bounded_config(init, g, b, interval, hyst, lo, hi, dynamic):
    # Bounds that hold init_scale, as a valid config needs.
    if lo and hi:
        lo, hi = min(lo, hi), max(lo, hi)
    return ScalerConfig(init, g, b, interval, hysteresis=hyst, dynamic=dynamic,
                        min_scale=None if lo is None else min(lo, init),
                        max_scale=None if hi is None else max(hi, init))


configs = st.builds(
    bounded_config,
    st.floats(1e-30, 1e38),
    st.floats(1.0, 10.0),
    st.floats(0.01, 1.0),
    st.integers(1, 5),
    st.integers(1, 3),
    st.none() | st.floats(1e-30, 1e30),
    st.none() | st.floats(1e-30, 1e30),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(configs, st.lists(st.booleans(), max_size=40))
def test_reference_equals_an_independent_numpy_float32_model(config, steps):
    state, expected = ScalerState.initial(config), numpy_model(config, steps)
    for i, found_inf in enumerate(steps):
        state = update(config, state, found_inf)
        e = expected[i]
        assert spec.f32_hex(state.scale) == spec.f32_hex(float(e[0])), f"step {i + 1}"
        assert (state.growth_tracker, state.hysteresis_tracker) == (e[1], e[2]), f"step {i + 1}"


def test_min_unscalable_is_where_the_float32_reciprocal_stops_overflowing():
    below = spec.f32_from_bits(spec.f32_bits(spec.MIN_UNSCALABLE) - 1)
    with np.errstate(over="ignore", divide="ignore"):
        assert np.isfinite(np.float32(1.0 / spec.MIN_UNSCALABLE))
        assert np.isinf(np.float32(1.0 / below)) and np.isinf(np.float32(1.0) / np.float32(0.0))
    assert [spec.unscale_overflows(s) for s in (0.0, below, spec.MIN_UNSCALABLE, 1.0)] == [
        True, True, False, False]


def test_static_mode_resets_trackers_carried_in():
    # A state loaded (or configured) with trackers, then run with dynamic=False.
    config = ScalerConfig(1024.0, growth_interval=3, hysteresis=2, dynamic=False)
    for found_inf in (False, True):
        assert update(config, ScalerState(1024.0, 2, 1), found_inf) == ScalerState(1024.0, 0, 0)


def test_bounds_are_compared_as_float32_values():
    assert trace(ScalerConfig(0.125, min_scale=0.1), "I")[0].scale == 0.10000000149011612
    assert trace(ScalerConfig(8.0, growth_interval=1, max_scale=10.1), "F")[0].scale == (
        10.100000381469727)


def multiply_trace(vector: spec.Vector, growth_double: bool, backoff_double: bool) -> list:
    """The vector's scales with each factor kept as float64 (torch's kernel) or rounded to
    float32 (the spec) before the float32 product; hysteresis 1, no clamps."""
    c = ScalerConfig(**vector.config)
    grow = c.growth_factor if growth_double else spec.f32(c.growth_factor)
    back = c.backoff_factor if backoff_double else spec.f32(c.backoff_factor)
    scale, growth, out = spec.f32(c.init_scale), 0, []
    for kind in vector.steps:
        if kind == "F":
            growth += 1
            if growth >= c.growth_interval:
                scale, growth = spec.f32(scale * grow), 0
        else:
            scale, growth = spec.f32(scale * back), 0
        out.append(scale)
    return out


def test_a_vector_separates_a_float32_factor_from_a_float64_one_on_each_multiply():
    vector = next(v for v in spec.VECTORS
                  if v.name == "factors_rounded_to_float32_before_multiplying")
    assert multiply_trace(vector, False, False) == list(vector.scales)
    # A float64 growth factor differs at the first step, a float64 backoff at the second.
    assert multiply_trace(vector, True, False)[0] != vector.scales[0]
    assert multiply_trace(vector, False, True)[:2] == [vector.scales[0], 59.29000473022461]
    assert multiply_trace(vector, True, True)[0] != vector.scales[0]


def test_the_older_float32_vectors_do_not_separate_the_two_multiplies():
    # Why the vector above exists: a float64 factor passes these.
    for name in ("non_power_of_two_factors_float32", "full_mantissa_operands"):
        vector = next(v for v in spec.VECTORS if v.name == name)
        assert multiply_trace(vector, True, True) == list(vector.scales), name
