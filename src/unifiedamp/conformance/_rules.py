"""The rule each test checks, in a few words: the first column of the matrix.

One root cause usually fails several tests; grouped by rule, a report says which
rules a scaler breaks instead of listing scenarios.

Example:
    >>> rule_of("test_vector[hysteresis_two]"), rule_of("test_disabled_scaler_is_a_pass_through")
    ('hysteresis', 'disabled')
"""

from __future__ import annotations

import re

__all__ = ["RULES", "TEST_RULES", "VECTOR_RULES", "rule_of", "rule_of_failure", "step_rule"]

RULES = ("growth timing", "backoff", "hysteresis", "clamps", "static mode", "inf/NaN detection",
         "float32 multiply", "reciprocal overflow", "growth overflow", "growth step",
         "skipped step", "two optimizers", "scale/unscale", "state round trip", "disabled",
         "ranks", "random sequences")

VECTOR_RULES = {
    "growth_on_nth_finite": "growth timing",
    "backoff_resets_growth": "backoff",
    "nan_backs_off_like_inf": "inf/NaN detection",
    "interval_one": "growth timing",
    "defaults_first_steps": "growth timing",
    "hysteresis_two": "hysteresis",
    "hysteresis_rearmed_after_backoff": "hysteresis",
    "min_scale_clamp": "clamps",
    "max_scale_clamp": "clamps",
    "growth_overflow_keeps_scale": "growth overflow",
    "non_power_of_two_factors_float32": "float32 multiply",
    "factors_rounded_to_float32_before_multiplying": "float32 multiply",
    "backoff_below_one": "backoff",
    "growth_factor_one": "growth timing",
    "backoff_factor_one": "backoff",
    "static_mode": "static mode",
    "bounds_rounded_to_float32": "clamps",
    "growth_overflow_keeps_scale_with_hysteresis": "growth overflow",
    "non_power_of_two_factors_with_hysteresis": "float32 multiply",
    "full_mantissa_operands": "float32 multiply",
    "subnormal_products_round_to_nearest": "float32 multiply",
    "subnormal_tie_broken_by_remainder": "float32 multiply",
    "subnormal_tie_broken_by_remainder_2": "float32 multiply",
    "reciprocal_overflow_skips_finite_steps": "reciprocal overflow",
    "backoff_reaches_zero_and_stays": "reciprocal overflow",
    "lowered_interval_grows_next_finite": "growth timing",
}

TEST_RULES = {
    "test_random_configs_and_steps_match_reference": "random sequences",
    "test_inf_in_any_of_two_optimizers_backs_off_once": "two optimizers",
    "test_skipped_step_leaves_params_and_optimizer_state_untouched": "skipped step",
    "test_the_growth_step_is_unscaled_with_the_old_scale": "growth step",
    "test_scale_then_unscale_is_identity_and_keeps_dtype": "scale/unscale",
    "test_found_inf_for_any_inf_or_nan_leaf": "inf/NaN detection",
    "test_large_finite_gradients_are_finite": "inf/NaN detection",
    "test_no_inf_found_in_empty_or_finite_trees": "inf/NaN detection",
    "test_state_dict_round_trip_mid_interval": "state round trip",
    "test_every_reachable_state_reloads": "state round trip",
    "test_a_loaded_tracker_past_the_interval_grows_on_the_next_finite_step": "growth timing",
    "test_static_mode_resets_the_trackers_of_a_loaded_state": "static mode",
    "test_loading_keeps_enabled_as_the_scaler_was_built": "state round trip",
    "test_state_dict_moves_between_backends": "state round trip",
    "test_disabled_scaler_is_a_pass_through": "disabled",
    "test_inf_on_one_rank_skips_on_every_rank": "ranks",
}


def rule_of(test_id: str) -> str:
    """The rule of a test id (``test_x`` or ``test_x[vector]``); ``"?"`` for an unknown test."""
    name, _, param = test_id.partition("[")
    if param:
        return VECTOR_RULES.get(param.rstrip("]"), "?")
    return TEST_RULES.get(name, "?")


#: Rules of vectors about overflow steps; a finite step that diverges in one of them
#: breaks the growth, and an overflow step that diverges in a growth vector the backoff.
_OVERFLOW_RULES = ("backoff", "inf/NaN detection", "hysteresis", "clamps")


def step_rule(rule: str, kind: str) -> str:
    """The rule a vector's diverging step breaks: the vector's own, unless the step is of
    the other kind (a finite step in a backoff vector is a growth).

    Example:
        >>> step_rule("inf/NaN detection", "F"), step_rule("inf/NaN detection", "N")
        ('growth timing', 'inf/NaN detection')
    """
    if kind == "F" and rule in _OVERFLOW_RULES:
        return "growth timing"
    if kind != "F" and rule == "growth timing":
        return "backoff"
    return rule


def rule_of_failure(test_id: str, detail: str) -> str:
    """The rule a failure breaks: the one its message names (``[rule] ...``, from the
    diverging step), else the test's.

    Example:
        >>> rule_of_failure("test_vector[backoff_resets_growth]",
        ...                 "AssertionError: [growth timing] backoff_resets_growth: diverged")
        'growth timing'
    """
    match = re.match(r"(?:\w+: )?(?:compiled: )?\[([^\]]+)\]", detail)
    return match.group(1) if match else rule_of(test_id)
