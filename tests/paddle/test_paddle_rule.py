"""The Paddle backend is correct on a CPU where ``paddle.amp.GradScaler`` is not: it scales
outside ``auto_cast(float16)``, backs off without raising, sees an inf in any of several
optimizers, refuses an update without a new inf check, never grows to inf, has no floor at 1,
and follows the spec's rule step by step.

paddle 3.3.1 (CPU build, NumPy 2) is pinned: the ``test_native_paddle_*`` tests measure the
quirks of ``paddle.amp.GradScaler`` that the backend exists to fix. They are facts about that
version, so a paddle that changes them fails here loudly instead of skipping. The letters
(a) to (f) in the comments are the rows of docs/backends/paddle.md's table of them.
"""

from __future__ import annotations

import math
import random
import warnings
from contextlib import nullcontext

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from paddle_helpers import (  # noqa: E402
    F32_MAX,
    INF,
    NAN,
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


def test_native_paddle_disables_itself_on_cpu_and_at_scale_outside_fp16_autocast(
        native_scaler):
    # (a) measured on paddle 3.3.1, CPU build
    with pytest.warns(UserWarning, match="can only be enabled on CUDAPlace"):
        native = paddle.amp.GradScaler(init_loss_scaling=1024.0)
    assert native.is_enable() is False
    loss = paddle_scalar(2.0)
    assert native.scale(loss) is loss
    forced = native_scaler(init_loss_scaling=1024.0)
    with pytest.warns(UserWarning, match="not recommended to use dynamic loss scaling for float32"):
        assert forced.scale(loss) is loss
    assert forced.is_enable() is False
    # Only under auto_cast(float16) does it scale; then a 0-d loss comes back with shape [1].
    on = native_scaler(init_loss_scaling=1024.0)
    out = native_scale(on, loss)
    assert out.item() == 2048.0 and list(out.shape) == [1]


@pytest.mark.parametrize("autocast", [None, "float16", "bfloat16"])
def test_scales_on_cpu_whatever_auto_cast_says(autocast):
    # (a) the native scaler built the same way returns the loss unchanged here.
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        scaler = scaler_of(init_loss_scaling=1000.0)
    assert not record  # no "can only be enabled on CUDAPlace"
    assert scaler.is_enable()
    model = mlp()
    x, y = batch()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="amp_guard can only be enabled")
        warnings.filterwarnings("ignore", message="Loss scaling is unnecessary")
        if autocast:
            with paddle.amp.auto_cast(dtype=autocast):
                loss = loss_of(model, x, y)
                scaled = scaler.scale(loss)
        else:
            loss = loss_of(model, x, y)
            scaled = scaler.scale(loss)
    assert scaled.dtype == paddle.float32 and scaled.shape == loss.shape == []
    assert scaled.numpy() == f32(loss.numpy()) * f32(1000.0)  # float32 product
    assert scaler.is_enable() and scaler.is_use_dynamic_loss_scaling()


@pytest.mark.parametrize(("dtype", "shape"), [("float32", []), ("float32", [1]),
                                              ("float32", [3]), ("float64", []),
                                              ("float64", [2]), ("float16", [])])
def test_scaled_loss_keeps_dtype_and_shape(dtype, shape):
    # Native returns a shape-[1] float32 for a 0-d loss; ours keeps shape and dtype, and
    # multiplies exactly as the spec says (float64 by the float32 scale, 16-bit in float32).
    scaler = scaler_of(1000.0)
    value = np.full(shape, 0.1, dtype)
    out = scaler.scale(paddle.to_tensor(value))
    assert out.dtype == getattr(paddle, dtype) and list(out.shape) == shape
    if dtype == "float64":  # multiplied by the float32 scale, in float64
        expected = value * np.float64(f32(1000.0))
    else:  # in float32, rounded back to the loss's dtype
        expected = (value.astype(np.float32) * f32(1000.0)).astype(dtype)
    assert np.array_equal(out.numpy(), expected)


def test_a_tree_of_losses_is_scaled_and_keeps_its_structure():
    # Several losses at once, as torch's scale() takes them; non-tensors are refused.
    scaler = scaler_of(4.0)
    out = scaler.scale({"a": paddle_scalar(1.0), "b": [paddle_scalar(2.0, "float64")],
                        "c": (paddle_scalar(0.5),)})
    assert out["a"].item() == 4.0 and out["b"][0].item() == 8.0 and out["c"][0].item() == 2.0
    assert out["b"][0].dtype == paddle.float64 and isinstance(out["c"], tuple)
    with pytest.raises(TypeError, match="paddle.Tensor"):
        scaler.scale(3.0)


def test_bfloat16_loss_warns_once_that_scaling_is_unnecessary_float32_never():
    # Native disables itself at scale() unless auto_cast set float16; ours keeps scaling
    # a bf16 loss and says once why it is unnecessary; an ordinary float32 loss never warns.
    scaler = scaler_of(1024.0)
    with pytest.warns(UserWarning, match="Loss scaling is unnecessary with bfloat16") as record:
        out = scaler.scale(paddle_scalar(10.0, "bfloat16"))
        scaler.scale(paddle_scalar(3.0, "bfloat16"))
    assert len([w for w in record if "bfloat16" in str(w.message)]) == 1
    assert out.dtype == paddle_scalar(1.0, "bfloat16").dtype and out.shape == []
    assert out.astype("float32").item() == 10240.0  # it still scales
    other = scaler_of(1024.0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        other.scale(paddle_scalar(10.0))
        other.scale(loss_of(mlp(), *batch()))
    assert not record


def test_native_paddle_backoff_raises_type_error_with_numpy_2(native_scaler):
    # (b) its _update prints float(self._scale) of a shape-[1] tensor.
    native = native_scaler(init_loss_scaling=1024.0)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    native_scale(native, loss_of(model, *batch(poison=INF))).backward()
    native.step(opt)
    with pytest.raises(TypeError, match="only 0-dimensional arrays can be converted"):
        native.update()


@pytest.mark.parametrize("autocast", [None, "float16"])
def test_inf_step_backs_off_without_error(autocast):
    # (b) the native scaler raises TypeError at this update().
    scaler = scaler_of(init_loss_scaling=1024.0)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="amp_guard can only be enabled")
        with paddle.amp.auto_cast(dtype=autocast) if autocast else nullcontext():
            loss = loss_of(model, *batch(poison=INF))
        scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.state == spec.ScalerState(512.0, 0, 0) and scaler.last_step_skipped


def two_models_two_optimizers(poisoned):
    a, b = mlp(seed=0), mlp(seed=1)
    opt_a, opt_b = make_opt("sgd", a.parameters()), make_opt("adam", b.parameters())
    losses = [loss_of(m, *batch(poison=INF if i == poisoned else None))
              for i, m in enumerate((a, b))]
    return (a, b), (opt_a, opt_b), losses


def test_native_paddle_loses_an_inf_in_the_first_of_two_optimizers(native_scaler):
    # (c) update() sees only the last step()'s flag: the inf in opt_a is lost and it grows.
    native = native_scaler(init_loss_scaling=1024.0, incr_every_n_steps=1)
    _, (opt_a, opt_b), losses = two_models_two_optimizers(poisoned=0)
    native_scale(native, losses[0] + losses[1]).backward()
    native.step(opt_a)
    native.step(opt_b)
    native.update()
    assert native.state_dict()["scale"].tolist() == [2048.0]


@pytest.mark.parametrize("poisoned", [0, 1])
def test_two_optimizers_each_skips_on_its_own_and_the_scale_backs_off_once(poisoned):
    # (c) each optimizer steps unless ITS gradients are inf (torch's semantics); the
    # update acts on the OR of both, so an inf in the FIRST one backs off too.
    scaler = scaler_of(1024.0, growth_interval=1)
    models, opts, losses = two_models_two_optimizers(poisoned)
    before = [[p.numpy().copy() for p in m.parameters()] for m in models]
    for loss in scaler.scale(losses):  # a list of losses scales in one call
        loss.backward()
    for opt in opts:
        scaler.step(opt)
    scaler.update()
    assert scaler.state == spec.ScalerState(512.0, 0, 0)
    # The counters are the updates': one, which skipped.
    assert scaler.last_step_skipped and (scaler.num_steps, scaler.num_skipped_steps) == (1, 1)
    for i, m in enumerate(models):
        after = [p.numpy() for p in m.parameters()]
        changed = not all(np.array_equal(x, y) for x, y in zip(before[i], after, strict=True))
        assert changed is (i != poisoned), i


def test_native_paddle_update_without_step_reuses_a_stale_flag(native_scaler):
    # (d) the second update() counts the first iteration's finite step again, and grows.
    native = native_scaler(init_loss_scaling=1024.0, incr_every_n_steps=2)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    native_scale(native, loss_of(model, *batch())).backward()
    native.step(opt)
    native.update()
    native.update()
    assert native.state_dict()["scale"].tolist() == [2048.0]


def test_update_without_a_new_inf_check_raises_no_inf_checks():
    # (d) the native scaler would silently reuse the last flag in each of these.
    scaler = scaler_of(1024.0, growth_interval=2)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    scaler.scale(loss_of(model, *batch())).backward()
    with pytest.raises(ua.NoInfChecksError, match=r"^No inf checks were recorded prior to "
                                                  r"update\. .*call scaler\.step\(optimizer\)"):
        scaler.update()  # scale() and backward() only
    scaler.step(opt)
    scaler.update()
    with pytest.raises(ua.NoInfChecksError, match="No inf checks were recorded prior to update"):
        scaler.update()  # nothing since the last update
    with pytest.raises(RuntimeError):  # also a RuntimeError (and torch's AssertionError)
        scaler.update()
    assert scaler.state == spec.ScalerState(1024.0, 1, 0)


def test_native_paddle_growth_past_float32_max_makes_the_scale_inf(native_scaler):
    # (e)
    native = native_scaler(init_loss_scaling=3e38, incr_every_n_steps=1)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    native_scale(native, loss_of(model, *batch()) * 2.0**-120).backward()
    native.step(opt)
    native.update()
    assert math.isinf(native.state_dict()["scale"][0])


@pytest.mark.parametrize("init", [3e38, 2.0**127, F32_MAX])
def test_growth_that_would_overflow_float32_keeps_the_scale(init):
    # (e) spec: an inf candidate keeps the old scale; the tracker restarts.
    scaler = scaler_of(init, growth_interval=1)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    scaler.scale(loss_of(model, *batch()) * 2.0**-120).backward()
    scaler.step(opt)
    scaler.update()
    assert not scaler.last_step_skipped
    assert f32(scaler.get_scale()) == f32(init) and scaler.state.growth_tracker == 0
    assert math.isfinite(scaler.scale(paddle_scalar(1.0)).item())


def test_backoff_goes_below_one_unless_min_scale_says_so():
    # The spec has no floor at 1 (only min_scale): a clamp at 1 would be a silent floor.
    for config, expected in (({}, [0.5, 0.25, 0.125]),
                             ({"min_scale": 1.0}, [1.0, 1.0, 1.0]),
                             ({"min_scale": 0.3}, [0.5, f32(0.3), f32(0.3)])):
        scaler = scaler_of(1.0, **config)
        model = mlp()
        opt = make_opt("sgd", model.parameters())
        got = []
        for _ in expected:
            one_step(scaler, model, opt, poison=NAN)
            got.append(f32(scaler.get_scale()))
        assert got == [f32(e) for e in expected], config


def test_native_paddle_update_kernel_clamps_the_scale_at_one():
    # Why the backend does not use update_loss_scaling_ for its rule: on backoff it
    # clamps at 1 (paddle 3.3.1), a floor the spec has only with min_scale=1.
    from paddle import _C_ops

    grads = [paddle.ones([2])]
    scale = paddle.to_tensor([1.0], dtype="float32")
    good, bad = paddle.zeros([1], dtype="int32"), paddle.zeros([1], dtype="int32")
    found_inf = paddle.to_tensor([True])
    _C_ops.update_loss_scaling_(grads, found_inf, scale, good, bad, 2000, 1, 2.0, 0.5, False)
    assert float(scale.numpy()[0]) == 1.0  # the spec: 0.5


def test_step_or_unscale_before_any_scale_raises_scale_not_called():
    # Gradients of an unscaled loss divided by the scale would train at 1/65536 the rate.
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    loss_of(model, *batch()).backward()
    before = snapshot(model, opt)
    scaler = scaler_of(1024.0)
    for verb in ("step", "unscale_"):
        with pytest.raises(ua.ScaleNotCalledError, match=rf"Attempted {verb} before any scale"):
            getattr(scaler, verb)(opt)
    assert_same(before, snapshot(model, opt), "unscaled gradients were applied")


_RNG = random.Random(0)
SPEC_CASES = [
    ({"init_scale": 1024.0, "growth_interval": 3}, "FFFFFF"),
    ({"init_scale": 1024.0, "growth_interval": 3}, "IFFFIIFFFF"),
    ({"init_loss_scaling": 1000.0, "incr_ratio": 3.0, "decr_ratio": 0.3,
      "incr_every_n_steps": 2, "decr_every_n_nan_or_inf": 2},
     "".join(_RNG.choice("FFFIN") for _ in range(24))),
    ({"init_scale": 8.0, "growth_interval": 1, "min_scale": 2.0, "max_scale": 40.0},
     "IIIFFFFFFI"),
    ({"init_scale": 1024.0, "growth_interval": 1, "dynamic": False}, "FIFN"),
]


@pytest.mark.parametrize(("config", "pattern"), SPEC_CASES)
def test_scale_and_trackers_follow_the_spec_step_by_step(config, pattern):
    scaler = scaler_of(**config)
    expected, state = [], scaler.state
    for kind in pattern:
        state = spec.update(scaler.config, state, kind != "F")
        expected.append(state)
    got = run_pattern(scaler, pattern)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert f32(g.scale) == f32(e.scale), (i, g, e)
        assert (g.growth_tracker, g.hysteresis_tracker) == (e.growth_tracker,
                                                            e.hysteresis_tracker), (i, g, e)
    # Paddle's own attribute names hold the trackers too (tools read them).
    assert (scaler._incr_count, scaler._decr_count) == (got[-1].growth_tracker,
                                                        got[-1].hysteresis_tracker)


def test_design_vectors():
    # DESIGN.md section 2, init 1024, interval 3.
    for pattern, scales in (("FFFFFF", [1024, 1024, 2048, 2048, 2048, 4096]),
                            ("IFFFIIFFFF", [512, 512, 512, 1024, 512, 256, 256, 256, 512, 512])):
        got = run_pattern(scaler_of(1024.0, growth_interval=3), pattern)
        assert [s.scale for s in got] == scales, pattern


