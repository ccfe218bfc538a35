"""Validation of every parameter, aliases, conflicts and unknown names."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import weakref

import numpy as np
import pytest

import unifiedamp as ua
from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, config_from_args


def test_defaults_and_positional_order_follow_the_seed():
    c = ScalerConfig()
    assert (c.init_scale, c.growth_factor, c.backoff_factor, c.growth_interval, c.enabled) == (
        65536.0, 2.0, 0.5, 2000, True)
    assert (c.hysteresis, c.min_scale, c.max_scale, c.dynamic) == (1, None, None, True)
    assert ScalerConfig(1.0, 3.0, 0.25, 7, False) == ScalerConfig(
        init_scale=1.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7, enabled=False)


def test_extras_are_keyword_only():
    with pytest.raises(TypeError):
        ScalerConfig(1.0, 2.0, 0.5, 10, True, 2)


def test_config_is_immutable_and_hashable():
    c = ScalerConfig(8.0)
    with pytest.raises(AttributeError):
        c.init_scale = 1.0
    assert hash(c) == hash(ScalerConfig(8)) and c == ScalerConfig(np.float32(8.0))
    assert {c: 1}[ScalerConfig(8.0)] == 1
    assert weakref.ref(c)() is c  # as the frozen dataclass it was


def test_a_pickled_config_carries_its_fields_not_its_hash():
    """The hash is kept after the first call; with a None field it differs between
    processes on Python 3.11, so a copy must compute its own."""
    c = ScalerConfig(8.0, hysteresis=2)  # min_scale and max_scale are None
    hash(c)
    blob = pickle.dumps(c)
    child = ("import pickle, sys; from unifiedamp.spec import ScalerConfig; "
             "c = pickle.loads(sys.stdin.buffer.read()); "
             "print(hash(c) == hash(ScalerConfig(8.0, hysteresis=2)), "
             "c.replace(hysteresis=3) != c)")
    out = subprocess.run([sys.executable, "-c", child], input=blob, capture_output=True,
                         check=True).stdout.split()
    assert out == [b"True", b"True"]


def test_numpy_scalars_are_normalised_to_python_types():
    c = ScalerConfig(np.float64(4.0), growth_interval=np.int64(3), enabled=np.bool_(True))
    assert type(c.init_scale) is float and type(c.growth_interval) is int
    assert type(c.enabled) is bool


VALID = {
    "init_scale": [1e-30, 1.0, 65536, 3.4e38],
    "growth_factor": [1, 1.0, 2.0, 1e30],
    "backoff_factor": [1e-6, 0.5, 1, 1.0],
    "growth_interval": [1, 2000, np.int32(5), 2**31 - 1],
    "enabled": [True, False, np.bool_(False)],
    "hysteresis": [1, 2, 100, 2**31 - 1],
    "min_scale": [None, 1e-30, 1.0],
    "max_scale": [None, 65536.0, 3.4e38],
    "dynamic": [True, False],
}

INVALID = {
    "init_scale": [(0.0, ValueError), (-1.0, ValueError), (math.inf, ValueError),
                   (math.nan, ValueError), (1e39, ValueError), (1e-50, ValueError),
                   (True, TypeError), ("1024", TypeError), (None, TypeError),
                   (10**400, ValueError)],
    "growth_factor": [(0.99, ValueError), (0.0, ValueError), (math.inf, ValueError),
                      (math.nan, ValueError), (False, TypeError), ("2", TypeError),
                      (1e308, ValueError), (10**400, ValueError)],
    "backoff_factor": [(0.0, ValueError), (-0.5, ValueError), (1.01, ValueError),
                       (math.nan, ValueError), (True, TypeError), (1e-46, ValueError)],
    "growth_interval": [(0, ValueError), (-1, ValueError), (2.0, TypeError),
                        (True, TypeError), ("10", TypeError), (2**31, ValueError),
                        (sys.maxsize, ValueError)],
    "enabled": [(1, TypeError), (0, TypeError), ("yes", TypeError), (None, TypeError)],
    "hysteresis": [(0, ValueError), (1.5, TypeError), (True, TypeError), (2**31, ValueError)],
    "min_scale": [(0.0, ValueError), (-1.0, ValueError), (math.inf, ValueError),
                  (1e39, ValueError), ("1", TypeError), (10**400, ValueError)],
    "max_scale": [(0.0, ValueError), (math.nan, ValueError), (False, TypeError)],
    "dynamic": [(1, TypeError), ("False", TypeError)],
}


@pytest.mark.parametrize("name,value", [(n, v) for n, vs in VALID.items() for v in vs])
def test_valid_values_are_accepted(name, value):
    assert getattr(ScalerConfig(**{name: value}), name) == value


@pytest.mark.parametrize("name,value,exc",
                         [(n, v, e) for n, vs in INVALID.items() for v, e in vs])
def test_invalid_values_name_the_parameter_the_value_and_the_rule(name, value, exc):
    with pytest.raises(exc) as info:
        ScalerConfig(**{name: value})
    message = str(info.value)
    assert message.startswith(f"{name} must be ")
    assert message.endswith(f"got {value!r}")


def test_growth_interval_message_is_exact():
    with pytest.raises(ValueError, match=r"^growth_interval must be an int with 1 <= "
                                         r"growth_interval <= 2147483647, got 0$"):
        ScalerConfig(growth_interval=0)


def test_min_scale_above_max_scale_is_rejected_naming_both():
    with pytest.raises(ValueError, match=r"min_scale must be <= max_scale, got min_scale=4.0 "
                                         r"and max_scale=2.0"):
        ScalerConfig(min_scale=4.0, max_scale=2.0)
    assert ScalerConfig(2.0, min_scale=2.0, max_scale=2.0).min_scale == 2.0


ALIAS_CASES = [
    ("initScale", "init_scale", 8.0), ("growthFactor", "growth_factor", 3.0),
    ("backoffFactor", "backoff_factor", 0.25), ("growthInterval", "growth_interval", 9),
    ("init_loss_scaling", "init_scale", 8.0), ("incr_ratio", "growth_factor", 3.0),
    ("decr_ratio", "backoff_factor", 0.25), ("incr_every_n_steps", "growth_interval", 9),
    ("decr_every_n_nan_or_inf", "hysteresis", 2), ("enable", "enabled", False),
    ("use_dynamic_loss_scaling", "dynamic", False), ("initial_scale", "init_scale", 8.0),
    ("dynamic_growth_steps", "growth_interval", 9), ("loss_scale", "init_scale", 8.0),
    ("period", "growth_interval", 9), ("min_loss_scale", "min_scale", 1.0),
    ("minScale", "min_scale", 1.0), ("maxScale", "max_scale", 1e6),
]


@pytest.mark.parametrize("alias,canonical,value", ALIAS_CASES)
def test_every_alias_sets_its_canonical_parameter(alias, canonical, value):
    assert getattr(config_from_args((), {alias: value}), canonical) == value
    assert getattr(ua.GradScaler(backend="numpy", **{alias: value}).config, canonical) == value


def test_aliases_rename_but_keep_our_defaults():
    # Paddle's default interval is 1000; a Paddle spelling does not bring it along.
    assert config_from_args((), {"incr_ratio": 2.0}).growth_interval == 2000


def test_alias_values_are_validated_under_the_canonical_name():
    with pytest.raises(ValueError, match="growth_interval must be an int with 1 <= "
                                         "growth_interval <= 2147483647, got 0"):
        config_from_args((), {"incr_every_n_steps": 0})


def test_two_spellings_of_one_parameter_are_an_error_naming_both():
    with pytest.raises(TypeError, match=r"init_scale was given twice, as 'initScale' and as "
                                        r"'init_loss_scaling'"):
        config_from_args((), {"initScale": 1.0, "init_loss_scaling": 2.0})
    with pytest.raises(TypeError, match=r"init_scale was given twice, as positional argument 1 "
                                        r"and as 'initScale'"):
        config_from_args((4.0,), {"initScale": 1.0})
    with pytest.raises(TypeError, match="growth_interval was given twice"):
        ua.GradScaler(backend="numpy", period=3, growth_interval=3)


@pytest.mark.parametrize("typo,suggestion", [
    ("initScal", "initScale"), ("growth_intervall", "growth_interval"),
    ("backof_factor", "backoff_factor"), ("min_loss_scal", "min_loss_scale"),
    ("INITSCALE", "initScale"), ("max_consecutive_skip", "max_consecutive_skips"),
])
def test_unknown_names_suggest_the_closest_valid_name(typo, suggestion):
    with pytest.raises(TypeError, match=rf"^Unknown parameter: '{typo}' \(did you mean "
                                        rf"'{suggestion}'\?\)$"):
        ua.GradScaler(backend="numpy", **{typo: 1})


def test_unknown_name_with_no_close_match_lists_valid_names():
    with pytest.raises(TypeError, match=r"Unknown parameter: 'zzz'; valid names: init_scale"):
        config_from_args((), {"zzz": 1})


def test_more_than_five_positional_values_is_an_error():
    with pytest.raises(TypeError, match="at most 5 positional parameters"):
        config_from_args((1.0, 2.0, 0.5, 10, True, 2), {})


def test_positional_values_work_through_the_facade():
    s = ua.GradScaler(8.0, 3.0, 0.25, 9, True, backend="numpy")
    assert s.config == ScalerConfig(8.0, 3.0, 0.25, 9, True)


def test_replace_validates_and_leaves_the_original_untouched():
    c = ScalerConfig(8.0)
    with pytest.raises(ValueError):
        c.replace(backoff_factor=2.0)
    assert c.replace(initScale=4.0).init_scale == 4.0 and c.init_scale == 8.0


def test_spec_document_lists_every_alias_once():
    doc = spec.spec_document()
    listed = [a for p in doc["parameters"] for a in p["aliases"]]
    assert sorted(listed) == sorted(spec.ALIASES)
    assert [p["name"] for p in doc["parameters"]] == list(spec.CANONICAL)


def test_an_interval_past_int32_says_how_to_never_grow():
    with pytest.raises(ValueError, match=r"trackers count in int32 on devices; "
                                         r"growth_factor=1.0 never grows\), got 2147483648$"):
        ScalerConfig(growth_interval=2**31)


@pytest.mark.parametrize("bounds,name", [({"min_scale": 2.0}, "min_scale"),
                                         ({"max_scale": 0.5}, "max_scale")])
def test_a_new_scaler_outside_its_bounds_is_rejected_naming_both(bounds, name):
    with pytest.raises(ValueError, match=rf"init_scale must be within \[min_scale, max_scale\], "
                                         rf"got init_scale=1.0 and {name}="):
        ua.GradScaler(1.0, backend="numpy", **bounds)
    ua.GradScaler(1.0, min_scale=1.0, max_scale=1.0, backend="numpy")  # the bounds are inside
    # A bound changed mid-run, or a loaded state, keeps init_scale as a record only.
    running = config_from_args((1024.0,), {"max_scale": 2.0**20})
    assert running.replace(max_scale=512.0).max_scale == 512.0


def test_zero_d_numpy_arrays_are_their_numbers_and_larger_arrays_are_refused():
    c = ScalerConfig(np.asarray(2.0**15), growth_interval=np.asarray(7), enabled=np.asarray(True),
                     min_scale=np.float32(1.0))
    assert (c.init_scale, c.growth_interval, c.enabled, c.min_scale) == (32768.0, 7, True, 1.0)
    assert type(c.growth_interval) is int and type(c.enabled) is bool
    with pytest.raises(TypeError, match=r"init_scale must be a number, got an array of "
                                        r"shape \(2,\)"):
        ScalerConfig(np.ones(2))


def test_jmp_factor_says_it_stands_for_two_parameters():
    with pytest.raises(TypeError, match=r"Unknown parameter: 'factor' \(jmp's factor=f means "
                                        r"growth_factor=f and backoff_factor=1/f: pass both\)"):
        ua.GradScaler(backend="numpy", factor=2)


def test_bounds_are_compared_as_the_float32_values_the_rule_uses():
    # 1 + 1e-9 is above 1.0 but rounds to it: as float32 bounds, min == max.
    c = ScalerConfig(1.0, min_scale=1.0 + 1e-9, max_scale=1.0)
    assert spec.f32(c.min_scale) == spec.f32(c.max_scale) == 1.0


@pytest.mark.parametrize("bound", [{"min_scale": 0.7}, {"max_scale": 0.1}])
def test_init_scale_at_a_bound_after_float32_rounding_is_within_it(bound):
    # f32(0.7) < 0.7 and f32(0.1) > 0.1: init_scale equal to its bound is inside only
    # when both are compared as the float32 values the rule uses.
    (value,) = bound.values()
    assert ua.GradScaler(value, backend="numpy", **bound).get_scale() == spec.f32(value)
