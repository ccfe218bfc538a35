"""The PaddlePaddle backend: what is specific to Paddle (the shared contract runs in
test_conformance_builtin.py).

paddle 3.3.1 (CPU build, NumPy 2) is pinned: the ``test_native_paddle_*`` tests measure
the quirks of ``paddle.amp.GradScaler`` that the backend exists to fix. They are facts
about that version, so a paddle that changes them fails here loudly instead of skipping.

paddle is imported only inside tests and fixtures (``pytest.importorskip``): importing
it after tensorflow segfaults, and collection must import neither.
"""

from __future__ import annotations

import ast
import inspect
import math
import pathlib
import random
import re
import warnings
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest

import unifiedamp as ua
from unifiedamp import spec

pytestmark = pytest.mark.framework("paddle")

INF, NAN = float("inf"), float("nan")
F32_MAX = float(np.finfo(np.float32).max)
PADDLE_NAMES = {"init_scale": ("init_loss_scaling", 1024.0), "growth_factor": ("incr_ratio", 3.0),
                "backoff_factor": ("decr_ratio", 0.25),
                "growth_interval": ("incr_every_n_steps", 7),
                "hysteresis": ("decr_every_n_nan_or_inf", 3), "enabled": ("enable", False),
                "dynamic": ("use_dynamic_loss_scaling", False)}


@pytest.fixture(autouse=True)
def paddle():
    """paddle, with Paddle's process-wide AMP dtype reset around each test.

    ``paddle.amp.auto_cast(dtype=...)`` sets ``amp_global_state().amp_dtype`` and never
    restores it (3.3.1), and the native scaler's ``scale()`` reads it.
    """
    paddle = pytest.importorskip("paddle")
    from paddle.amp.auto_cast import amp_global_state

    saved = amp_global_state().amp_dtype
    amp_global_state().amp_dtype = "float32"  # Paddle's initial value
    try:
        yield paddle
    finally:
        amp_global_state().amp_dtype = saved


def scaler_of(*args, **kwargs):
    return ua.GradScaler(*args, backend="paddle", **kwargs)


def mlp(seed=0):
    import paddle

    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(),
                                paddle.nn.Linear(16, 4))


def batch(seed=1, poison=None):
    import paddle

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    y = rng.standard_normal((6, 4)).astype(np.float32)
    if poison is not None:
        x[0, 0] = poison
    return paddle.to_tensor(x), paddle.to_tensor(y)


def loss_of(model, x, y):
    import paddle

    return paddle.nn.functional.mse_loss(model(x), y)


def make_opt(name, params, grad_clip=None):
    import paddle

    o = paddle.optimizer
    return {
        "sgd": lambda: o.SGD(learning_rate=0.05, parameters=params, grad_clip=grad_clip),
        "momentum": lambda: o.Momentum(learning_rate=0.05, momentum=0.9, parameters=params,
                                       grad_clip=grad_clip),
        "adam": lambda: o.Adam(learning_rate=1e-2, parameters=params, grad_clip=grad_clip),
        "adamw": lambda: o.AdamW(learning_rate=1e-2, parameters=params, grad_clip=grad_clip),
    }[name]()


def snapshot(model, opt):
    """Parameters, then every tensor of the optimizer's state (moments, beta powers...)."""
    import paddle

    state = opt.state_dict()
    return ([p.numpy().copy() for p in model.parameters()]
            + [state[k].numpy().copy() for k in sorted(state)
               if isinstance(state[k], paddle.Tensor)])


def assert_same(a, b, what=""):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert np.array_equal(x, y), f"{what} tensor {i}"


def one_step(scaler, model, opt, seed=1, poison=None):
    scaler.scale(loss_of(model, *batch(seed, poison))).backward()
    retval = scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    return retval


def f32(x):
    return np.float32(x)


def paddle_scalar(value, dtype="float32"):
    import paddle

    return paddle.to_tensor(value, dtype=dtype)


# ---------------------------------------------------------------- the native scaler, forced on


class _GpuPlace:
    """Answers the one question paddle.amp.GradScaler.__init__ asks the tracer's place."""

    def is_gpu_place(self):
        return True


@pytest.fixture
def native_scaler(paddle, monkeypatch):
    """Builds a real, enabled ``paddle.amp.GradScaler`` on this CPU-only build.

    Its constructor disables it on a CPU place (3.3.1); the place check is answered
    "GPU" for the constructor call only, so Paddle's own enabled branch builds every
    attribute. All that runs afterwards is Paddle's code, untouched.
    """
    import paddle.amp.grad_scaler as grad_scaler

    def build(**kwargs):
        tracer = SimpleNamespace(_expected_place=_GpuPlace())
        with monkeypatch.context() as patch:
            patch.setattr(grad_scaler, "_dygraph_tracer", lambda: tracer)
            native = paddle.amp.GradScaler(**kwargs)
        assert native.is_enable()
        return native

    return build


def native_scale(native, loss):
    """The native scaler's ``scale()`` under ``auto_cast(float16)``, the one setting in which
    it stays enabled (auto_cast itself is a no-op on CPU that warns)."""
    import paddle

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="amp_guard can only be enabled")
        with paddle.amp.auto_cast(dtype="float16"):
            return native.scale(loss)


# ================================================================ 1. renaming


def test_paddle_names_table_has_the_seven_constructor_parameters(paddle):
    # The aliases come from this table; a row dropped from it would drop an alias.
    names = spec.FRAMEWORKS["paddle"]["names"]
    assert dict(names) == {k: v[0] for k, v in PADDLE_NAMES.items()}
    params = list(inspect.signature(paddle.amp.GradScaler.__init__).parameters)[1:]
    assert sorted(params) == sorted(names.values())


@pytest.mark.parametrize("canonical", sorted(PADDLE_NAMES))
def test_each_paddle_keyword_gives_the_canonical_config(canonical):
    # A Paddle script ported with its keywords must get the config it asked for.
    paddle_name, value = PADDLE_NAMES[canonical]
    ours = scaler_of(**{paddle_name: value})
    assert ours.config == scaler_of(**{canonical: value}).config
    assert getattr(ours.config, canonical) == value
    assert ours.config != scaler_of().config  # the value was not dropped


def test_all_paddle_keywords_together_and_two_spellings_of_one_refused():
    # All seven at once (no alias shadows another); one parameter spelled twice is ambiguous.
    ours = scaler_of(**{p: v for p, v in PADDLE_NAMES.values()})
    assert ours.config == ua.ScalerConfig(**{c: v for c, (_, v) in PADDLE_NAMES.items()})
    with pytest.raises(TypeError, match="incr_ratio"):
        scaler_of(growth_factor=3.0, incr_ratio=3.0)


def test_defaults_are_paddle_3x_defaults(paddle):
    # (g) paddle 3.x's signature defaults, through the names table, are our defaults.
    sig = inspect.signature(paddle.amp.GradScaler.__init__).parameters
    names = spec.FRAMEWORKS["paddle"]["names"]
    config = scaler_of().config
    for canonical, paddle_name in names.items():
        assert getattr(config, canonical) == sig[paddle_name].default, canonical
    assert (config.init_scale, config.growth_interval, config.hysteresis) == (65536.0, 2000, 1)


def test_it_is_a_real_paddle_grad_scaler_and_detected_from_paddle_objects(paddle):
    # Paddle code type-checks its scaler; backend=None/objects must pick this class.
    from unifiedamp.backends.paddle import PaddleGradScaler

    model = mlp()
    opt = make_opt("adam", model.parameters())
    for scaler in (scaler_of(), ua.GradScaler(backend=opt),
                   ua.GradScaler(backend=paddle.ones([1]))):
        assert type(scaler) is PaddleGradScaler
        assert isinstance(scaler, paddle.amp.GradScaler) and isinstance(scaler, ua.GradScaler)
        assert isinstance(scaler.native, paddle.amp.GradScaler)


def test_paddle_and_torch_getters_agree():
    # Both vocabularies read one config: a getter reading a stale copy would disagree.
    s = scaler_of(**{p: v for p, v in PADDLE_NAMES.values() if p != "enable"})
    assert s.get_init_loss_scaling() == 1024.0 == s.get_scale()
    assert s.get_incr_ratio() == s.get_growth_factor() == 3.0
    assert s.get_decr_ratio() == s.get_backoff_factor() == 0.25
    assert s.get_incr_every_n_steps() == s.get_growth_interval() == 7
    assert s.get_decr_every_n_nan_or_inf() == s.get_hysteresis() == 3
    assert s.is_enable() is s.is_enabled() is True
    assert s.is_use_dynamic_loss_scaling() is False
    off = scaler_of(enable=False)
    assert off.is_enable() is off.is_enabled() is False
    assert off.get_scale() == 1.0  # torch's habit for a disabled scaler


def test_paddle_setters_change_the_config_the_rule_uses():
    s = scaler_of(1024.0, growth_interval=100)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    one_step(s, model, opt)
    # By Paddle's keyword names, as Paddle code may call them.
    s.set_incr_ratio(new_incr_ratio=4.0)
    s.set_decr_ratio(new_decr_ratio=0.125)
    s.set_incr_every_n_steps(new_incr_every_n_steps=2)
    s.set_decr_every_n_nan_or_inf(new_decr_every_n_nan_or_inf=2)
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval(),
            s.get_hysteresis()) == (4.0, 0.125, 2, 2)
    assert s.config == ua.ScalerConfig(1024.0, 4.0, 0.125, 2, hysteresis=2)
    # Paddle's own attribute names follow (Paddle code and tools read them)
    assert (s._incr_ratio, s._decr_ratio, s._incr_every_n_steps,
            s._decr_every_n_nan_or_inf) == (4.0, 0.125, 2, 2)
    one_step(s, model, opt)  # the second finite update in a row: grows by the new ratio
    assert s.state == spec.ScalerState(4096.0, 0, 0)
    one_step(s, model, opt, poison=INF)
    assert s.state == spec.ScalerState(4096.0, 0, 1)  # hysteresis 2: not yet
    one_step(s, model, opt, poison=INF)
    assert s.state == spec.ScalerState(512.0, 0, 0)
    # Paddle's set_init_loss_scaling also sets the current scale (trackers kept).
    one_step(s, model, opt)
    s.set_init_loss_scaling(256.0)
    assert s.get_init_loss_scaling() == 256.0 and s.state == spec.ScalerState(256.0, 1, 0)
    assert s._init_loss_scaling == 256.0
    x = paddle_scalar(1.5)
    assert s.scale(x).item() == 384.0  # the scale tensor follows


def test_lowering_incr_every_n_steps_below_the_count_grows_at_the_next_finite_step():
    # Paddle compares incr_count == incr_every_n_steps: lowered below the count, it
    # never grows again. The spec's >= grows at the next finite update.
    s = scaler_of(1024.0, incr_every_n_steps=10)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    for _ in range(4):
        one_step(s, model, opt)
    s.set_incr_every_n_steps(2)
    one_step(s, model, opt)
    assert s.state == spec.ScalerState(2048.0, 0, 0)


@pytest.mark.parametrize(("setter", "bad", "exc"), [
    ("set_incr_ratio", 0.5, ValueError), ("set_incr_ratio", INF, ValueError),
    ("set_decr_ratio", 1.5, ValueError), ("set_decr_ratio", 0.0, ValueError),
    ("set_incr_every_n_steps", 0, ValueError), ("set_incr_every_n_steps", 2.0, TypeError),
    ("set_decr_every_n_nan_or_inf", 0, ValueError),
    ("set_decr_every_n_nan_or_inf", True, TypeError),
    ("set_init_loss_scaling", -1.0, ValueError), ("set_init_loss_scaling", 1e39, ValueError),
])
def test_a_bad_value_through_a_paddle_setter_raises_and_changes_nothing(setter, bad, exc):
    # Paddle's own setters assert (or accept anything); ours validate, and a refused
    # value must leave config, state, Paddle's attributes and the scale tensor as they were.
    s = scaler_of(1024.0, 3.0, 0.25, 7, hysteresis=3)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    one_step(s, model, opt)
    before = (s.config, s.state, s.get_scale(), s._incr_ratio, s._decr_ratio,
              s._incr_every_n_steps, s._decr_every_n_nan_or_inf, s._init_loss_scaling)
    with pytest.raises(exc, match=re.escape(f"got {bad!r}")):
        getattr(s, setter)(bad)
    assert (s.config, s.state, s.get_scale(), s._incr_ratio, s._decr_ratio,
            s._incr_every_n_steps, s._decr_every_n_nan_or_inf, s._init_loss_scaling) == before
    assert s.scale(paddle_scalar(1.0)).item() == 1024.0


def test_paddles_positional_order_raises_with_the_keyword_fix():
    # GradScaler(True, 1024) would otherwise mean init_scale=True: refuse it and say how.
    for enable in (True, False):
        with pytest.raises(TypeError, match=rf"paddle.amp.GradScaler starts with enable.*"
                                            rf"GradScaler\(enable={enable}, init_loss_scaling="):
            ua.GradScaler(enable, 1024, backend="paddle")
    # the spec's positional order works
    assert scaler_of(1024.0, 3.0, 0.25, 7, False).config == ua.ScalerConfig(1024.0, 3.0, 0.25,
                                                                            7, False)


# ================================================================ 2. correct on CPU


def test_native_paddle_disables_itself_on_cpu_and_at_scale_outside_fp16_autocast(
        paddle, native_scaler):
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
def test_scales_on_cpu_whatever_auto_cast_says(paddle, autocast):
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
def test_scaled_loss_keeps_dtype_and_shape(paddle, dtype, shape):
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


def test_a_tree_of_losses_is_scaled_and_keeps_its_structure(paddle):
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
def test_inf_step_backs_off_without_error(paddle, autocast):
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
def test_two_optimizers_each_skips_on_its_own_and_the_scale_backs_off_once(paddle, poisoned):
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


def test_native_paddle_update_kernel_clamps_the_scale_at_one(paddle):
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


def run_pattern(scaler, pattern, model=None, opt=None, start=0, check_scaled=True):
    """One iteration per letter (F finite, I inf, N nan); the scaler's state after each."""
    model = model or mlp()
    opt = opt or make_opt("sgd", model.parameters())
    states = []
    for i, kind in enumerate(pattern, start):
        poison = {"F": None, "I": INF, "N": NAN}[kind]
        loss = loss_of(model, *batch(seed=i))
        if poison is not None:
            loss = loss * poison
        scale_before = scaler.get_scale()
        scaled = scaler.scale(loss)
        if check_scaled and kind == "F":
            # the loss is multiplied by the current scale, as a float32 product
            assert scaled.numpy() == f32(loss.numpy()) * f32(scale_before), i
        scaled.backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        states.append(scaler.state)
    return states


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


# ================================================================ 3. workflow


def train(opt_name, scaler=None, steps=6, clip=None, manual_clip=None, minimize=False,
          unscale_first=False, accumulate=1):
    import paddle

    model = mlp()
    grad_clip = paddle.nn.ClipGradByGlobalNorm(clip) if clip else None
    opt = make_opt(opt_name, model.parameters(), grad_clip)
    for step in range(steps):
        for micro in range(accumulate - 1):  # all but the last micro-batch: backward only
            loss = loss_of(model, *batch(seed=100 * step + micro)) / accumulate
            (scaler.scale(loss) if scaler else loss).backward()
        loss = loss_of(model, *batch(seed=10 + step)) / accumulate
        if scaler is None:
            loss.backward()
            if manual_clip:
                paddle.nn.utils.clip_grad_norm_(model.parameters(), manual_clip)
            opt.step()
        elif minimize:
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(opt, scaled)
        else:
            scaler.scale(loss).backward()
            if manual_clip or unscale_first:
                scaler.unscale_(opt)
            if manual_clip:
                paddle.nn.utils.clip_grad_norm_(model.parameters(), manual_clip)
            scaler.step(opt)
            scaler.update()
        opt.clear_grad()
    return snapshot(model, opt)


VARIANTS = {"loop": {}, "minimize": {"minimize": True}, "unscale_first": {"unscale_first": True},
            "grad_clip": {"clip": 0.05}, "clip_grad_norm_": {"manual_clip": 0.05},
            "minimize_grad_clip": {"minimize": True, "clip": 0.05},
            "accumulate": {"accumulate": 2}}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_finite_training_with_the_scaler_equals_training_without_it(name, variant):
    # Powers of two scale and unscale exactly: every parameter and optimizer tensor
    # must be bitwise those of the plain loop, the scale growing 1024 -> 8192 meanwhile.
    kwargs = VARIANTS[variant]
    reference = train(name, **{k: v for k, v in kwargs.items()
                               if k in ("clip", "manual_clip", "accumulate")})
    scaler = scaler_of(1024.0, growth_interval=2)
    assert_same(reference, train(name, scaler=scaler, **kwargs), f"{name} {variant}")
    assert scaler.get_scale() == 8192.0
    assert (scaler.num_steps, scaler.num_skipped_steps) == (6, 0)
    assert not np.array_equal(reference[0], train(name, steps=0)[0])  # it trained


def test_clipping_really_clipped():
    # The clip threshold is small enough that clipping changes the result, so the
    # equality above compares clipped runs, not two unclipped ones.
    assert not np.array_equal(train("sgd")[0], train("sgd", clip=0.05)[0])
    assert not np.array_equal(train("sgd")[0], train("sgd", manual_clip=0.05)[0])


def test_a_scale_that_is_not_a_power_of_two_stays_within_float32_rounding():
    # Non-power-of-two scales round, so only closeness holds; growth by 3 on the way.
    reference = train("adam")
    got = train("adam", scaler=scaler_of(1000.0, growth_factor=3.0, growth_interval=2))
    for a, b in zip(reference, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_inf_step_is_skipped_and_leaves_params_and_optimizer_state(name):
    # A skipped step must touch neither the parameters nor any optimizer tensor (moments,
    # beta-pow accumulators, velocity, weight decay), as if the iteration never happened.
    model = mlp()
    opt = make_opt(name, model.parameters())
    scaler = scaler_of(1024.0)
    one_step(scaler, model, opt, seed=1)
    before = snapshot(model, opt)
    assert one_step(scaler, model, opt, seed=2, poison=NAN) is None
    assert scaler.last_step_skipped is True
    assert_same(before, snapshot(model, opt), f"{name}: the skipped step changed state")
    assert scaler.get_scale() == 512.0
    assert (scaler.num_steps, scaler.num_skipped_steps) == (2, 1)
    # and the run goes on as if that iteration had never been there (beta powers too)
    one_step(scaler, model, opt, seed=3)
    ref_model = mlp()
    ref_opt = make_opt(name, ref_model.parameters())
    ref = scaler_of(1024.0)
    one_step(ref, ref_model, ref_opt, seed=1)
    one_step(ref, ref_model, ref_opt, seed=3)
    assert_same(snapshot(ref_model, ref_opt), snapshot(model, opt), name)


def test_minimize_skips_like_paddles_and_reports():
    # Paddle's one-call verb: (None, None) on a skip, optimizer.minimize's result otherwise,
    # and it updates the scale itself.
    model = mlp()
    opt = make_opt("adam", model.parameters())
    scaler = scaler_of(1024.0)
    scaled = scaler.scale(loss_of(model, *batch(poison=INF)))
    scaled.backward()
    before = snapshot(model, opt)
    assert scaler.minimize(opt, scaled) == (None, None)  # Paddle's skipped result
    assert scaler.last_step_skipped and scaler.state == spec.ScalerState(512.0, 0, 0)
    assert_same(before, snapshot(model, opt))
    opt.clear_grad()
    scaled = scaler.scale(loss_of(model, *batch()))
    scaled.backward()
    ops, params_grads = scaler.minimize(opt, scaled)
    assert len(params_grads) == 4 and not scaler.last_step_skipped
    assert scaler.state == spec.ScalerState(512.0, 1, 0)


def test_parameter_groups_are_all_unscaled_and_checked(paddle):
    # Paddle's dict parameter groups: every group's gradients are unscaled (bitwise the
    # plain run's), and an inf in either group skips the whole step.
    def run(scaler, poison_group=None):
        a, b = mlp(seed=0), mlp(seed=1)
        opt = paddle.optimizer.Adam(learning_rate=1e-2, parameters=[
            {"params": a.parameters()}, {"params": b.parameters(), "learning_rate": 0.1}])
        for step in range(3):
            poison = (step == 1)
            loss = (loss_of(a, *batch(step, INF if poison and poison_group == 0 else None))
                    + loss_of(b, *batch(step + 5, INF if poison and poison_group == 1 else None)))
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            opt.clear_grad()
        return snapshot(a, opt) + snapshot(b, opt)

    assert_same(run(None), run(scaler_of(1024.0, growth_interval=1)))
    for group in (0, 1):
        scaler = scaler_of(1024.0, growth_interval=1)
        got = run(scaler, poison_group=group)
        assert scaler.num_skipped_steps == 1 and scaler.get_scale() == 2048.0, group
        assert all(np.isfinite(x).all() for x in got), group


def test_update_with_new_scale_float_array_or_tensor(paddle):
    # torch's update(new_scale): the scale is set (rounded to float32), trackers kept;
    # anything else is refused without a change.
    scaler = scaler_of(1024.0, growth_interval=5)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    one_step(scaler, model, opt)
    scaler.update(8.0)
    assert scaler.state == spec.ScalerState(8.0, 1, 0)  # trackers kept, as torch
    assert scaler.scale(paddle_scalar(1.0)).item() == 8.0
    scaler.update(paddle.to_tensor([0.1], dtype="float64"))
    assert scaler.get_scale() == spec.f32(0.1)
    scaler.update(np.array([4.0]))
    assert scaler.get_scale() == 4.0
    for bad, exc in [(0.0, ValueError), (NAN, ValueError), ("8", TypeError),
                     (paddle.ones([2]), TypeError), (paddle.to_tensor([True]), TypeError),
                     (paddle.to_tensor([1], dtype="int32"), TypeError)]:
        with pytest.raises(exc, match="new_scale must be"):
            scaler.update(new_scale=bad)
        if bad is not NAN and not (isinstance(bad, paddle.Tensor) and bad.dtype == paddle.bool):
            with pytest.raises(exc, match="new_scale must be"):
                scaler.update(bad)  # positional, as torch's (a bool tensor is a flag)
    assert scaler.state == spec.ScalerState(4.0, 1, 0)


def test_optimizer_misuse_gets_clear_errors():
    # A non-Paddle optimizer, or one with no gradients, gets a message, not an AttributeError.
    model = mlp()
    scaler = scaler_of(1024.0)
    scaler.scale(loss_of(model, *batch())).backward()
    with pytest.raises(TypeError, match="optimizer must be a paddle.optimizer.Optimizer, got "
                                        "SimpleNamespace"):
        scaler.step(SimpleNamespace(step=lambda: None))
    # an optimizer none of whose parameters has a gradient: torch's message
    idle = make_opt("sgd", mlp(seed=3).parameters())
    with pytest.raises(ua.NoInfChecksError, match=r"^No inf checks were recorded for this "
                                                  r"optimizer\. None of its parameters has a "
                                                  r"gradient.*scaler\.scale\(loss\)\.backward"):
        scaler.step(idle)


def test_deepcopy_and_pickle_keep_config_and_state_and_are_independent():
    # Checkpoint tools deepcopy/pickle trainers: the copy must not share the scale tensor.
    import copy
    import pickle

    scaler = scaler_of(1024.0, hysteresis=3)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    one_step(scaler, model, opt, poison=INF)
    for clone in (copy.deepcopy(scaler), pickle.loads(pickle.dumps(scaler))):
        assert clone.state == scaler.state == spec.ScalerState(1024.0, 0, 1)
        assert clone.config == scaler.config and clone.num_skipped_steps == 1
        clone.update(2.0)  # the clone's scale tensor is its own
        assert clone.scale(paddle_scalar(1.0)).item() == 2.0
        assert scaler.scale(paddle_scalar(1.0)).item() == 1024.0


SPARSE_SCRIPT = """
import json, numpy as np, paddle, unifiedamp as ua
out = {}
for who in ("plain", "scaled", "inf"):
    paddle.seed(0)
    emb = paddle.nn.Embedding(10, 3, sparse=True)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=emb.parameters())
    scaler = ua.GradScaler(1024.0, backend="paddle")
    w = np.ones((3, 3), np.float32)
    if who == "inf":
        w[0, 0] = np.inf
    loss = (emb(paddle.to_tensor([1, 2, 2])) * paddle.to_tensor(w)).sum()
    assert emb.weight.grad is None
    before = emb.weight.numpy().copy()
    if who == "plain":
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        assert emb.weight.grad.is_selected_rows()
        scaler.step(opt)
        scaler.update()
    out[who] = {"delta": (before - emb.weight.numpy()).tolist(), "scale": scaler.get_scale()}
print(json.dumps(out))
"""


def test_sparse_embedding_gradients_are_unscaled_and_checked(run_python):
    # paddle.nn.Embedding(sparse=True) gives SelectedRows gradients (recommendation
    # models). The torch backend handles sparse gradients; here the step must equal the
    # plain one and an inf must skip. In a fresh interpreter: paddle's dense kernel
    # given a SelectedRows tensor reads garbage dimensions (it may crash).
    proc = run_python(SPARSE_SCRIPT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["scaled"]["delta"] == out["plain"]["delta"]
    assert out["scaled"]["scale"] == 1024.0
    assert out["inf"]["delta"] == [[0.0] * 3] * 10 and out["inf"]["scale"] == 512.0


def test_skip_counters_and_paddles_cache_found_inf():
    # LR schedulers and loggers read last_step_skipped/num_skipped_steps; PaddleNLP reads
    # _cache_found_inf.
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    scaler = scaler_of(1024.0)
    seen = []
    for i, kind in enumerate("FIFNIF"):
        one_step(scaler, model, opt, seed=i, poison=None if kind == "F" else NAN)
        # PaddleNLP's Trainer reads _cache_found_inf after update() to know whether it stepped
        seen.append((scaler.last_step_skipped, bool(scaler._cache_found_inf)))
    assert seen == [(k != "F", k != "F") for k in "FIFNIF"]
    assert (scaler.num_steps, scaler.num_skipped_steps) == (6, 3)


def test_functional_unscale_counts_towards_the_update(paddle):
    # unscale(grads) returns copies and its inf check feeds the next update().
    scaler = scaler_of(1024.0)
    scaler.scale(paddle_scalar(1.0))
    grads = [paddle.to_tensor([2048.0, 512.0]), paddle.to_tensor([1.0, INF])]
    out, finite = scaler.unscale(grads)
    assert out[0].numpy().tolist() == [2.0, 0.5] and not bool(finite)
    assert grads[0].numpy().tolist() == [2048.0, 512.0]  # copies: the inputs stay
    scaler.update()
    assert scaler.state == spec.ScalerState(512.0, 0, 0)


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
def test_functional_unscale_keeps_the_graph_of_gradients_that_have_one(paddle, enabled):
    """A gradient penalty (docs/recipes/penalty.md): the gradients of
    paddle.grad(scaler.scale(loss), params, create_graph=True), unscaled by unscale(),
    stay differentiable, as on JAX, MLX and Keras. A detached copy would leave the penalty
    out of the parameters' gradients without an error."""
    model = mlp()
    scaler = scaler_of(1024.0, enabled=enabled)
    params = list(model.parameters())
    x, y = batch()

    def penalty_grads(unscale):
        scaled = paddle.grad(scaler.scale(loss_of(model, x, y)), params, create_graph=True)
        unscaled = unscale(scaled)
        penalty = sum(g.pow(2).sum() for g in unscaled)
        return [g.numpy() for g in unscaled], [g.numpy() for g in paddle.grad(penalty, params)]

    inv_scale = 1.0 / scaler.get_scale()
    by_hand = penalty_grads(lambda scaled: [g * inv_scale for g in scaled])
    via_unscale = penalty_grads(lambda scaled: scaler.unscale(scaled)[0])
    for a, b in zip([*by_hand[0], *by_hand[1]], [*via_unscale[0], *via_unscale[1]],
                    strict=True):
        np.testing.assert_array_equal(a, b)
    scaler.update()
    assert scaler.get_scale() == (1024.0 if enabled else 1.0)


def test_update_clears_the_functional_checks_so_one_inf_skips_one_update(paddle):
    model = mlp()
    scaler = scaler_of(1024.0, growth_interval=1)
    scales = []
    for poison in (INF, None, None):
        loss = scaler.scale(loss_of(model, *batch(poison=poison)))
        _, finite = scaler.unscale(paddle.grad(loss, model.parameters()))
        scaler.update()
        scales.append((bool(finite), scaler.get_scale()))
    # backed off once, then grew at each finite update
    assert scales == [(False, 512.0), (True, 1024.0), (True, 2048.0)]


def test_a_float64_gradient_is_checked_in_float64(paddle):
    # 1e39 is finite in float64 and inf in float32: a float32 check would skip the step.
    w = paddle.create_parameter([2], "float64",
                                default_initializer=paddle.nn.initializer.Constant(1.0))
    opt = paddle.optimizer.SGD(learning_rate=1.0, parameters=[w])
    scaler = scaler_of(2.0)
    loss = (w * paddle.to_tensor([1e39, -1.0], dtype="float64")).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert not scaler.last_step_skipped and scaler.state.growth_tracker == 1
    assert w.numpy().tolist() == [1.0 - 1e39, 2.0]


def bf16_problem(lr=0.5):
    """A bfloat16 parameter with SGD(multi_precision=True): it runs on Paddle's CPU kernels
    (bf16 elementwise ops exist) and takes the backend's non-float32 unscale path."""
    import paddle

    w = paddle.create_parameter([4], "bfloat16",
                                default_initializer=paddle.nn.initializer.Constant(1.0))
    opt = paddle.optimizer.SGD(learning_rate=lr, parameters=[w], multi_precision=True)
    return w, opt


def bf16_loss(w, poison=None):
    import paddle

    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    if poison is not None:
        x[1] = poison
    return (w * paddle.to_tensor(x).astype("bfloat16")).sum()


def bf16_snapshot(w, opt):
    state = opt.state_dict()
    master = [v.numpy().copy() for v in state.get("master_weights", {}).values()]
    return [w.astype("float32").numpy().copy(), *master]


@pytest.mark.filterwarnings("ignore:Loss scaling is unnecessary with bfloat16")
def test_bfloat16_parameters_with_multi_precision_sgd_step_and_skip(paddle):
    w, opt = bf16_problem()
    ref_w, ref_opt = bf16_problem()
    scaler = scaler_of(1024.0, growth_interval=2)
    history = []
    for step, poison in enumerate((None, INF, None, NAN, None, None)):
        scaler.scale(bf16_loss(w, poison)).backward()
        assert w.grad.dtype == paddle.bfloat16
        scaler.unscale_(opt)
        if poison is None:
            # unscaled exactly: the gradient of sum(w * x) is x
            assert w.grad.astype("float32").numpy().tolist() == [1.0, 2.0, 3.0, 4.0], step
        before = bf16_snapshot(w, opt)
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        history.append(scaler.last_step_skipped)
        if poison is None:
            bf16_loss(ref_w).backward()
            ref_opt.step()
            ref_opt.clear_grad()
            assert_same(bf16_snapshot(ref_w, ref_opt), bf16_snapshot(w, opt), f"step {step}")
        else:
            assert_same(before, bf16_snapshot(w, opt), f"skipped step {step}")
    assert history == [False, True, False, True, False, False]
    assert scaler.state == spec.ScalerState(512.0, 0, 0)
    assert w.astype("float32").numpy().tolist() == [-1.0, -3.0, -5.0, -7.0]  # 4 steps


def test_unscale_twice_or_after_step_raises_torchs_messages():
    # A second unscale_ would divide the gradients twice; torch's exact messages.
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    scaler = scaler_of(1024.0)
    scaler.scale(loss_of(model, *batch())).backward()
    scaler.unscale_(opt)
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) has already been called on this "
                                           r"optimizer since the last update\(\)\.$"):
        scaler.unscale_(opt)
    assert_same(grads, [p.grad.numpy() for p in model.parameters()], "unscaled twice")
    scaler.step(opt)
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) is being called after step\(\)\.$"):
        scaler.unscale_(opt)
    # torch's sentence, then the fix (a paddle script in static mode may never call update()).
    with pytest.raises(RuntimeError, match=r"^step\(\) has already been called since the last "
                                           r"update\(\)\. Call scaler.update\(\) once per "
                                           r"iteration, after the last step\(\)\.$"):
        scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    one_step(scaler, model, opt)  # a new iteration starts clean
    assert scaler.num_steps == 2


def test_disabled_scaler_is_a_pass_through():
    # enabled=False: every verb passes through, even an inf step (the user turned it off).
    scaler = scaler_of(1024.0, enable=False)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    loss = loss_of(model, *batch(poison=INF))
    assert scaler.scale(loss) is loss
    loss.backward()
    scaler.unscale_(opt)
    scaler.step(opt)  # steps, inf and all: the scaler is off
    scaler.update()
    assert not np.isfinite(model.parameters()[0].numpy()).all()
    assert scaler.num_steps == 0 and scaler.get_scale() == 1.0
    assert scaler.native_state_dict() == {}  # Paddle's habit
    assert scaler.state_dict()["config"]["enabled"] is False


# ================================================================ 4. state


def trained(scaler, pattern="FFIF"):
    run_pattern(scaler, pattern, check_scaled=False)
    return scaler


def test_canonical_state_dict_round_trips_also_through_paddle_save(paddle, tmp_path):
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
def test_a_hand_built_native_paddle_dict_loads_with_an_array_or_tensor_scale(paddle, as_tensor):
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


def test_canonical_and_native_dicts_from_the_torch_backend_load():
    # Marked paddle (the suite orders by one framework marker): torch imported after
    # paddle is safe, and paddle is already imported here.
    torch = pytest.importorskip("torch")
    source = ua.GradScaler(256.0, 3.0, 0.25, 4, backend="torch", hysteresis=2)
    native = torch.amp.GradScaler("cpu", 256.0, 2.0, 0.5, 4)
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    for value in (1.0, INF, 1.0, INF, INF, 1.0):
        for scaler in (source, native):
            scaler.scale((param * value).sum()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    target = scaler_of()
    target.load_state_dict(source.state_dict())
    assert (target.config, target.state) == (source.config, source.state)
    assert source.state == spec.ScalerState(64.0, 1, 0)
    target.load_state_dict(native.state_dict())
    assert target.state == spec.ScalerState(native.get_scale(), 1, 0)
    assert target.state.scale == 32.0 and target.config.growth_factor == 2.0


@pytest.mark.parametrize("via", ["canonical", "native"])
def test_resume_mid_interval_is_exact(paddle, tmp_path, via):
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


def test_empty_dict_from_a_disabled_paddle_scaler_is_refused(paddle):
    # A disabled Paddle scaler saves {}: loading it must say so, not reset the state.
    with pytest.warns(UserWarning, match="can only be enabled"):
        empty = paddle.amp.GradScaler().state_dict()
    assert empty == {}
    scaler = trained(scaler_of(1024.0))
    assert_unchanged_by(scaler, empty, "it is empty")


def test_loading_keeps_the_loading_scalers_enabled():
    # enabled is the loading run's choice (e.g. eval with scaling off), not the checkpoint's.
    on = trained(scaler_of(256.0))
    off = scaler_of(64.0, enabled=False)
    off.load_state_dict(on.state_dict())
    assert not off.is_enabled() and off.state == on.state and off.get_scale() == 1.0
    on2 = scaler_of(1024.0)
    on2.load_state_dict(scaler_of(64.0, enabled=False).state_dict())
    assert on2.is_enabled() and on2.is_enable() and on2.get_scale() == 64.0


# ================================================================ 5. devices


def test_gpu_on_a_cpu_only_build_raises_naming_the_fix(paddle):
    # Paddle's own message here is '<re.Match object ...>'; ours names the fix.
    if paddle.is_compiled_with_cuda():
        pytest.skip("measures the CPU-only build")
    for device in ("gpu", "gpu:0", "cuda", "cuda:1"):
        with pytest.raises(RuntimeError, match=r"built without CUDA.*pass device='cpu' or "
                                               r"enabled=False, or install paddlepaddle-gpu"):
            scaler_of(device=device)


@pytest.mark.parametrize("device", ["tpu", "npu", "", "cpu:abc", "xpu:0"])
def test_a_bad_device_string_raises_value_error(device):
    # A typo, or a device this build lacks, is a ValueError that lists what is valid
    # (Paddle's own message for xpu on a CPU build shows a regex match object).
    with pytest.raises(ValueError, match=rf"device={device!r} is not a device this paddle can "
                                         r"use: pass 'cpu'") as info:
        scaler_of(device=device)
    assert "re.Match" not in str(info.value)


def test_cpu_devices_and_places(paddle):
    # `unifiedamp backends` lists devices(), cpu first; every CPU spelling keeps the scale
    # on the CPU.
    from unifiedamp.backends.paddle import PaddleGradScaler

    devices = PaddleGradScaler.devices()
    assert devices[0] == "cpu"
    if not paddle.is_compiled_with_cuda():
        assert devices == ["cpu"]
    for device in (None, "cpu", "CPU", paddle.CPUPlace()):
        scaler = scaler_of(1024.0, device=device)
        assert scaler._scale.place.is_cpu_place()
        assert scaler.scale(paddle_scalar(1.0)).item() == 1024.0


# ---------------------------------------------------------------- Paddle's private surface

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "unifiedamp" / "backends" / "paddle"


def private_surface_changes(amp_scaler_cls, paddle):
    """What of the private API ``backends/paddle/_compat.py`` lists the installed Paddle no
    longer has; ``amp_scaler_cls`` is paddle.amp.GradScaler or a stand-in for a release."""
    import importlib

    from unifiedamp.backends.paddle import _compat

    changes = [f"no {module}.{name}" for module, name in _compat.PRIVATE_IMPORTS
               if not hasattr(importlib.import_module(module), name)]
    from paddle import _C_ops  # the kernel, in the private module listed above

    if not hasattr(_C_ops, "check_finite_and_unscale_"):
        changes.append("no _C_ops.check_finite_and_unscale_")
    objects = {"tracer": paddle.base.framework._dygraph_tracer(),
               "paddle.Tensor": paddle.to_tensor([1.0]),
               "paddle.optimizer.Optimizer": paddle.optimizer.SGD(
                   parameters=paddle.nn.Linear(1, 1).parameters())}
    changes += [f"no {kind}.{name}" for kind, name in _compat.PRIVATE_ATTRIBUTES
                if not hasattr(objects[kind], name)]
    # Paddle's scaler sets its attributes in __init__ (most only when enabled, which a CPU
    # place refuses), and its own code calls the private methods this backend overrides.
    source = "\n".join(inspect.getsource(klass) for klass in amp_scaler_cls.__mro__
                       if klass is not object)
    changes += [f"{amp_scaler_cls.__name__} no longer sets {name}"
                for name in _compat.NATIVE_ATTRIBUTES if f"self.{name} = " not in source]
    changes += [f"{amp_scaler_cls.__name__} no longer calls {name}()"
                for name in _compat.OVERRIDDEN_METHODS if f"self.{name}(" not in source]
    return changes


def test_paddles_private_surface_is_what_the_backend_was_written_for(paddle):
    import importlib.metadata

    supported = [r for r in importlib.metadata.requires("unifiedamp")
                 if r.startswith("paddlepaddle") and 'extra == "paddle"' in r]
    changes = private_surface_changes(paddle.amp.GradScaler, paddle)
    assert not changes, (
        f"paddle {paddle.__version__} changed the private API that unifiedamp's Paddle "
        f"backend uses: {'; '.join(changes)}. The backend supports "
        f"{supported[0].split(';')[0]} (tested: 3.3.1, CPU build); adapt "
        "unifiedamp/backends/paddle/_compat.py or use a paddle in that range")


def test_the_private_surface_check_sees_a_scaler_that_changed(paddle):
    # Shaped like a release whose scaler keeps its flags elsewhere and folds _update into
    # update().
    class NewerAmpScaler:
        def __init__(self):
            self._enable = True
            self._use_dynamic_loss_scaling = True
            self._init_loss_scaling = 65536.0
            self._scale = None
            self._incr_ratio = 2.0
            self._decr_ratio = 0.5
            self._incr_every_n_steps = 2000
            self._decr_every_n_nan_or_inf = 1
            self._incr_count = 0
            self._decr_count = 0
            self._found_inf = None
            self._optimizer_states = {}

        def step(self, optimizer):
            self._unscale(optimizer)

    assert private_surface_changes(NewerAmpScaler, paddle) == [
        "NewerAmpScaler no longer sets _cache_found_inf",
        "NewerAmpScaler no longer calls _update()"]


def identifiers(path):
    """Every name a module uses: names, attributes, imports, definitions, and strings that
    are identifiers (``getattr(x, "_name")``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.alias):
            found.update(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(node.module.split("."))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.isidentifier()):
            found.add(node.value)
    return found


def paddle_internals(path):
    """``paddle.base``/``paddle.fluid`` and ``paddle._x`` a module reaches, as dotted paths."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "paddle"):
            parts = ["paddle", node.attr]
        else:
            continue
        if parts[0] == "paddle" and any(p.startswith("_") or p in ("base", "fluid")
                                        for p in parts[1:]):
            found.add(".".join(parts))
    return found


def test_no_module_of_the_paddle_backend_but_compat_names_paddles_private_api():
    from unifiedamp.backends.paddle import _compat

    modules = sorted(PACKAGE.glob("*.py"))
    assert {p.name for p in modules} >= {"__init__.py", "_scaler.py", "_compat.py"}
    # What the check looks for is there, in the one module allowed to have it.
    assert _compat.PRIVATE_NAMES <= identifiers(PACKAGE / "_compat.py")
    assert paddle_internals(PACKAGE / "_compat.py")
    offenders = {p.name: sorted(identifiers(p) & _compat.PRIVATE_NAMES) + sorted(
                 paddle_internals(p)) for p in modules if p.name != "_compat.py"}
    assert not any(offenders.values()), (
        f"Paddle's private API used outside backends/paddle/_compat.py: {offenders}; add a "
        "function to _compat.py (and its name to its lists) and call that")


@pytest.mark.parametrize("wrong", [None, 42, "sgd", [None]])
def test_a_value_that_is_not_an_optimizer_is_named_by_step_unscale_and_minimize(paddle, wrong):
    model = paddle.nn.Linear(2, 1)
    scaler = scaler_of(1024.0)
    scaled = scaler.scale(model(paddle.ones([1, 2])).sum())
    scaled.backward()
    for message, call in (
            (r"step\(\) takes the paddle optimizer .*got ", lambda: scaler.step(wrong)),
            (r"optimizer must be a paddle.optimizer.Optimizer, got ",
             lambda: scaler.unscale_(wrong)),
            (r"minimize\(\) takes the paddle optimizer .*got ",
             lambda: scaler.minimize(wrong, scaled))):
        with pytest.raises(TypeError, match=message + type(wrong).__name__):
            call()
    assert scaler.state == spec.ScalerState(1024.0, 0, 0)


def test_a_device_that_is_neither_a_string_nor_a_place_is_named_with_the_fix(paddle):
    with pytest.raises(TypeError, match=r"device=3 \(int\): .*'gpu:3'"):
        scaler_of(1024.0, device=3)
    assert scaler_of(1024.0, device=paddle.CPUPlace()).get_scale() == 1024.0
