"""The Paddle backend's names: Paddle's constructor keywords as aliases of the spec's
parameters, Paddle's defaults, its getters and setters on the one config, and the type Paddle
code checks for."""

from __future__ import annotations

import inspect
import re

import pytest

paddle = pytest.importorskip("paddle")

from paddle_helpers import INF, make_opt, mlp, one_step, paddle_scalar, scaler_of  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402

#: canonical name -> (Paddle's keyword, a value other than the default)
PADDLE_NAMES = {"init_scale": ("init_loss_scaling", 1024.0), "growth_factor": ("incr_ratio", 3.0),
                "backoff_factor": ("decr_ratio", 0.25),
                "growth_interval": ("incr_every_n_steps", 7),
                "hysteresis": ("decr_every_n_nan_or_inf", 3), "enabled": ("enable", False),
                "dynamic": ("use_dynamic_loss_scaling", False)}


def test_paddle_names_table_has_the_seven_constructor_parameters():
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


def test_defaults_are_paddle_3x_defaults():
    # (g) paddle 3.x's signature defaults, through the names table, are our defaults.
    sig = inspect.signature(paddle.amp.GradScaler.__init__).parameters
    names = spec.FRAMEWORKS["paddle"]["names"]
    config = scaler_of().config
    for canonical, paddle_name in names.items():
        assert getattr(config, canonical) == sig[paddle_name].default, canonical
    assert (config.init_scale, config.growth_interval, config.hysteresis) == (65536.0, 2000, 1)


def test_it_is_a_real_paddle_grad_scaler_and_detected_from_paddle_objects():
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


