"""The canonical state_dict: round trip, every corruption, native torch and paddle dicts."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

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


@pytest.mark.framework("torch")
def test_native_torch_state_dict_from_a_real_torch_scaler_is_accepted():
    torch = pytest.importorskip("torch")
    native_scaler = torch.amp.GradScaler("cpu", init_scale=4096.0, growth_factor=4.0,
                                         backoff_factor=0.25, growth_interval=10)
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.1)
    for _ in range(3):
        native_scaler.scale(param.sum()).backward()
        native_scaler.step(opt)
        native_scaler.update()
        opt.zero_grad()
    scaler = ua.GradScaler(backend="numpy")
    scaler.load_state_dict(native_scaler.state_dict())
    assert scaler.state == spec.ScalerState(4096.0, 3, 0)
    c = scaler.config
    assert (c.growth_factor, c.backoff_factor, c.growth_interval) == (4.0, 0.25, 10)


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


def imperative_backends():
    yield "numpy"
    yield pytest.param("torch", marks=pytest.mark.framework("torch"))


@pytest.mark.parametrize("backend", list(imperative_backends()))
@pytest.mark.parametrize("bad", [{"growth_tracker": 2**31}, {"hysteresis_tracker": 2**40},
                                 {"config": {"growth_interval": 2**31}}])
def test_a_tracker_or_interval_past_int32_loads_nothing_on_any_backend(backend, bad):
    # torch wrote the config and the scale, then failed on the int32 tracker.
    if backend == "torch":
        pytest.importorskip("torch")
    scaler = ua.GradScaler(1024.0, growth_interval=100, backend=backend)
    scaler.load_state_dict(ua.GradScaler(512.0, growth_interval=50, backend="numpy").state_dict())
    before_config, before_state = scaler.config, scaler.state
    d = scaler.state_dict()
    d.update({k: v for k, v in bad.items() if k != "config"})
    d["config"].update(bad.get("config", {}))
    with pytest.raises(ValueError, match="nothing was loaded"):
        scaler.load_state_dict(d)
    assert scaler.config == before_config and scaler.state == before_state


def test_a_checkpoint_whose_init_scale_is_outside_its_bounds_still_loads():
    # Written by a release that let GradScaler(max_scale=1024.0) keep the default
    # init_scale 65536: the running scale is what the bounds act on.
    config = {**spec.ScalerConfig().to_dict(), "max_scale": 1024.0}
    d = {**spec.to_state_dict(spec.ScalerConfig(), spec.ScalerState(1024.0, 3, 0), "numpy"),
         "config": config}
    scaler = ua.GradScaler(backend="numpy")
    scaler.load_state_dict(d)
    assert scaler.state == spec.ScalerState(1024.0, 3, 0) and scaler.config.max_scale == 1024.0


def every_backend():
    yield "numpy"
    for name in ("torch", "paddle", "jax", "mlx", "keras"):
        yield pytest.param(name, marks=pytest.mark.framework(name))


@pytest.mark.parametrize("backend", list(every_backend()))
def test_a_tracker_loaded_past_its_bound_acts_at_the_next_update_on_every_backend(backend):
    # A state set_growth_interval / set_hysteresis can reach, saved and loaded (a paddle
    # dict whose decr_count exceeds decr_every_n_nan_or_inf is the same state): a growth
    # tracker past the interval grows at the next finite update, a hysteresis tracker past
    # the hysteresis backs off at the next non-finite one (the rule's >=). The conformance
    # suite's test_a_loaded_tracker_past_the_interval_grows_on_the_next_finite_step holds
    # the first for every scaler; this holds both for every backend here.
    pytest.importorskip("mlx.core" if backend == "mlx" else backend)
    config = spec.ScalerConfig(1024.0, growth_interval=4, hysteresis=2)
    cases = [(spec.ScalerState(1024.0, 9, 0), True, spec.ScalerState(2048.0, 0, 0)),
             (spec.ScalerState(1024.0, 0, 5), False, spec.ScalerState(512.0, 0, 0)),
             (spec.ScalerState(1024.0, 0, 5), True, spec.ScalerState(1024.0, 1, 0))]
    for loaded, finite, expected in cases:
        scaler = ua.GradScaler(**config.to_dict(), backend=backend)
        scaler = scaler.restore(spec.to_state_dict(config, loaded, "numpy"))
        assert scaler.state == loaded
        reference = spec.update(config, loaded, found_inf=not finite)
        assert reference == expected
        if backend in ("jax", "mlx"):
            import importlib

            xp = importlib.import_module("jax.numpy" if backend == "jax" else "mlx.core")
            scaler = scaler.update(xp.array(finite))
        else:
            scaler = _update_imperative(scaler, backend, finite)
        assert scaler.state == expected, (backend, loaded, finite)


def _update_imperative(scaler, backend, finite):
    """One iteration of a backend's own verbs with a finite or an inf gradient."""
    value = 1.0 if finite else np.inf
    if backend == "numpy":
        opt = SGD([np.zeros(2, np.float32)])
        opt.grads = [np.array([1.0, value], np.float32)]
        scaler.step(opt)
        scaler.update()
    elif backend == "torch":
        import torch

        w = torch.nn.Parameter(torch.zeros(2))
        opt = torch.optim.SGD([w], lr=0.1)
        scaler.scale((w * torch.tensor([1.0, value])).sum()).backward()
        scaler.step(opt)
        scaler.update()
    elif backend == "paddle":
        import paddle

        w = paddle.create_parameter([2], "float32")
        opt = paddle.optimizer.SGD(parameters=[w])
        scaler.scale((w * paddle.to_tensor([1.0, value])).sum()).backward()
        scaler.step(opt)
        scaler.update()
    else:  # keras: the wrapped optimizer's apply
        import keras

        w = keras.Variable(np.zeros(2, np.float32))
        opt = scaler.wrap(keras.optimizers.SGD(0.1))
        opt.build([w])
        opt.apply([keras.ops.convert_to_tensor(np.array([1.0, value], np.float32)
                                               * scaler.get_scale())], [w])
    return scaler
