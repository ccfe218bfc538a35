"""The Keras wrapper as an object, on the session's Keras backend (the keras session runs
once per ``KERAS_BACKEND``): ``scaler.wrap`` and what it refuses, ``KerasGradScaler.of``,
the state read from and written to the optimizer's variables (``state_dict`` and
``load_state_dict`` before and after the optimizer builds), the setters, the counters, the
custom-loop protocol's ``update``, detection, and the optimizer's ``get_config`` /
``from_config``.
"""

from __future__ import annotations

import numpy as np
import pytest
from keras_helpers import (
    CUSTOM,
    as_tuple,
    dtype_policy,
    eager_steps,
    make_data,
    make_model,
    make_scaler,
    only_on,
    reference_states,
    variable_state,
    with_inf,
)

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState


def test_wrap_returns_a_loss_scale_optimizer_that_compile_keeps(keras):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    scaler = make_scaler(**CUSTOM)
    sgd = keras.optimizers.SGD(0.1)
    opt = scaler.wrap(sgd)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert isinstance(opt, SpecLossScaleOptimizer)
    assert opt.inner_optimizer is sgd and scaler.optimizer is opt
    with dtype_policy("mixed_float16"):
        model = make_model()
        model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt  # not wrapped a second time by the mixed_float16 policy
    assert opt.scaler_config == scaler.config == ScalerConfig(**CUSTOM)


def test_wrap_refuses_loss_scale_optimizers_non_optimizers_and_a_second_optimizer(keras):
    scaler = make_scaler()
    native = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(TypeError, match="LossScaleOptimizer already: wrap its inner_optimizer"):
        scaler.wrap(native)
    with pytest.raises(TypeError, match=r"takes a keras.optimizers.Optimizer, got Sequential"):
        scaler.wrap(make_model())
    with pytest.raises(TypeError, match=r"takes a keras.optimizers.Optimizer, got str"):
        scaler.wrap("adam")
    assert scaler.optimizer is None
    opt = scaler.wrap(keras.optimizers.SGD())
    with pytest.raises(TypeError, match="LossScaleOptimizer already"):
        scaler.wrap(opt)
    with pytest.raises(RuntimeError, match="wraps an optimizer already: make one scaler per"):
        scaler.wrap(keras.optimizers.Adam())
    assert scaler.optimizer is opt


def test_an_optimizer_wrapped_by_one_scaler_cannot_be_wrapped_by_another(keras):
    sgd = keras.optimizers.SGD(0.1, name="sgd")
    first, second = make_scaler(8.0), make_scaler(16.0)
    opt = first.wrap(sgd)
    with pytest.raises(RuntimeError, match=r"SGD optimizer 'sgd' is wrapped already, by another "
                                           r"scaler: .*\(KerasGradScaler.of\(it\)"):
        second.wrap(sgd)
    with pytest.raises(RuntimeError, match=r"wraps this optimizer already: .*scaler.optimizer"):
        first.wrap(sgd)
    assert second.optimizer is None and first.optimizer is opt and opt.inner_optimizer is sgd
    assert second.wrap(keras.optimizers.SGD()).scaler_config.init_scale == 16.0
    model = make_model()
    model.compile(optimizer=opt, loss="mse")  # a model lives in reference cycles
    del first, opt, model  # a wrapper no one holds wraps nothing
    assert make_scaler(4.0).wrap(sgd).inner_optimizer is sgd


def test_disabled_scaler_returns_the_inner_optimizer(keras):
    scaler = make_scaler(1024.0, enabled=False)
    sgd = keras.optimizers.SGD(0.1)
    assert scaler.wrap(sgd) is sgd and scaler.optimizer is None
    assert scaler.get_scale() == 1.0 and not scaler.is_enabled()
    assert scaler.state_dict()["config"]["enabled"] is False


def test_of_gives_the_scaler_of_a_wrapped_optimizer(keras):
    from unifiedamp.backends.keras import KerasGradScaler

    opt = make_scaler(**CUSTOM).wrap(keras.optimizers.SGD())
    eager_steps(make_model(), opt, "FFFFI")
    again = KerasGradScaler.of(opt)
    assert again.optimizer is opt and again.config == ScalerConfig(**CUSTOM)
    assert as_tuple(again.state) == reference_states(again.config, [True] * 4 + [False])[-1]
    assert again.state_dict() == KerasGradScaler.of(opt).state_dict()
    with pytest.raises(TypeError, match="made by KerasGradScaler.wrap, got LossScaleOptimizer"):
        KerasGradScaler.of(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))


def test_scaler_reads_the_optimizer_variables_after_fit(keras):
    scaler = make_scaler(**CUSTOM)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=opt, loss="mse")
    x, y = make_data(20)
    model.fit(with_inf(x, row=12), y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    expected = reference_states(scaler.config, [True, True, True, False, True] * 2)[-1]
    assert expected != (np.float32(1024.0), 0, 0)
    assert variable_state(opt) == expected
    assert as_tuple(scaler.state) == expected and scaler.get_scale() == expected[0]
    assert scaler.state_dict() == spec.to_state_dict(
        scaler.config, ScalerState(float(expected[0]), *expected[1:]), "keras")


def test_load_state_dict_before_build_is_written_when_the_optimizer_builds(keras):
    scaler = make_scaler(**CUSTOM)
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    config = ScalerConfig(**{**CUSTOM, "growth_interval": 4})
    loaded = ScalerState(1536.0, 3, 0)
    scaler.load_state_dict(spec.to_state_dict(config, loaded, "torch"))
    assert not opt.built and opt.scaler_config == config
    model = make_model()
    opt.build(model.trainable_variables)
    assert variable_state(opt) == as_tuple(loaded)
    eager_steps(model, opt, "FF")  # the first step grows
    assert as_tuple(scaler.state) == reference_states(config, [True, True], start=loaded)[-1]
    assert scaler.get_scale() == np.float32(2304.0)


def test_load_state_dict_after_build_writes_the_variables(keras):
    scaler = make_scaler(**CUSTOM)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    eager_steps(model, opt, "FF")
    assert opt.built
    config = ScalerConfig(**{**CUSTOM, "backoff_factor": 0.875})
    loaded = ScalerState(1000.0, 0, 1)
    scaler.load_state_dict(spec.to_state_dict(config, loaded, "jax"))
    assert opt.scaler_config == config
    assert variable_state(opt) == as_tuple(loaded)
    eager_steps(model, opt, "I")  # the second inf backs off, with the loaded factor
    assert variable_state(opt) == reference_states(config, [False], start=loaded)[-1]
    assert variable_state(opt) == (np.float32(875.0), 0, 0)


@pytest.mark.parametrize("built", [False, True], ids=["before_build", "after_build"])
def test_a_bad_state_dict_changes_nothing(keras, built):
    scaler = make_scaler(**CUSTOM)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.SGD())
    if built:
        eager_steps(model, opt, "FI")
    before = (as_tuple(scaler.state), scaler.config, scaler.state_dict())
    good = spec.to_state_dict(ScalerConfig(4.0, growth_interval=5), ScalerState(4.0, 1), "keras")
    for bad in [{**good, "scale": -1.0}, {**good, "growth_tracker": -2},
                {**good, "config": {**good["config"], "growth_interval": 0}},
                {k: v for k, v in good.items() if k != "hysteresis_tracker"}, [good]]:
        with pytest.raises((ValueError, TypeError)):
            scaler.load_state_dict(bad)
        assert (as_tuple(scaler.state), scaler.config, scaler.state_dict()) == before
        assert opt.scaler_config == before[1]
        if built:
            assert variable_state(opt) == before[0]
    if not built:
        opt.build(model.trainable_variables)
        assert variable_state(opt) == before[0]


def test_counters_are_read_only_and_capabilities_list_the_optional_members(keras):
    from unifiedamp.backends.keras import KerasGradScaler

    scaler = make_scaler(8.0)
    for name in ("num_steps", "num_skipped_steps", "last_step_skipped"):
        with pytest.raises(AttributeError):
            setattr(scaler, name, 3)
    assert KerasGradScaler.capabilities == {"wrap", "watch", "overflow_report", "history"}
    assert scaler.supports("wrap") and not scaler.supports("step")
    assert not scaler.functional
    with pytest.raises(NotImplementedError, match=r"no step\(\).*'wrap'.*scaler.update"):
        scaler.step(keras.optimizers.SGD())


def test_setters_return_the_scaler_and_reach_the_wrapped_optimizer(keras):
    scaler = make_scaler(**CUSTOM)
    assert scaler.set_growth_factor(3.0) is scaler  # before wrap: the held config
    opt = scaler.wrap(keras.optimizers.SGD())
    assert opt.scaler_config.growth_factor == 3.0
    assert scaler.set_backoff_factor(0.25).set_growth_interval(7).set_hysteresis(3) is scaler
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(),
            scaler.get_growth_interval(), scaler.get_hysteresis()) == (3.0, 0.25, 7, 3)
    assert opt.scaler_config == ScalerConfig(**{**CUSTOM, "growth_factor": 3.0,
                                                "backoff_factor": 0.25, "growth_interval": 7,
                                                "hysteresis": 3})
    with pytest.raises(ValueError):
        scaler.set_growth_factor(0.5)
    assert opt.scaler_config.growth_factor == 3.0
    state = scaler.state_dict()
    assert scaler.restore(make_scaler(2.0).state_dict()) is scaler and scaler.get_scale() == 2.0
    assert scaler.restore(state).get_scale() == CUSTOM["init_scale"]


@only_on("tensorflow", why="feeds TensorFlow tensors (tf.constant) and a "
         "tf.function's symbolic flag")
def test_update_is_the_custom_loop_protocol_and_refuses_a_wrapped_scaler(keras):
    import tensorflow as tf

    from unifiedamp.errors import NoInfChecksError

    scaler = make_scaler(1024.0, growth_interval=2, history=3)
    with pytest.raises(NoInfChecksError, match=r"records none.*scaler.update\(finite\)"):
        scaler.update()
    flags = [tf.constant(True), np.bool_(True), True, tf.constant(False), np.array(True)]
    for flag in flags:
        assert scaler.update(flag) is scaler
    expected = reference_states(scaler.config, [bool(f) for f in flags])
    assert as_tuple(scaler.state) == expected[-1]
    assert (scaler.num_steps, scaler.num_skipped_steps, scaler.last_step_skipped) == (5, 1, False)
    assert scaler.history().as_list() == [(3, 2048.0, False), (4, 1024.0, True),
                                          (5, 1024.0, False)]
    # torch's positional new_scale, and new_scale=: set, not counted.
    assert scaler.update(512.0).get_scale() == 512.0
    assert scaler.update(new_scale=tf.constant(256.0)).get_scale() == 256.0
    assert scaler.num_steps == 5 and scaler.state.growth_tracker == expected[-1][1]
    with pytest.raises(TypeError, match="got new_scale twice"):
        scaler.update(8.0, new_scale=4.0)
    with pytest.raises(ValueError, match="one flag for the whole step"):
        scaler.update(tf.constant([True, False]))
    with pytest.raises(TypeError, match=r"as its flag.*new_scale="):
        scaler.update("yes")  # neither a flag nor a number: refused

    @tf.function
    def compiled(finite):
        return scaler.update(finite)

    with pytest.raises(TypeError, match=r"symbolic flag .*tf.function.*scaler.wrap\(optimizer\)"):
        compiled(tf.constant(True))
    assert scaler.num_steps == 5
    disabled = make_scaler(enabled=False)
    assert disabled.update(False) is disabled and disabled.num_steps == 0

    # The updates made before a wrap count on; the optimizer takes the state over.
    held = scaler.state
    model = make_model()
    opt = scaler.wrap(keras.optimizers.SGD())
    eager_steps(model, opt, "FI")
    assert as_tuple(scaler.state) == reference_states(scaler.config, [True, False], held)[-1]
    assert (scaler.num_steps, scaler.num_skipped_steps, scaler.last_step_skipped) == (7, 2, True)
    with pytest.raises(RuntimeError, match=r"wraps an optimizer: .*apply\(\).*a second time"):
        scaler.update(tf.constant(True))
    with pytest.raises(RuntimeError, match="wraps an optimizer"):
        scaler.update()
    assert scaler.num_steps == 7


def test_tensorflow_is_the_keras_backend_and_keras_objects_are_detected(keras):
    import unifiedamp as ua
    from unifiedamp.backends.keras import KerasGradScaler

    by_name = ua.GradScaler(8.0, backend="tensorflow")
    assert type(by_name) is KerasGradScaler and by_name.get_scale() == 8.0
    assert type(ua.GradScaler(backend=keras.optimizers.SGD())) is KerasGradScaler
    assert type(ua.GradScaler(backend=make_model())) is KerasGradScaler
    assert by_name.state_dict()["backend"] == "keras"


def test_get_config_and_from_config_keep_the_unifiedamp_config(keras):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    opt = make_scaler(**CUSTOM).wrap(keras.optimizers.Adam(1e-3))
    config = opt.get_config()
    assert config["scaler_config"] == ScalerConfig(**CUSTOM).to_dict()
    for again in (SpecLossScaleOptimizer.from_config(config),
                  keras.optimizers.deserialize(keras.optimizers.serialize(opt))):
        assert type(again) is SpecLossScaleOptimizer
        assert again.scaler_config == ScalerConfig(**CUSTOM)
        # The class the original holds: Keras-on-torch makes a torch subclass of Adam.
        assert type(again.inner_optimizer) is type(opt.inner_optimizer)
        assert isinstance(again.inner_optimizer, keras.optimizers.Adam)
        again.build(make_model().trainable_variables)
        assert variable_state(again) == (np.float32(1024.0), 0, 0)


def test_from_config_without_the_inner_optimizer_names_what_to_pass(keras):
    opt = make_scaler(1024.0, growth_interval=7).wrap(keras.optimizers.SGD(0.1))
    config = opt.get_config()
    assert type(opt).from_config(config).scaler_config.growth_interval == 7
    for bad in ({k: v for k, v in config.items() if k != "inner_optimizer"}, None):
        with pytest.raises(ValueError, match=r"from_config: the config has no 'inner_optimizer'"
                                             r".*pass the dict get_config\(\) returns"):
            type(opt).from_config(bad)
