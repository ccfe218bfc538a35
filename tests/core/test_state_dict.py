"""The canonical state_dict: round trip, every corruption, native paddle dicts (a real torch
scaler's dict: tests/torch/test_state_dict.py; what every backend shares:
tests/support/state_dict_checks.py)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from state_dict_checks import Int32LoadContract, TrackerBoundContract

import unifiedamp as ua
from unifiedamp import spec
from unifiedamp.backends.numpy import SGD


def trained_scaler(steps: str = "FFIFF", **config) -> ua.GradScaler:
    config = {"init_scale": 1024.0, "growth_interval": 4, "hysteresis": 2, **config}
    scaler = ua.GradScaler(backend="numpy", **config)
    opt = SGD([np.zeros(2, np.float32)])
    for kind in steps:
        opt.grads = [np.array([1.0, {"F": 1.0, "I": np.inf}[kind]], np.float32)]
        scaler.step(opt)
        scaler.update()
    return scaler


def test_state_dict_has_the_canonical_keys_and_is_json_serialisable():
    d = trained_scaler(min_scale=2.0).state_dict()
    assert d["format"] == "unifiedamp.GradScaler" and d["version"] == 1
    assert d["backend"] == "numpy"
    assert set(d["config"]) == set(spec.CANONICAL)
    assert (d["scale"], d["growth_tracker"], d["hysteresis_tracker"]) == (1024.0, 2, 0)
    assert type(d["scale"]) is float and type(d["growth_tracker"]) is int
    assert json.loads(json.dumps(d)) == d


def test_round_trip_mid_interval_continues_the_exact_trajectory():
    a = trained_scaler("FFIFF")
    b = ua.GradScaler(backend="numpy")
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.config == a.config and b.state == a.state
    rest = "FFIIIFFFFF"
    a2, b2 = trained_scaler("FFIFF" + rest), trained_scaler("", **{})
    b2.load_state_dict(b.state_dict())
    opt = SGD([np.zeros(2, np.float32)])
    for kind in rest:
        opt.grads = [np.array([1.0, {"F": 1.0, "I": np.inf}[kind]], np.float32)]
        b2.step(opt)
        b2.update()
    assert b2.state == a2.state


def test_loading_keeps_this_scalers_enabled_flag():
    disabled = ua.GradScaler(8.0, enabled=False, backend="numpy")
    assert disabled.state_dict()["config"]["enabled"] is False
    enabled = ua.GradScaler(backend="numpy")
    enabled.load_state_dict(disabled.state_dict())
    assert enabled.is_enabled() and enabled.get_scale() == 8.0


def corruptions():
    good = spec.to_state_dict(spec.ScalerConfig(1024.0), spec.ScalerState(512.0, 3, 1), "numpy")

    def edit(fn):
        d = copy.deepcopy(good)
        fn(d)
        return d

    return [
        ("other format", edit(lambda d: d.update(format="torch")), "format must be"),
        ("other version", edit(lambda d: d.update(version=2)), "version 2 is not supported"),
        ("no version", edit(lambda d: d.pop("version")), "version None is not supported"),
        ("no scale", edit(lambda d: d.pop("scale")), r"missing key\(s\) \['scale'\]"),
        ("no growth tracker", edit(lambda d: d.pop("growth_tracker")), "missing key"),
        ("no hysteresis tracker", edit(lambda d: d.pop("hysteresis_tracker")), "missing key"),
        ("no config", edit(lambda d: d.pop("config")), "missing key"),
        ("no backend", edit(lambda d: d.pop("backend")), "missing key"),
        ("config not a dict", edit(lambda d: d.update(config=[1])), "config must be a dict"),
        ("config lacks a key", edit(lambda d: d["config"].pop("hysteresis")),
         r"config is missing \['hysteresis'\]"),
        ("config has extra key", edit(lambda d: d["config"].update(foo=1)), "unknown key"),
        ("invalid config value", edit(lambda d: d["config"].update(growth_interval=0)),
         "growth_interval must be an int with 1 <= growth_interval <= 2147483647, got 0"),
        ("scale negative", edit(lambda d: d.update(scale=-2.0)), "scale must be finite"),
        ("scale inf", edit(lambda d: d.update(scale=math.inf)), "scale must be finite"),
        ("scale nan", edit(lambda d: d.update(scale=math.nan)), "scale must be finite"),
        ("scale overflows float32", edit(lambda d: d.update(scale=1e39)), "scale must be finite"),
        ("scale a string", edit(lambda d: d.update(scale="1024")), "scale must be a number"),
        ("scale a bool", edit(lambda d: d.update(scale=True)), "scale must be a number"),
        ("negative growth tracker", edit(lambda d: d.update(growth_tracker=-1)),
         "growth_tracker must be an int >= 0, got growth_tracker=-1"),
        ("float tracker", edit(lambda d: d.update(hysteresis_tracker=1.0)),
         "hysteresis_tracker must be an int >= 0"),
        ("bool tracker", edit(lambda d: d.update(growth_tracker=True)), "must be an int >= 0"),
        ("growth tracker past int32", edit(lambda d: d.update(growth_tracker=2**31)),
         "growth_tracker must be <= 2147483646 .*, got growth_tracker=2147483648"),
        ("hysteresis tracker at int32 max",
         edit(lambda d: d.update(hysteresis_tracker=2**31 - 1)),
         "hysteresis_tracker must be <= 2147483646"),
        ("older version", edit(lambda d: d.update(version=0)), "version 0 is not supported"),
        ("version a bool", edit(lambda d: d.update(version=True)), "version True is not supported"),
        ("version a float", edit(lambda d: d.update(version=1.0)),
         "version must be the int 1, got the float 1.0"),
        ("scale an int past float64", edit(lambda d: d.update(scale=10**400)),
         "scale must be finite and >= 0 in float32, got an int of 401 digits"),
        ("backend not a name", edit(lambda d: d.update(backend=123)),
         "backend must be the name of the backend that wrote it, got 123"),
        ("backend empty", edit(lambda d: d.update(backend="")), "backend must be the name"),
        ("config past int32", edit(lambda d: d["config"].update(hysteresis=2**31)),
         "hysteresis must be an int with 1 <= hysteresis <= 2147483647"),
        ("config factor that rounds to 0", edit(lambda d: d["config"].update(backoff_factor=1e-46)),
         "backoff_factor must be"),
        ("empty", {}, "it is empty"),
        ("unrelated dict", {"lr": 0.1}, "no 'format' key"),
    ]


@pytest.mark.parametrize("name,bad,message", corruptions(), ids=[c[0] for c in corruptions()])
def test_every_corruption_is_rejected_and_changes_nothing(name, bad, message):
    scaler = trained_scaler()
    before_config, before_state = scaler.config, scaler.state
    with pytest.raises(ValueError, match=message) as info:
        scaler.load_state_dict(bad)
    assert "nothing was loaded" in str(info.value)
    assert scaler.config == before_config and scaler.state == before_state


def test_a_dict_written_by_any_backend_name_loads_and_is_then_this_backends():
    d = {**ua.GradScaler(512.0, backend="numpy").state_dict(), "backend": "tensorflow"}
    scaler = ua.GradScaler(backend="numpy")
    scaler.load_state_dict(d)
    assert scaler.get_scale() == 512.0 and scaler.state_dict()["backend"] == "numpy"


def test_a_non_mapping_is_a_type_error():
    with pytest.raises(TypeError, match="state_dict must be a dict, got list"):
        trained_scaler().load_state_dict([("scale", 1.0)])


def test_native_paddle_state_dict_is_accepted():
    # paddle.amp.GradScaler.state_dict() format (paddle 3.3.1): scale as a numpy array.
    native = {"scale": np.array([2048.0], np.float32), "incr_ratio": 3.0, "decr_ratio": 0.25,
              "incr_every_n_steps": 50, "decr_every_n_nan_or_inf": 2, "incr_count": 7,
              "decr_count": 1, "use_dynamic_loss_scaling": True}
    scaler = ua.GradScaler(min_scale=1.0, backend="numpy")
    scaler.load_state_dict(native)
    assert scaler.state == spec.ScalerState(2048.0, 7, 1)
    c = scaler.config
    assert (c.growth_factor, c.backoff_factor, c.growth_interval, c.hysteresis) == (
        3.0, 0.25, 50, 2)
    assert c.min_scale == 1.0  # not in the native dict: kept


def test_native_paddle_dict_with_bad_values_changes_nothing():
    scaler = trained_scaler()
    before = scaler.state_dict()
    bad = {"scale": np.array([2048.0, 1.0]), "incr_count": 0, "decr_count": 0}
    with pytest.raises(ValueError, match="scale must hold one value, got 2"):
        scaler.load_state_dict(bad)
    with pytest.raises(ValueError, match="growth_interval must be an int with 1 <="):
        scaler.load_state_dict({"scale": 8.0, "incr_count": 0, "decr_count": 0,
                                "incr_every_n_steps": 0})
    assert scaler.state_dict() == before


@pytest.mark.parametrize("key", ["incr_count", "decr_count", "scale"])
def test_a_native_paddle_dict_missing_a_key_names_it_and_changes_nothing(key):
    native = {"scale": np.array([2048.0], np.float32), "incr_ratio": 3.0, "decr_ratio": 0.25,
              "incr_every_n_steps": 50, "decr_every_n_nan_or_inf": 2, "incr_count": 7,
              "decr_count": 1, "use_dynamic_loss_scaling": True}
    del native[key]
    scaler = trained_scaler()
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=rf"missing key\(s\) \['{key}'\] \(a native paddle "
                                         r"GradScaler dict has .*nothing was loaded"):
        scaler.load_state_dict(native)
    assert scaler.state_dict() == before


def test_a_loaded_scale_is_rounded_to_float32():
    scaler = ua.GradScaler(backend="numpy")
    d = scaler.state_dict()
    d["scale"] = 0.1
    scaler.load_state_dict(d)
    assert scaler.get_scale() == spec.f32(0.1) != 0.1


def test_a_torch_dict_without_its_tracker_is_a_validation_error():
    with pytest.raises(ValueError, match="no 'format' key and not a torch or paddle "
                                         "GradScaler dict"):
        ua.GradScaler(backend="numpy").load_state_dict(
            {"scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 10})


def test_a_checkpoint_whose_init_scale_is_outside_its_bounds_still_loads():
    # Written by a release that let GradScaler(max_scale=1024.0) keep the default
    # init_scale 65536: the running scale is what the bounds act on.
    config = {**spec.ScalerConfig().to_dict(), "max_scale": 1024.0}
    d = {**spec.to_state_dict(spec.ScalerConfig(), spec.ScalerState(1024.0, 3, 0), "numpy"),
         "config": config}
    scaler = ua.GradScaler(backend="numpy")
    scaler.load_state_dict(d)
    assert scaler.state == spec.ScalerState(1024.0, 3, 0) and scaler.config.max_scale == 1024.0


class TestStateDict(TrackerBoundContract, Int32LoadContract):
    backend = "numpy"
