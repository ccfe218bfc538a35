"""Porting between frameworks (``unifiedamp.porting``), framework-free: native constructor
calls -> config, config -> native keyword arguments, what each native cannot express, and the
errors of bad calls. The trajectories of the real native objects are checked in each
framework's session (tests/<framework>/test_port.py)."""

from __future__ import annotations

import pytest

from unifiedamp import spec
from unifiedamp.porting import NATIVE_SCALERS, config_from_call, from_native, native_call
from unifiedamp.spec import ScalerConfig


def test_every_row_maps_each_canonical_parameter_once():
    # A canonical parameter neither mapped nor fixed would silently take the spec default.
    for name, row in NATIVE_SCALERS.items():
        for key, version in row["versions"].items():
            merged = {**row, **version}
            mapped = set(merged["names"].values())
            if "factor" in merged["params"]:
                mapped |= {"growth_factor", "backoff_factor"}
            fixed = set(merged["fixed"])
            assert not mapped & fixed, (name, key, mapped & fixed)
            missing = set(spec.CANONICAL) - mapped - fixed
            if name != "jmp.StaticLossScale":  # static: the growth parameters never act
                assert not missing, (name, key, missing)


@pytest.mark.parametrize(("version", "expected"), [
    ("2.6", (32768.0, 1000, 2)), ("3.3.1", (65536.0, 2000, 1)), (3, (65536.0, 2000, 1))])
def test_paddle_defaults_follow_the_version(version, expected):
    config, notes = config_from_call("paddle.amp.GradScaler", (), {}, version=version)
    assert (config.init_scale, config.growth_interval, config.hysteresis) == expected
    assert f"default: decr_every_n_nan_or_inf={expected[2]} (hysteresis={expected[2]})" in notes


def test_torch_to_paddle_writes_decr_every_n_nan_or_inf_1():
    # paddle 2.x's GradScaler default is 2: a port relying on the default would skip backoffs.
    config, _ = config_from_call("torch.amp.GradScaler", ("cuda",), {"init_scale": 1024.0})
    kwargs, problems = native_call(config, "paddle")
    assert kwargs == {"enable": True, "init_loss_scaling": 1024.0, "incr_ratio": 2.0,
                      "decr_ratio": 0.5, "incr_every_n_steps": 2000,
                      "decr_every_n_nan_or_inf": 1, "use_dynamic_loss_scaling": True}
    assert problems == []
    assert config_from_call("paddle.amp.GradScaler", (), kwargs, version="2")[0] == config


def test_keras_to_torch_carries_32768():
    config, notes = config_from_call("keras.optimizers.LossScaleOptimizer", ("inner",), {})
    kwargs, problems = native_call(config, "torch")
    assert kwargs["init_scale"] == 32768.0 and problems == []
    assert any(n.startswith("inner_optimizer='inner': no canonical meaning") for n in notes)


def test_torch_growth_3_to_keras_needs_the_wrapper():
    config, _ = config_from_call("torch.amp.GradScaler", ("cuda", 1024.0, 3.0))
    kwargs, problems = native_call(config, "keras")
    assert kwargs == {"initial_scale": 1024.0, "dynamic_growth_steps": 2000}
    assert problems == ["keras.optimizers.LossScaleOptimizer cannot express growth_factor=3.0 "
                        "(it hard-codes 2.0): needs unifiedamp's wrapper: "
                        "ua.GradScaler(..., backend='keras').wrap(opt)"]


def test_torch_cannot_express_hysteresis_or_min_scale_and_says_so():
    _, problems = native_call(ScalerConfig(hysteresis=2, min_scale=1.0), "torch")
    assert len(problems) == 2
    assert "hysteresis=2" in problems[0] and "min_scale=1.0" in problems[1]
    assert all("backend='torch'" in p for p in problems)
    _, problems = native_call(ScalerConfig(growth_factor=1.0), "torch")
    assert problems and "growth_factor > 1.0" in problems[0]


def test_jmp_without_min_scale_gets_a_floor_of_one_and_says_so():
    kwargs, problems = native_call(ScalerConfig(1024.0), "jmp")
    assert kwargs == {"loss_scale": 1024.0, "period": 2000, "factor": 2.0, "min_loss_scale": 1.0}
    assert len(problems) == 1 and "floor of 1" in problems[0]
    _, problems = native_call(ScalerConfig(1024.0, min_scale=1.0), "jmp")
    assert problems == []
    _, problems = native_call(ScalerConfig(1024.0, 2.0, 0.25, min_scale=1.0), "jmp")
    assert "one factor" in problems[0]


def test_jmp_factor_is_growth_and_its_reciprocal():
    config, notes = config_from_call("jmp.DynamicLossScale", (1024.0,),
                                     {"period": 10, "factor": 4, "min_loss_scale": 0.0})
    assert config == ScalerConfig(1024.0, 4.0, 0.25, 10)  # min_loss_scale 0: no floor
    assert not any(n.startswith("default") for n in notes)


def test_static_configs_port_to_static_classes():
    config, _ = config_from_call("paddle.amp.GradScaler", (),
                                 {"init_loss_scaling": 128.0, "use_dynamic_loss_scaling": False})
    assert not config.dynamic
    assert native_call(config, "jmp.StaticLossScale") == ({"loss_scale": 128.0}, [])
    _, problems = native_call(config, "jmp")
    assert "jmp.StaticLossScale" in problems[0]
    _, problems = native_call(config, "keras")
    assert problems and "dynamic=False" in problems[0]


def test_bad_calls_fail_as_the_native_would():
    with pytest.raises(TypeError, match="unexpected keyword argument 'init_scal'"):
        config_from_call("torch.amp.GradScaler", (), {"init_scal": 1.0})
    with pytest.raises(TypeError, match="multiple values for argument 'init_scale'"):
        config_from_call("torch.amp.GradScaler", ("cpu", 1.0), {"init_scale": 1.0})
    with pytest.raises(TypeError, match="missing required argument: 'loss_scale'"):
        config_from_call("jmp.DynamicLossScale")
    with pytest.raises(ValueError, match="unknown scaler"):
        native_call(ScalerConfig(), "mxnet")
    with pytest.raises(TypeError, match="from_native takes a torch.amp.GradScaler"):
        from_native(object())


def test_unifiedamp_target_writes_the_whole_config():
    config = ScalerConfig(8.0, hysteresis=3, max_scale=1e6)
    kwargs, problems = native_call(config, "unifiedamp")
    assert ScalerConfig(**kwargs) == config and problems == []
