"""The wrapper where it stands in for Keras's own ``keras.optimizers.LossScaleOptimizer``, on the
session's Keras backend: a skipped step leaves every weight and every slot of the inner
optimizer as it was (SGD, SGD with momentum, Adam; ``apply`` and ``stateless_apply``),
``scale_loss`` takes what Keras's class takes, and Keras's constructor arguments are honoured,
from a config Keras's class saved too, or refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from keras_helpers import BACKEND

INNER = {
    "sgd": lambda keras: keras.optimizers.SGD(0.5),
    "momentum": lambda keras: keras.optimizers.SGD(0.5, momentum=0.9),
    "adam": lambda keras: keras.optimizers.Adam(0.1),
}


def _values(variables):
    from keras import ops

    return [ops.convert_to_numpy(v) for v in variables]


def _step(opt, grads, weights, stateless):
    """One update; the weights' and the optimizer's values after it."""
    if not stateless:
        opt.apply(grads, weights)
        return _values(weights), _values(opt.variables)
    new_weights, new_opt = opt.stateless_apply(
        [v.value for v in opt.variables], grads, [w.value for w in weights])
    for variable, value in zip(opt.variables, new_opt, strict=True):
        variable.assign(value)
    for weight, value in zip(weights, new_weights, strict=True):
        weight.assign(value)
    return _values(new_weights), _values(new_opt)


@pytest.mark.parametrize("stateless", [False, True], ids=["apply", "stateless_apply"])
@pytest.mark.parametrize("kind", sorted(INNER))
def test_a_skipped_step_leaves_every_weight_and_slot_untouched(keras, kind, stateless):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    if stateless and BACKEND == "tensorflow":
        pytest.skip("Keras's TensorFlow optimizers have no stateless_apply")
    if not stateless and BACKEND == "jax":
        pytest.skip("Keras's JAX optimizers step through stateless_apply")
    inner = INNER[kind](keras)
    opt = SpecLossScaleOptimizer(inner, initial_scale=1024.0)
    weights = [keras.Variable([1.0, 2.0, 3.0, 4.0]), keras.Variable([[0.5, -0.5]])]
    opt.build(weights)
    finite = [keras.ops.array([1.0, 6.0, 7.0, 2.0]) * 1024.0, keras.ops.array([[2.0, 3.0]])]
    # A finite step first, so that momentum and Adam's moments are not zero.
    before_weights, _ = _step(opt, finite, weights, stateless)
    before_inner = _values(inner.variables)
    overflow = [keras.ops.array([1.0, np.inf, 7.0, 2.0]), keras.ops.array([[np.nan, 3.0]])]
    after_weights, _ = _step(opt, overflow, weights, stateless)
    for before, after in zip(before_weights + before_inner,
                             after_weights + _values(inner.variables), strict=True):
        np.testing.assert_array_equal(after, before)
    assert float(_values([opt.dynamic_scale])[0]) == 512.0


@pytest.mark.parametrize("loss", [
    1.0, 3, np.array([1.0, 2.0]), np.array(2), np.float32(2.0)], ids=repr)
@pytest.mark.parametrize("built", [False, True], ids=["unbuilt", "built"])
def test_scale_loss_takes_python_numbers_and_numpy_arrays_as_keras_does(keras, loss, built):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    native = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=400.0)
    ours = SpecLossScaleOptimizer(keras.optimizers.SGD(), initial_scale=400.0)
    if built:
        for opt in (native, ours):
            opt.build([keras.Variable([1.0])])
    want, got = native.scale_loss(loss), ours.scale_loss(loss)
    assert keras.backend.standardize_dtype(got.dtype) == \
        keras.backend.standardize_dtype(want.dtype)
    np.testing.assert_array_equal(*_values([got, want]))


def test_keras_constructor_arguments_set_the_rule(keras):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    opt = SpecLossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=400.0,
                                 dynamic_growth_steps=2)
    assert (opt.scaler_config.init_scale, opt.scaler_config.growth_interval) == (400.0, 2)
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (400.0, 2)
    weights = [keras.Variable([1.0, 2.0])]
    opt.build(weights)
    assert float(_values([opt.dynamic_scale])[0]) == 400.0
    for _ in range(2):
        opt.apply([keras.ops.array([1.0, 1.0])], weights)
    assert float(_values([opt.dynamic_scale])[0]) == 800.0


def test_from_config_of_a_config_keras_own_class_saved_keeps_its_arguments(keras):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    native = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.5), initial_scale=400.0, dynamic_growth_steps=2, name="lso")
    opt = SpecLossScaleOptimizer.from_config(native.get_config())
    assert (opt.scaler_config.init_scale, opt.scaler_config.growth_interval) == (400.0, 2)
    assert opt.name == "lso"
    again = SpecLossScaleOptimizer.from_config(opt.get_config())
    assert again.scaler_config == opt.scaler_config


def test_keras_arguments_that_disagree_with_scaler_config_or_are_invalid_are_refused(keras):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    inner = keras.optimizers.SGD()
    with pytest.raises(ValueError, match=r"initial_scale=400.0 disagrees with scaler_config's "
                                         r"init_scale=1024.0: give one of them"):
        SpecLossScaleOptimizer(inner, scaler_config={"init_scale": 1024.0}, initial_scale=400.0)
    with pytest.raises(ValueError, match="dynamic_growth_steps: growth_interval must be an int"):
        SpecLossScaleOptimizer(inner, dynamic_growth_steps=0)
    with pytest.raises(TypeError, match="initial_scale: init_scale must be a finite number"):
        SpecLossScaleOptimizer(inner, initial_scale="big")
    # Nothing changed: the inner optimizer is free to wrap, and the same value twice is fine.
    opt = SpecLossScaleOptimizer(inner, scaler_config={"init_scale": 1024.0},
                                 initial_scale=1024)
    assert opt.scaler_config.init_scale == 1024.0
