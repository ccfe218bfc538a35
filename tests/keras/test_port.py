"""Porting on Keras (``unifiedamp.porting``): a LossScaleOptimizer call's config follows
Keras's own trajectory (a real ``apply``) over a forced-overflow sequence; native_call's
keyword arguments build a real optimizer and from_native keeps its state, as unifiedamp's
wrapper of the same inner optimizer (Keras's own optimizer stepped eagerly: on TensorFlow and
torch); the natives table holds the installed signature."""

from __future__ import annotations

import pytest

keras = pytest.importorskip("keras")

from keras_helpers import apply_kinds  # noqa: E402
from port_runs import KINDS, check_installed_signatures, hexes, reference  # noqa: E402

from unifiedamp.porting import config_from_call, from_native, native_call  # noqa: E402
from unifiedamp.spec import ScalerConfig, ScalerState  # noqa: E402


def test_the_table_holds_the_installed_signatures():
    # Positional order and defaults as inspect reads them from the installed Keras.
    classes = {"keras.optimizers.LossScaleOptimizer": keras.optimizers.LossScaleOptimizer}
    assert check_installed_signatures(classes) == 1


#: Keras's own LossScaleOptimizer stepped eagerly (``opt.apply`` outside a traced step) on
#: JAX leaks a tracer out of its ``cond`` (Keras 3.15): the native side of these checks runs
#: on TensorFlow and torch.
EAGER_NATIVE = pytest.mark.skipif(
    keras.backend.backend() == "jax",
    reason="KERAS_BACKEND=jax: keras.optimizers.LossScaleOptimizer.apply run eagerly leaks a "
           "JAX tracer from its cond (Keras 3.15); checked on tensorflow and torch")


@EAGER_NATIVE
@pytest.mark.parametrize(("args", "kwargs"), [((1024.0, 3), {}), ((), {"dynamic_growth_steps": 2}),
                                              ((), {"initial_scale": 512.0})])
def test_keras_call_config_follows_keras_own_trajectory(args, kwargs):
    inner = keras.optimizers.SGD(0.01)
    config, notes = config_from_call("keras.optimizers.LossScaleOptimizer", (inner, *args),
                                     kwargs)
    kinds = KINDS if config.init_scale < 2**15 else "FFIFF"  # no growth past float32 here
    native = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), *args, **kwargs)
    scales, _ = apply_kinds(native, kinds)
    assert hexes(scales) == reference(config, kinds)


@EAGER_NATIVE
def test_keras_native_call_round_trips_and_from_native_keeps_state():
    from unifiedamp.backends.keras import KerasGradScaler, SpecLossScaleOptimizer

    config = ScalerConfig(1024.0, growth_interval=3)
    kwargs, problems = native_call(config, "keras")
    assert problems == []
    inner = keras.optimizers.SGD(0.01)
    native = keras.optimizers.LossScaleOptimizer(inner, **kwargs)
    assert from_native(native).config == config
    _, var = apply_kinds(native, "FFIFF")
    ours = from_native(native)
    assert isinstance(ours, KerasGradScaler) and isinstance(ours.optimizer, SpecLossScaleOptimizer)
    assert ours.optimizer.inner_optimizer is inner
    assert ours.state == ScalerState(512.0, 2, 0)
    a, _ = apply_kinds(native, KINDS, var)
    b, _ = apply_kinds(ours.optimizer, KINDS, var)
    assert hexes(a) == hexes(b)
    assert from_native(ours.optimizer).optimizer is ours.optimizer
