"""What the Keras backend's tests share (``tests/keras/test_keras_*.py``): a small model and
its data, the gradients by the session's Keras backend's own autodiff, the spec's reference
states, and ``only_on``, which skips a test written for some Keras backends on the others.

The keras session runs once per ``KERAS_BACKEND`` (tensorflow, jax, torch): importing this
module imports Keras with the session's backend.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import pytest
from keras import ops

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState

#: The Keras backend of this session (fixed when Keras is imported).
BACKEND = keras.backend.backend()

CUSTOM = {"init_scale": 1024.0, "growth_factor": 1.5, "backoff_factor": 0.7,
          "growth_interval": 3, "hysteresis": 2, "min_scale": 800.0}


def only_on(*backends: str, why: str) -> pytest.MarkDecorator:
    """Skips the test unless the session's Keras backend is one of ``backends``; ``why``
    says what the test needs of them."""
    return pytest.mark.skipif(BACKEND not in backends,
                              reason=f"KERAS_BACKEND={BACKEND}: {why}")


def as_tuple(state: ScalerState) -> tuple[np.float32, int, int]:
    return np.float32(state.scale), int(state.growth_tracker), int(state.hysteresis_tracker)


def reference_states(config: ScalerConfig, finite_flags: list[bool],
                     start: ScalerState | None = None) -> list[tuple[np.float32, int, int]]:
    """The spec's state after each update, as (float32 scale, growth, hysteresis)."""
    state = start if start is not None else ScalerState.initial(config)
    out = []
    for finite in finite_flags:
        state = spec.update(config, state, not finite)
        out.append(as_tuple(state))
    return out


def assert_states(seen: list, expected: list) -> None:
    assert len(seen) == len(expected), (len(seen), len(expected))
    for step, (got, want) in enumerate(zip(seen, expected, strict=True)):
        assert (got[0].dtype, got) == (want[0].dtype, want), f"step {step}: {got} != {want}"


def variable_state(opt) -> tuple[np.float32, int, int]:
    """The wrapped optimizer's three variables, read directly (not through the scaler)."""
    return (np.float32(ops.convert_to_numpy(opt.dynamic_scale)),
            int(ops.convert_to_numpy(opt.step_counter)),
            int(ops.convert_to_numpy(opt.hysteresis_counter)))


@contextlib.contextmanager
def dtype_policy(name: str):
    before = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(before)


def make_model(seed: int = 0):
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu",
                           kernel_initializer=keras.initializers.GlorotUniform(seed)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
    ])


def make_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x @ np.array([[0.5], [-0.25], [0.125], [1.0]], np.float32)).astype(np.float32)
    return x, y


def with_inf(x: np.ndarray, row: int = 1) -> np.ndarray:
    x = x.copy()
    x[row, 2] = np.inf
    return x


def mse(y_pred, y):
    return ops.mean(ops.square(ops.cast(y_pred, "float32") - ops.convert_to_tensor(y)))


def gradients(model, x: np.ndarray, y: np.ndarray, scale_fn) -> list:
    """The gradients of ``scale_fn(mse)`` by the Keras backend's own autodiff."""
    variables = model.trainable_variables
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = scale_fn(mse(model(x, training=True), y))
        return tape.gradient(loss, variables)
    if BACKEND == "torch":
        for v in variables:
            v.value.grad = None
        scale_fn(mse(model(x, training=True), y)).backward()
        return [v.value.grad.clone() for v in variables]
    if BACKEND == "jax":
        import jax

        frozen = [v.value for v in model.non_trainable_variables]

        def f(trainable):
            y_pred, _ = model.stateless_call(trainable, frozen, x, training=True)
            return scale_fn(mse(y_pred, y))

        return jax.grad(f)([v.value for v in variables])
    raise NotImplementedError(BACKEND)


def all_finite(grads: list) -> bool:
    return all(np.isfinite(np.asarray(ops.convert_to_numpy(g), np.float32)).all()
               for g in grads)


def to_numpy(values) -> list[np.ndarray]:
    return [np.array(ops.convert_to_numpy(v)) for v in values]


def snapshot(model, opt) -> list[np.ndarray]:
    """Weights, then every variable of the inner optimizer (iterations, moments...)."""
    return to_numpy([*model.trainable_variables, *opt.inner_optimizer.variables])


def snapshot_plain(model, opt) -> list[np.ndarray]:
    """Weights, then every variable of an optimizer that wraps none."""
    return to_numpy([*model.trainable_variables, *opt.variables])


def assert_same_arrays(after: list[np.ndarray], before: list[np.ndarray], what: str) -> None:
    assert len(after) == len(before)
    for i, (a, b) in enumerate(zip(after, before, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"{what}: array {i} changed")


def make_scaler(*args, **kwargs):
    from unifiedamp.backends.keras import KerasGradScaler

    return KerasGradScaler(*args, **kwargs)


def scaler_of(opt):
    from unifiedamp.backends.keras import KerasGradScaler

    return KerasGradScaler.of(opt)


def counters(scaler) -> tuple[int, int, bool]:
    return scaler.num_steps, scaler.num_skipped_steps, scaler.last_step_skipped


def fit_states(model, scaler, kinds: str, epochs: int = 1,
               change=None) -> list[tuple[np.float32, int, int]]:
    """``model.fit`` over a batch of 4 per kind (``F`` finite, ``I`` inf) in each epoch: the
    scaler's state after each batch. ``change``: ``(batch, fn)``, ``fn()`` called by a
    callback after that batch of the first epoch."""
    x, y = make_data(4 * len(kinds))
    for i, kind in enumerate(kinds):
        if kind == "I":
            x = with_inf(x, row=4 * i + 1)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            assert self.model is model  # under JAX, reading .model syncs the variables
            seen.append(as_tuple(scaler.state))
            if change is not None and len(seen) == change[0] + 1:
                change[1]()

    model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[Record()])
    return seen


def eager_steps(model, opt, kinds: str) -> None:
    """Custom-loop steps (eager: no train function to trace), ``F`` finite, ``I`` inf."""
    x, y = make_data(8)
    for kind in kinds:
        grads = gradients(model, with_inf(x) if kind == "I" else x, y, opt.scale_loss)
        opt.apply(grads, model.trainable_variables)


def compiled_apply(opt, variables):
    """``grads -> None``: ``opt.apply`` compiled by the user's own tracer (``tf.function``;
    ``jax.jit`` of ``stateless_apply``, the results written back), eager on torch."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda grads: opt.apply(grads, variables))
    if BACKEND == "jax":
        import jax

        step = jax.jit(opt.stateless_apply)

        def apply(grads):
            new_tvs, new_ovs = step([v.value for v in opt.variables], grads,
                                    [v.value for v in variables])
            for var, value in zip([*variables, *opt.variables], [*new_tvs, *new_ovs],
                                  strict=True):
                var.assign(value)

        return apply
    return lambda grads: opt.apply(grads, variables)


def apply_kinds(opt, kinds: str, var=None) -> tuple[list[float], object]:
    """Applies one gradient per kind (``"F"`` finite, ``"I"`` inf) to a 3-element variable
    (``var``, else a new one of ones) with ``opt.apply``; the scale after each, and the
    variable."""
    if var is None:
        var = keras.Variable(np.ones(3, np.float32))
    scales = []
    for kind in kinds:
        grad = np.full(3, np.inf if kind == "I" else 1.0, np.float32)
        opt.apply([ops.convert_to_tensor(grad)], [var])
        scales.append(float(ops.convert_to_numpy(opt.dynamic_scale)))
    return scales, var

