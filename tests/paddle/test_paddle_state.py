"""The Paddle backend's state: the canonical dict and Paddle's native one, through
``paddle.save``/``paddle.load``, to and from a real ``paddle.amp.GradScaler``, from the other
backends' dicts, an exact resume mid-interval, and bad dicts refused without a change.

What is checked against a real ``paddle.amp.GradScaler`` (the ``native_scaler`` fixture,
tests/paddle/conftest.py) is a fact about the pinned paddle 3.3.1 (CPU build), as in
test_paddle_rule.py; (f) is the row of docs/backends/paddle.md's table of its quirks.
"""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from paddle_helpers import (  # noqa: E402
    INF,
    assert_same,
    batch,
    f32,
    loss_of,
    make_opt,
    mlp,
    native_scale,
    one_step,
    paddle_scalar,
    run_pattern,
    scaler_of,
    snapshot,
)

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402


def trained(scaler, pattern="FFIF"):
    run_pattern(scaler, pattern, check_scaled=False)
    return scaler


def test_canonical_state_dict_round_trips_also_through_paddle_save(tmp_path):
    # Paddle checkpoints go through paddle.save/paddle.load (pickle): the dict must survive.
    source = trained(scaler_of(1024.0, 3.0, 0.25, 5, hysteresis=2, min_scale=2.0))
    d = source.state_dict()
    assert d["backend"] == "paddle" and d["scale"] == 1024.0
    assert (d["growth_tracker"], d["hysteresis_tracker"]) == (1, 0)
    paddle.save(d, str(tmp_path / "scaler.pdparams"))
    for loaded in (d, paddle.load(str(tmp_path / "scaler.pdparams"))):
        target = scaler_of()
        assert target.load_state_dict(loaded) is None  # torch's habit
        assert (target.config, target.state) == (source.config, source.state)
        assert target.state_dict() == d


def test_native_state_dict_has_paddles_keys_and_types(native_scaler):
    # (f) the same keys and value types as a real paddle.amp.GradScaler.state_dict()
    ours = scaler_of(1024.0, growth_interval=5)
    native = native_scaler(init_loss_scaling=1024.0, incr_every_n_steps=5)
    mine, theirs = ours.native_state_dict(), native.state_dict()
    assert sorted(mine) == sorted(theirs) == sorted(
        ["scale", "incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf",
         "incr_count", "decr_count", "use_dynamic_loss_scaling"])
    for key in theirs:
        assert type(mine[key]) is type(theirs[key]), key
    assert mine["scale"].dtype == theirs["scale"].dtype == np.float32
    assert mine["scale"].shape == theirs["scale"].shape == (1,)
    assert_same([mine["scale"]], [theirs["scale"]])
    assert {k: v for k, v in mine.items() if k != "scale"} == {
        k: v for k, v in theirs.items() if k != "scale"}


def test_native_state_dict_loads_into_a_real_paddle_scaler_and_back(native_scaler):
    ours = trained(scaler_of(1024.0, 3.0, 0.25, 5, hysteresis=2), "IIFFFI")
    assert ours.state == spec.ScalerState(256.0, 0, 1)
    # paddle.amp.GradScaler.load_state_dict returns early when disabled (it is on a
    # CPU place): the native scaler is built enabled.
    native = native_scaler()
    native.load_state_dict(ours.native_state_dict())
    got = native.state_dict()
    assert got["scale"].tolist() == [256.0]
    assert (got["incr_ratio"], got["decr_ratio"], got["incr_every_n_steps"],
            got["decr_every_n_nan_or_inf"], got["incr_count"], got["decr_count"],
            got["use_dynamic_loss_scaling"]) == (3.0, 0.25, 5, 2, 0, 1, True)
    # and back: a native dict written by Paddle itself
    back = scaler_of(512.0)
    back.load_state_dict(native.state_dict())
    assert back.state == ours.state
    assert back.config == ours.config.replace(init_scale=512.0)  # Paddle's dict has none


def test_native_dict_written_by_a_training_paddle_scaler_loads(native_scaler):
    # A checkpoint written by Paddle's own scaler mid-training resumes here.
    native = native_scaler(init_loss_scaling=256.0, incr_every_n_steps=5)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    for i in range(3):
        native_scale(native, loss_of(model, *batch(seed=i))).backward()
        native.step(opt)
        native.update()
        opt.clear_grad()
    ours = scaler_of()
    ours.load_state_dict(native.state_dict())
    assert ours.state == spec.ScalerState(256.0, 3, 0) and ours.config.growth_interval == 5


@pytest.mark.parametrize("as_tensor", [False, True])
def test_a_hand_built_native_paddle_dict_loads_with_an_array_or_tensor_scale(as_tensor):
    # Paddle writes the scale as an ndarray; paddle.load turns it into a Tensor. Both load,
    # and the loaded scale is the one used (scale tensor and hysteresis count included).
    scale = np.array([512.0], np.float32)
    d = {"scale": paddle.to_tensor(scale) if as_tensor else scale, "incr_ratio": 3.0,
         "decr_ratio": 0.25, "incr_every_n_steps": 7, "decr_every_n_nan_or_inf": 2,
         "incr_count": 5, "decr_count": 1, "use_dynamic_loss_scaling": True}
    scaler = scaler_of(2048.0, min_scale=1.0)
    scaler.load_state_dict(d)
    assert scaler.state == spec.ScalerState(512.0, 5, 1)
    assert scaler.config == ua.ScalerConfig(2048.0, 3.0, 0.25, 7, hysteresis=2, min_scale=1.0)
    assert scaler.scale(paddle_scalar(1.0)).item() == 512.0  # the loaded scale is used
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    one_step(scaler, model, opt, poison=INF)  # the second inf in a row: backs off
    assert scaler.state == spec.ScalerState(128.0, 0, 0)


def test_native_state_dict_refuses_configs_paddle_cannot_carry():
    # Paddle's format would silently drop these options: refuse, naming the option.
    for config in ({"min_scale": 1.0}, {"max_scale": 1e6}, {"growth_factor": 1.0},
                   {"backoff_factor": 1.0}):
        scaler = scaler_of(**config)
        (name, value), = config.items()
        with pytest.raises(ValueError, match=rf"cannot carry this config.*{name}={value}"):
            scaler.native_state_dict()
        assert scaler.state_dict()["config"][name] == value  # the canonical dict carries it


def test_canonical_dict_from_the_numpy_backend_loads():
    # A run moves between backends through the canonical dict.
    from unifiedamp.backends.numpy import SGD

    source = ua.GradScaler(1024.0, 3.0, 0.25, 3, backend="numpy", hysteresis=2)
    opt = SGD([np.zeros(2, np.float32)])
    for grad in ([1.0, 1.0], [1.0, np.inf], [1.0, 1.0]):
        opt.grads = [np.array(grad, np.float32)]
        source.step(opt)
        source.update()
    target = scaler_of()
    target.load_state_dict(source.state_dict())
    assert target.state == source.state == spec.ScalerState(1024.0, 1, 0)
    assert target.config == source.config


@pytest.mark.parametrize("via", ["canonical", "native"])
def test_resume_mid_interval_is_exact(tmp_path, via):
    # Save mid-interval, load into a fresh scaler, continue: step by step the same as never
    # stopping (a lost tracker would grow late; a lost scale tensor would unscale wrongly).
    pattern, k = "FFIFFIIFFFFFIF", 5  # after 5 updates: growth_tracker 2 of 3
    config = {"init_scale": 1024.0, "growth_interval": 3, "hysteresis": 1}
    full_model = mlp()
    full_opt = make_opt("adam", full_model.parameters())
    full = run_pattern(scaler_of(**config), pattern, full_model, full_opt)

    model = mlp()
    opt = make_opt("adam", model.parameters())
    first = scaler_of(**config)
    head = run_pattern(first, pattern[:k], model, opt)
    assert head[-1].growth_tracker == 2  # mid-interval
    d = first.state_dict() if via == "canonical" else first.native_state_dict()
    path = str(tmp_path / "scaler.pdparams")
    paddle.save(d, path)
    second = scaler_of(**config) if via == "native" else scaler_of()
    second.load_state_dict(paddle.load(path))
    tail = run_pattern(second, pattern[k:], model, opt, start=k)
    for i, (a, b) in enumerate(zip(full, head + tail, strict=True)):
        assert (f32(a.scale), a.growth_tracker, a.hysteresis_tracker) == (
            f32(b.scale), b.growth_tracker, b.hysteresis_tracker), i
    assert_same(snapshot(full_model, full_opt), snapshot(model, opt))


BAD_DICTS = [
    ("growth_tracker", 2**31, "growth_tracker must be <="),
    ("growth_tracker", -1, "growth_tracker must be an int >= 0"),
    ("hysteresis_tracker", 1.5, "hysteresis_tracker must be an int"),
    ("scale", -1.0, "scale must be finite and >= 0"),
    ("scale", INF, "scale must be finite"),
    ("scale", 1e39, "scale must be finite"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD_DICTS)
def test_a_bad_canonical_dict_raises_and_changes_nothing(key, value, message):
    # The bad dict's config is valid and differs from the scaler's: a load that wrote
    # the config before validating the rest would show.
    other = trained(scaler_of(64.0, 3.0, 0.25, 9, hysteresis=2, min_scale=1.0), "FI")
    bad = {**other.state_dict(), key: value}
    scaler = trained(scaler_of(1024.0, growth_interval=5))
    assert_unchanged_by(scaler, bad, message)


@pytest.mark.parametrize("changes", [{"incr_count": 2**31}, {"scale": np.array([1.0, 2.0])},
                                     {"incr_ratio": 0.5}, {"decr_count": -1},
                                     {"scale": np.array([-1.0], np.float32)}])
def test_a_bad_native_dict_raises_and_changes_nothing(changes):
    # Paddle's own load_state_dict writes each key as it goes; ours validates first.
    good = {"scale": np.array([64.0], np.float32), "incr_ratio": 3.0, "decr_ratio": 0.25,
            "incr_every_n_steps": 9, "decr_every_n_nan_or_inf": 2, "incr_count": 1,
            "decr_count": 1, "use_dynamic_loss_scaling": True}
    scaler = trained(scaler_of(1024.0, growth_interval=5))
    assert_unchanged_by(scaler, {**good, **changes}, "nothing was loaded")


def assert_unchanged_by(scaler, bad, message):
    def everything():
        return (scaler.state_dict(), scaler.config, scaler.state, scaler.get_scale(),
                scaler._incr_ratio, scaler._incr_every_n_steps, scaler._incr_count,
                scaler._decr_count, scaler.scale(paddle_scalar(1.0)).item())

    before = everything()
    with pytest.raises(ValueError, match=message):
        scaler.load_state_dict(bad)
    assert everything() == before


def test_empty_dict_from_a_disabled_paddle_scaler_is_refused():
    # A disabled Paddle scaler saves {}: loading it must say so, not reset the state.
    with pytest.warns(UserWarning, match="can only be enabled"):
        empty = paddle.amp.GradScaler().state_dict()
    assert empty == {}
    scaler = trained(scaler_of(1024.0))
    assert_unchanged_by(scaler, empty, "it is empty")
    # Paddle's own enabled scaler raises RuntimeError here (grad_scaler.py, "The input state
    # dict is empty"): `except RuntimeError` around a resume catches ours too.
    with pytest.raises(RuntimeError, match="it is empty"):
        scaler.load_state_dict(empty)


def test_loading_keeps_the_loading_scalers_enabled():
    # enabled is the loading run's choice (e.g. eval with scaling off), not the checkpoint's.
    on = trained(scaler_of(256.0))
    off = scaler_of(64.0, enabled=False)
    off.load_state_dict(on.state_dict())
    assert not off.is_enabled() and off.state == on.state and off.get_scale() == 1.0
    on2 = scaler_of(1024.0)
    on2.load_state_dict(scaler_of(64.0, enabled=False).state_dict())
    assert on2.is_enabled() and on2.is_enable() and on2.get_scale() == 64.0


