"""The rule each test checks, in a few words: the first column of the matrix; and the
causes a failure names.

A test's rule says what it checks, never why a scaler failed it: a failure is named
by its causes (:mod:`._causes`), which its message carries as ``[cause; cause]``.

Example:
    >>> rule_of("test_vector[hysteresis_two]"), rule_of("test_disabled_scaler_is_a_pass_through")
    ('hysteresis', 'disabled')
"""

from __future__ import annotations

import re

__all__ = ["RULES", "TEST_RULES", "VECTOR_RULES", "causes_of", "rule_of"]

RULES = ("growth timing", "backoff", "hysteresis", "clamps", "static mode", "inf/NaN detection",
         "float32 multiply", "reciprocal overflow", "growth overflow", "growth step",
         "skipped step", "two optimizers", "scale/unscale", "state round trip", "disabled",
         "ranks", "all rules")

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
    "backoff_factor_rounded_to_float32_every_update": "float32 multiply",
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
    "test_random_configs_and_steps_match_reference": "all rules",
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


def causes_of(detail: str) -> list[str]:
    """The causes a failure's message names (``[cause; cause] ...``: the departures from
    the spec that reproduce the scaler's steps, see :mod:`._causes`), or
    ``["unexplained: <the message's first line>"]``.

    Example:
        >>> causes_of("AssertionError: [grows one step late; floor of 1] v: diverged at step 3")
        ['grows one step late', 'floor of 1']
        >>> causes_of("AssertionError: assert False")
        ['unexplained: AssertionError: assert False']
    """
    # Hypothesis's multi-failure lists each failure on a line of its own.
    found: list[str] = []
    for line in detail.splitlines():
        match = re.match(r"\W*(?:failure \d+ of \d+: )?(?:\w+: )?(?:compiled: )?\[([^\]]+)\]",
                         line)
        found += [c for c in match.group(1).split("; ") if c not in found] if match else []
    if found:
        return found
    return [f"unexplained: {detail.splitlines()[0][:200] if detail else 'no message'}"]
