"""The Keras backend on every Keras backend: ``scaler.wrap`` in ``model.fit`` and in custom
loops, skipped steps, XLA, serialisation (the shared contract runs in
test_conformance_builtin.py for TensorFlow and here, in subprocesses, for JAX and torch).

The ``check_*`` functions are backend-agnostic bodies. The pytest process runs them on
Keras's default backend (TensorFlow); for ``KERAS_BACKEND=jax`` and ``torch`` one child
pytest per backend runs them (plus the packaged conformance suite) and each test here reads
its own outcome from that child's JUnit report. Keras, TensorFlow, JAX and torch are
imported only inside functions: ``tests/conftest.py`` orders these tests after paddle's.
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from _shared_child import SharedChild

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState

pytestmark = pytest.mark.framework("keras")

CHILD_BACKENDS = ("jax", "torch")
CUSTOM = {"init_scale": 1024.0, "growth_factor": 1.5, "backoff_factor": 0.7,
          "growth_interval": 3, "hysteresis": 2, "min_scale": 800.0}


# ------------------------------------------------------------ helpers (no framework at import)


def _as_tuple(state: ScalerState) -> tuple[np.float32, int, int]:
    return np.float32(state.scale), int(state.growth_tracker), int(state.hysteresis_tracker)


def _reference(config: ScalerConfig, finite_flags: list[bool],
               start: ScalerState | None = None) -> list[tuple[np.float32, int, int]]:
    """The spec's state after each update, as (float32 scale, growth, hysteresis)."""
    state = start if start is not None else ScalerState.initial(config)
    out = []
    for finite in finite_flags:
        state = spec.update(config, state, not finite)
        out.append(_as_tuple(state))
    return out


def _assert_states(seen: list, expected: list) -> None:
    assert len(seen) == len(expected), (len(seen), len(expected))
    for step, (got, want) in enumerate(zip(seen, expected, strict=True)):
        assert (got[0].dtype, got) == (want[0].dtype, want), f"step {step}: {got} != {want}"


def _variable_state(opt) -> tuple[np.float32, int, int]:
    """The wrapped optimizer's three variables, read directly (not through the scaler)."""
    from keras import ops

    return (np.float32(ops.convert_to_numpy(opt.dynamic_scale)),
            int(ops.convert_to_numpy(opt.step_counter)),
            int(ops.convert_to_numpy(opt.hysteresis_counter)))


@contextlib.contextmanager
def _policy(name: str):
    import keras

    before = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(before)


def _model(seed: int = 0):
    import keras

    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu",
                           kernel_initializer=keras.initializers.GlorotUniform(seed)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
    ])


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x @ np.array([[0.5], [-0.25], [0.125], [1.0]], np.float32)).astype(np.float32)
    return x, y


def _with_inf(x: np.ndarray, row: int = 1) -> np.ndarray:
    x = x.copy()
    x[row, 2] = np.inf
    return x


def _loss(y_pred, y):
    from keras import ops

    return ops.mean(ops.square(ops.cast(y_pred, "float32") - ops.convert_to_tensor(y)))


def _gradients(model, x: np.ndarray, y: np.ndarray, scale_fn) -> list:
    """The gradients of ``scale_fn(mse)`` by the Keras backend's own autodiff."""
    import keras

    backend = keras.backend.backend()
    variables = model.trainable_variables
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = scale_fn(_loss(model(x, training=True), y))
        return tape.gradient(loss, variables)
    if backend == "torch":
        for v in variables:
            v.value.grad = None
        scale_fn(_loss(model(x, training=True), y)).backward()
        return [v.value.grad.clone() for v in variables]
    if backend == "jax":
        import jax

        frozen = [v.value for v in model.non_trainable_variables]

        def f(trainable):
            y_pred, _ = model.stateless_call(trainable, frozen, x, training=True)
            return scale_fn(_loss(y_pred, y))

        return jax.grad(f)([v.value for v in variables])
    raise NotImplementedError(backend)


def _all_finite(grads: list) -> bool:
    from keras import ops

    return all(np.isfinite(np.asarray(ops.convert_to_numpy(g), np.float32)).all()
               for g in grads)


def _numpy(values) -> list[np.ndarray]:
    from keras import ops

    return [np.array(ops.convert_to_numpy(v)) for v in values]


def _snapshot(model, opt) -> list[np.ndarray]:
    """Weights, then every variable of the inner optimizer (iterations, moments...)."""
    return _numpy([*model.trainable_variables, *opt.inner_optimizer.variables])


def _assert_same_arrays(after: list[np.ndarray], before: list[np.ndarray], what: str) -> None:
    assert len(after) == len(before)
    for i, (a, b) in enumerate(zip(after, before, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"{what}: array {i} changed")


def _scaler(*args, **kwargs):
    from unifiedamp.backends.keras import KerasGradScaler

    return KerasGradScaler(*args, **kwargs)


def _fit_states(model, scaler, kinds: str, epochs: int = 1,
                change=None) -> list[tuple[np.float32, int, int]]:
    """``model.fit`` over a batch of 4 per kind (``F`` finite, ``I`` inf) in each epoch: the
    scaler's state after each batch. ``change``: ``(batch, fn)``, ``fn()`` called by a
    callback after that batch of the first epoch."""
    import keras

    x, y = _data(4 * len(kinds))
    for i, kind in enumerate(kinds):
        if kind == "I":
            x = _with_inf(x, row=4 * i + 1)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            assert self.model is model  # under JAX, reading .model syncs the variables
            seen.append(_as_tuple(scaler.state))
            if change is not None and len(seen) == change[0] + 1:
                change[1]()

    model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[Record()])
    return seen


def _compiled_apply(opt, variables):
    """``grads -> None``: ``opt.apply`` compiled by the user's own tracer (``tf.function``;
    ``jax.jit`` of ``stateless_apply``, the results written back), eager on torch."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda grads: opt.apply(grads, variables))
    if backend == "jax":
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


# ------------------------------------------------------------ checks, on every Keras backend


def check_fit_with_mixed_float16_follows_spec_over_epochs():
    import keras

    with _policy("mixed_float16"):
        scaler = _scaler(1024.0, growth_factor=1.5, backoff_factor=0.25, growth_interval=2)
        opt = scaler.wrap(keras.optimizers.Adam(1e-3))
        model = _model()
        model.compile(optimizer=opt, loss="mse")
        assert model.optimizer is opt
        assert model.layers[0].compute_dtype == "float16"
        seen = _fit_states(model, scaler, "FFFFIF", epochs=3)
    expected = _reference(scaler.config, [True, True, True, True, False, True] * 3)
    assert max(s[0] for s in expected) > 1024.0 and min(s[0] for s in expected) < 1024.0
    _assert_states(seen, expected)
    assert _as_tuple(scaler.state) == expected[-1] and scaler.get_scale() == expected[-1][0]
    assert int(opt.iterations) == 15  # the 3 skipped steps are not counted
    assert all(np.isfinite(w).all() for w in _numpy(model.trainable_variables))


def check_custom_loop_follows_spec_step_by_step():
    """The backend's own autodiff (GradientTape, torch autograd, jax.grad) and the stateful
    ``opt.apply`` (which Keras 3.15's own LossScaleOptimizer cannot do under JAX)."""
    import keras

    pattern = "FFFIIFFFIFIIF"
    with _policy("mixed_float16"):
        scaler = _scaler(**CUSTOM)
        model = _model()
        opt = scaler.wrap(keras.optimizers.Adam(1e-3))
        opt.build(model.trainable_variables)
        x, y = _data(8)
        seen, flags = [], []
        for step, kind in enumerate(pattern):
            xb = _with_inf(x) if kind == "I" else x
            scale_fn = opt.scale_loss if step % 2 else opt.get_scaled_loss
            grads = _gradients(model, xb, y, scale_fn)
            flags.append(_all_finite(grads))
            opt.apply(grads, model.trainable_variables)
            seen.append(_as_tuple(scaler.state))
    assert flags == [kind == "F" for kind in pattern]
    _assert_states(seen, _reference(scaler.config, flags))
    assert int(opt.iterations) == pattern.count("F")


def check_unscaled_gradients_are_the_gradients_of_the_unscaled_loss():
    import keras

    scaler = _scaler(512.0, growth_interval=1)
    model = _model()
    opt = scaler.wrap(keras.optimizers.SGD(1e-2))
    opt.build(model.trainable_variables)
    x, y = _data(8)
    opt.apply(_gradients(model, x, y, opt.scale_loss), model.trainable_variables)
    assert scaler.get_scale() == 1024.0  # unscaling must use the current scale, not init_scale
    reference = _numpy(_gradients(model, x, y, lambda loss: loss))
    scaled = _gradients(model, x, y, opt.scale_loss)
    # A power of two: scaling and unscaling are exact.
    _assert_same_arrays(_numpy(opt.get_unscaled_gradients(scaled)), reference, "2**10")
    _assert_same_arrays(_numpy(opt.unscale_gradients(scaled)), reference, "2**10")
    scaler.load_state_dict(spec.to_state_dict(scaler.config, ScalerState(1000.0), "keras"))
    scaled = _gradients(model, x, y, opt.scale_loss)
    assert not np.allclose(_numpy(scaled)[0], reference[0], rtol=0.5)
    for got, want in zip(_numpy(opt.get_unscaled_gradients(scaled)), reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)


def check_skipped_step_leaves_weights_moments_and_iterations_untouched():
    import keras

    scaler = _scaler(256.0, growth_interval=1000)
    model = _model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=opt, loss="mse")
    x, y = _data(8)
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    before = _snapshot(model, opt)
    assert int(opt.iterations) == 2 and np.abs(before[-1]).max() > 0  # moments are non-zero
    model.train_on_batch(_with_inf(x), y)  # the compiled fit step
    _assert_same_arrays(_snapshot(model, opt), before, "train_on_batch on an inf batch")
    assert _as_tuple(scaler.state) == (np.float32(128.0), 0, 0)
    grads = _gradients(model, _with_inf(x), y, opt.scale_loss)  # a custom loop's apply
    opt.apply(grads, model.trainable_variables)
    _assert_same_arrays(_snapshot(model, opt), before, "apply() of inf gradients")
    assert _as_tuple(scaler.state) == (np.float32(64.0), 0, 0)
    assert int(opt.iterations) == 2
    model.train_on_batch(x, y)
    assert int(opt.iterations) == 3
    assert not np.array_equal(_numpy(model.trainable_variables)[0], before[0])
    assert _as_tuple(scaler.state) == (np.float32(64.0), 1, 0)


def check_fit_and_compiled_apply_follow_a_rule_changed_after_compiling():
    """``model.fit``'s train step and a loop's ``apply`` compiled by the user follow each
    change of the rule made after they were traced, also in the middle of ``fit``: the
    setters; ``load_state_dict`` of another config (before the optimizer is built; min_scale
    and max_scale; dynamic=False), its state included."""
    import keras
    from keras import ops

    scaler = _scaler(1024.0, growth_interval=3)
    model = _model()
    opt = scaler.wrap(keras.optimizers.SGD(1e-3))
    model.compile(optimizer=opt, loss="mse")
    apply = _compiled_apply(opt, model.trainable_variables)
    kinds = "FFIIF"
    flags = [kind == "F" for kind in kinds]
    # Whether a step skips is all the rule sees of the gradients.
    grads = {"F": [np.full(v.shape, 0.5, np.float32) for v in model.trainable_variables]}
    grads["I"] = [g.copy() for g in grads["F"]]
    grads["I"][0].flat[-1] = np.inf

    def follows(change):
        previous = scaler.config
        change()
        config, start = scaler.config, scaler.state
        assert opt.scaler_config == config != previous
        expected = _reference(config, flags, start)
        assert expected != _reference(previous, flags, start), "the change changes nothing"
        _assert_states(_fit_states(model, scaler, kinds), expected)
        expected = _reference(config, flags, scaler.state)
        seen = []
        for kind in kinds:
            apply([ops.convert_to_tensor(g) for g in grads[kind]])
            seen.append(_as_tuple(scaler.state))
        _assert_states(seen, expected)

    def load(config, state):
        return lambda: scaler.load_state_dict(spec.to_state_dict(config, state, "torch"))

    def setters():
        scaler.set_growth_interval(1)
        scaler.set_growth_factor(1.5)
        scaler.set_backoff_factor(0.25)
        scaler.set_hysteresis(2)

    assert not opt.built
    follows(load(ScalerConfig(1024.0, growth_interval=2), ScalerState(1536.0, 1, 0)))
    follows(setters)
    assert scaler.config == ScalerConfig(1024.0, 1.5, 0.25, 1, hysteresis=2)
    previous, start = scaler.config, scaler.state
    seen = _fit_states(model, scaler, kinds, change=(1, lambda: scaler.set_growth_interval(2)))
    before = _reference(previous, flags[:2], start)
    after = _reference(scaler.config, flags[2:], ScalerState(float(before[-1][0]),
                                                             *before[-1][1:]))
    assert before + after != _reference(previous, flags, start)
    _assert_states(seen, before + after)
    follows(load(ScalerConfig(512.0, 4.0, 0.125, 2, min_scale=200.0, max_scale=1000.0),
                 ScalerState(300.0, 1, 0)))
    follows(load(ScalerConfig(512.0, dynamic=False), ScalerState(300.0, 1, 0)))


def _counters(scaler) -> tuple[int, int, bool]:
    return scaler.num_steps, scaler.num_skipped_steps, scaler.last_step_skipped


def check_counters_follow_fit_and_a_compiled_apply():
    """``num_steps``, ``num_skipped_steps`` and ``last_step_skipped`` count the wrapped
    optimizer's updates, read from its device counters: in ``fit`` (compiled by the
    backend), in a custom loop's ``apply`` compiled by the user, across epochs."""
    import keras
    from keras import ops

    scaler = _scaler(1024.0, growth_interval=2)
    assert _counters(scaler) == (0, 0, False)
    model = _model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=opt, loss="mse")
    assert _counters(scaler) == (0, 0, False)  # not built yet
    kinds = "FFIFIIF"
    seen = []
    x, y = _data(4 * len(kinds))
    for i, kind in enumerate(kinds):
        if kind == "I":
            x = _with_inf(x, row=4 * i + 1)

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            assert self.model is model  # under JAX, reading .model syncs the variables
            seen.append(_counters(scaler))

    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[Record()])
    flags = [kind == "I" for kind in kinds] * 2
    assert seen == [(k + 1, sum(flags[:k + 1]), flags[k]) for k in range(len(flags))]
    assert _counters(scaler) == (14, 6, False)
    apply = _compiled_apply(opt, model.trainable_variables)
    grads = [np.full(v.shape, 0.5, np.float32) for v in model.trainable_variables]
    bad = [g.copy() for g in grads]
    bad[0].flat[-1] = np.nan
    apply([ops.convert_to_tensor(g) for g in bad])
    assert _counters(scaler) == (15, 7, True)
    apply([ops.convert_to_tensor(g) for g in grads])
    assert _counters(scaler) == (16, 7, False)
    assert _as_tuple(scaler.state) == _reference(scaler.config, [not f for f in flags] +
                                                 [False, True])[-1]
    # A manual scale is no update.
    assert scaler.update(new_scale=64.0) is scaler and scaler.get_scale() == 64.0
    assert _counters(scaler) == (16, 7, False) and _variable_state(opt)[0] == 64.0


def check_protocol_custom_loop_follows_spec_without_wrap():
    """The protocol every backend shares, in an eager Keras loop where only the gradient
    call is the backend's (GradientTape, jax.grad over stateless_call, torch backward):
    scale, unscale, a step where finite (``apply``, or ``where_finite`` over the
    variables' values), ``update(finite)``. The scale, the trackers and the skips follow
    the spec bit for bit, the unscaled gradients are ``g * f32(1 / scale)`` bit for bit,
    and a skipped step leaves the weights and the optimizer as they were."""
    import keras
    from keras import ops

    pattern = "FFFIIFFFIFIIF"
    with _policy("mixed_float16"):
        scaler = _scaler(**CUSTOM, history=4)
        model = _model()
        opt = keras.optimizers.Adam(1e-3)
        opt.build(model.trainable_variables)
        tvs = model.trainable_variables
        x, y = _data(8)
        seen, skips = [], []
        for step, kind in enumerate(pattern):
            before = _snapshot_plain(model, opt)
            scale = np.float32(scaler.get_scale())
            scaled = _gradients(model, _with_inf(x) if kind == "I" else x, y, scaler.scale)
            grads, finite = scaler.unscale(scaled)
            assert _numpy([finite])[0].dtype == bool and _numpy([finite])[0].shape == ()
            assert bool(finite) == (kind == "F")
            if kind == "F":
                with np.errstate(over="ignore"):
                    want = [g * np.float32(1.0 / float(scale)) for g in _numpy(scaled)]
                _assert_same_arrays(_numpy(grads), want, f"step {step}: unscaled gradients")
            if step % 2:
                if finite:  # a host read: this loop is eager
                    opt.apply(grads, tvs)
            else:
                new = [v.value - 0.01 * ops.cast(g, v.dtype) for v, g in
                       zip(tvs, grads, strict=True)]
                values = scaler.where_finite(finite, new, [v.value for v in tvs])
                for v, value in zip(tvs, values, strict=True):
                    v.assign(value)
            if kind == "I":
                _assert_same_arrays(_snapshot_plain(model, opt), before, f"step {step}")
            else:
                assert not np.array_equal(_numpy(tvs)[0], before[0]), f"step {step}"
            assert scaler.update(finite) is scaler
            seen.append(_as_tuple(scaler.state))
            skips.append(scaler.last_step_skipped)
    flags = [kind == "F" for kind in pattern]
    expected = _reference(scaler.config, flags)
    assert len({s[0] for s in expected}) >= 3  # grows and backs off
    _assert_states(seen, expected)
    assert skips == [not f for f in flags]
    assert (scaler.num_steps, scaler.num_skipped_steps) == (len(pattern), pattern.count("I"))
    assert scaler.history().as_list()[-1] == (len(pattern), float(expected[-1][0]), False)
    assert [r[2] for r in scaler.history().as_list()] == skips[-4:]


def _snapshot_plain(model, opt) -> list[np.ndarray]:
    return _numpy([*model.trainable_variables, *opt.variables])


def check_where_finite_compiles_and_selects_leaf_by_leaf():
    """``where_finite`` under the backend's compiler (``tf.function``, ``jax.jit``; eager
    on torch): a dict of leaves, each kept in ``old``'s dtype, with no host read."""
    import keras
    from keras import ops

    scaler = _scaler()
    new = {"w": np.full((2, 3), 2.0, np.float32), "b": [np.float16(3.0)]}
    old = {"w": np.zeros((2, 3), np.float32), "b": [np.float16(-1.0)]}
    backend = keras.backend.backend()
    fn = scaler.where_finite
    if backend == "tensorflow":
        import tensorflow as tf

        fn = tf.function(fn)
    elif backend == "jax":
        import jax

        fn = jax.jit(fn)
    for flag in (True, False):
        out = fn(ops.convert_to_tensor(flag), new, old)
        want = new if flag else old
        assert sorted(out) == ["b", "w"]
        np.testing.assert_array_equal(ops.convert_to_numpy(out["w"]), want["w"])
        got = ops.convert_to_numpy(out["b"][0])
        assert (got.dtype, float(got)) == (np.float16, float(want["b"][0]))
    with pytest.raises(ValueError, match="differ in structure"):
        scaler.where_finite(True, [1.0, 2.0], [1.0])
    with pytest.raises(TypeError, match="the one flag unscale"):
        scaler.where_finite(ops.convert_to_tensor([True, False]), new, old)


# ------------------------------------------------------------ checks specific to JAX


def check_huge_finite_gradients_are_applied_and_one_inf_among_them_skipped():
    """Finite gradients whose float32 sum would overflow are finite: a check that sums
    the gradients (or |g|) is wrong there; only an inf or NaN element may skip the step."""
    import keras
    from keras import ops

    scaler = _scaler(1.0, growth_interval=1)
    model = _model()
    opt = scaler.wrap(keras.optimizers.SGD(0.0))
    tvs = model.trainable_variables
    opt.build(tvs)
    huge = [np.full(v.shape, 3e38, np.float32) for v in tvs]
    opt.apply([ops.convert_to_tensor(g) for g in huge], tvs)
    assert _as_tuple(scaler.state) == (np.float32(2.0), 0, 0), "3e38 everywhere is finite"
    huge[-1].flat[-1] = -np.inf
    opt.apply([ops.convert_to_tensor(g) for g in huge], tvs)
    assert _as_tuple(scaler.state) == (np.float32(1.0), 0, 0), "one -inf must skip"


def check_finiteness_test_is_exact_for_every_shape_and_dtype():
    """The wrapper's test of the gradients, also where fast forms go wrong: an inf or NaN
    as the last element of a large array (XLA's CPU ``max`` drops a NaN there), empty and
    scalar gradients, float16 and bfloat16; under ``jax.jit`` too on JAX."""
    import keras
    from keras import ops

    from unifiedamp.backends.keras._optimizer import paths_for

    _all_finite = paths_for(keras.backend.backend()).all_finite
    jitted = None
    if keras.backend.backend() == "jax":
        import jax

        jitted = jax.jit(_all_finite)  # once: it compiles once per list of shapes and dtypes

    def run(arrays: list[np.ndarray], dtype: str) -> bool:
        tensors = [ops.cast(ops.convert_to_tensor(a), dtype) for a in arrays]
        eager = bool(ops.convert_to_numpy(_all_finite(tensors)))
        if jitted is not None:
            assert bool(jitted(tensors)) == eager, "jit and eager disagree"
        return eager

    rng = np.random.default_rng(0)
    big = rng.standard_normal(1 << 20).astype(np.float32)
    shapes = [(), (1,), (0,), (3, 0), (7, 5), (1 << 20,)]
    for dtype in ("float32", "float16", "bfloat16"):
        arrays = [big if s == (1 << 20,) else rng.standard_normal(s).astype(np.float32)
                  for s in shapes]
        assert run(arrays, dtype), f"{dtype}: finite gradients reported non-finite"
        assert run([arrays[2], arrays[3]], dtype), f"{dtype}: empty gradients are finite"
        for i, a in enumerate(arrays):
            if a.size == 0:
                continue
            for bad in (np.inf, -np.inf, np.nan):
                for position in sorted({0, a.size // 2, a.size - 1}):
                    spoiled = [x.copy() for x in arrays]
                    flat = spoiled[i].reshape(-1)
                    flat[position] = bad
                    spoiled[i] = flat.reshape(a.shape)
                    assert not run(spoiled, dtype), (
                        f"{dtype}: {bad} at {position} of a {a.shape} gradient was missed")


def check_jax_stateless_apply_under_jit_follows_spec_and_skips():
    import jax
    import keras

    pattern = "FFFIIFFIF"
    scaler = _scaler(**CUSTOM)
    model = _model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    opt.build(model.trainable_variables)
    own = len(opt.variables) - len(opt.inner_optimizer.variables)

    @jax.jit
    def train_step(trainable, opt_vars, x, y):
        def scaled_loss(trainable):
            y_pred, _ = model.stateless_call(trainable, [], x, training=True)
            # As Keras's JAX trainer: the scale is read from opt_vars, not the variable.
            with keras.StatelessScope(state_mapping=list(zip(opt.variables, opt_vars,
                                                             strict=True))):
                return opt.scale_loss(_loss(y_pred, y))

        grads = jax.grad(scaled_loss)(trainable)
        return opt.stateless_apply(opt_vars, grads, trainable)

    trainable = [v.value for v in model.trainable_variables]
    opt_vars = [v.value for v in opt.variables]
    x, y = _data(8)
    seen = []
    for kind in pattern:
        new_trainable, new_opt_vars = train_step(trainable, opt_vars,
                                                 _with_inf(x) if kind == "I" else x, y)
        if kind == "I":
            _assert_same_arrays(_numpy(new_trainable), _numpy(trainable), "weights")
            _assert_same_arrays(_numpy(new_opt_vars[own:]), _numpy(opt_vars[own:]), "inner")
        else:
            assert not np.array_equal(_numpy(new_trainable)[0], _numpy(trainable)[0])
        trainable, opt_vars = new_trainable, new_opt_vars
        for var, value in zip(opt.variables, opt_vars, strict=True):
            var.assign(value)
        seen.append(_as_tuple(scaler.state))
    _assert_states(seen, _reference(scaler.config, [k == "F" for k in pattern]))
    assert int(opt.iterations) == pattern.count("F")


def check_jax_stateful_apply_works_where_keras_own_fails():
    import jax
    import keras

    x, y = _data(8)
    other = _model(1)  # Keras's failed apply leaves tracers in the variables it touched
    native = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    native.build(other.trainable_variables)
    # Keras 3.15: its stateful cond leaks tracers (what SpecLossScaleOptimizer works around;
    # if this starts passing, the JAX branch of _common_apply may be simplified).
    with pytest.raises(jax.errors.UnexpectedTracerError):
        native.apply(_gradients(other, x, y, lambda loss: loss * 32768.0),
                     other.trainable_variables)
    model = _model()
    scaler = _scaler(8.0, growth_interval=2)
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    before = _numpy(model.trainable_variables)
    for _ in range(2):
        opt.apply(_gradients(model, x, y, opt.scale_loss), model.trainable_variables)
    assert not np.array_equal(_numpy(model.trainable_variables)[0], before[0])
    assert _as_tuple(scaler.state) == (np.float32(16.0), 0, 0)
    assert int(opt.iterations) == 2


def check_jax_stateful_apply_compiles_once():
    """A custom loop's ``opt.apply`` must not compile anything once warm: it runs at the
    speed of a jitted step, not ~0.5 s of XLA compilation per step (2 CPU cores)."""
    import jax
    import keras

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    # An executable found in the persistent compilation cache (the test session sets one up:
    # tests/conftest.py) was compiled for this step all the same.
    jax.monitoring.register_event_listener(
        lambda event, **kw: compiles.append(event)
        if event == "/jax/compilation_cache/cache_hits" else None)
    model = _model()
    scaler = _scaler(8.0, growth_interval=2)
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    x, y = _data(8)
    counts = []
    for step in range(6):
        xb = _with_inf(x) if step == 3 else x
        grads = _gradients(model, xb, y, opt.scale_loss)
        before = len(compiles)
        opt.apply(grads, model.trainable_variables)
        counts.append(len(compiles) - before)
    expected = _reference(scaler.config, [True, True, True, False, True, True])
    assert _as_tuple(scaler.state) == expected[-1]
    assert counts[2:] == [0, 0, 0, 0], f"XLA compilations per apply(): {counts}"


CHILD_CHECKS = {
    "jax": ["check_fit_with_mixed_float16_follows_spec_over_epochs",
            "check_counters_follow_fit_and_a_compiled_apply",
            "check_protocol_custom_loop_follows_spec_without_wrap",
            "check_where_finite_compiles_and_selects_leaf_by_leaf",
            "check_fit_and_compiled_apply_follow_a_rule_changed_after_compiling",
            "check_custom_loop_follows_spec_step_by_step",
            "check_unscaled_gradients_are_the_gradients_of_the_unscaled_loss",
            "check_skipped_step_leaves_weights_moments_and_iterations_untouched",
            "check_jax_stateless_apply_under_jit_follows_spec_and_skips",
            "check_jax_stateful_apply_works_where_keras_own_fails",
            "check_jax_stateful_apply_compiles_once",
            "check_huge_finite_gradients_are_applied_and_one_inf_among_them_skipped",
            "check_finiteness_test_is_exact_for_every_shape_and_dtype"],
    "torch": ["check_fit_with_mixed_float16_follows_spec_over_epochs",
              "check_counters_follow_fit_and_a_compiled_apply",
              "check_protocol_custom_loop_follows_spec_without_wrap",
              "check_where_finite_compiles_and_selects_leaf_by_leaf",
              "check_fit_and_compiled_apply_follow_a_rule_changed_after_compiling",
              "check_custom_loop_follows_spec_step_by_step",
              "check_unscaled_gradients_are_the_gradients_of_the_unscaled_loss",
              "check_skipped_step_leaves_weights_moments_and_iterations_untouched",
              "check_huge_finite_gradients_are_applied_and_one_inf_among_them_skipped",
              "check_finiteness_test_is_exact_for_every_shape_and_dtype"],
}


# ------------------------------------------------------------ one child pytest per Keras backend

_CHILD_MODULE = """\
import sys

sys.path.insert(0, {tests!r})
import test_keras_backend as kb

for _name in kb.CHILD_CHECKS[{backend!r}]:
    globals()["test_" + _name.removeprefix("check_")] = getattr(kb, _name)
"""

#: The packaged suite, run the way a third party runs it.
CONFORMANCE_ARGS = ["--pyargs", "unifiedamp.conformance", "--unifiedamp-backend", "keras",
                    "--unifiedamp-max-examples", "10"]


class _Child:
    """``KERAS_BACKEND=<backend> python -m pytest <checks> --pyargs unifiedamp.conformance``,
    started at once (by the first xdist worker to get here; the others share it) in a fork
    of the session's fork server for ``import keras`` with that backend, read when a test
    asks for it."""

    def __init__(self, backend: str, tmp_path_factory: pytest.TempPathFactory):
        self.backend = backend
        self.shared = SharedChild(tmp_path_factory, f"keras_{backend}")
        where = self.shared.where
        self.report = where / "report.xml"
        if self.shared.owner:
            helper = where / "keras_child_checks.py"
            helper.write_text(_CHILD_MODULE.format(
                tests=str(pathlib.Path(__file__).parent), backend=backend))
            (where / "pytest.ini").write_text("[pytest]\n")  # not the repository's addopts
            args = ["-q", "-p", "no:cacheprovider", "--tb=short",
                    "-c", str(where / "pytest.ini"), "--rootdir", str(where),
                    f"--junitxml={self.report}", str(helper), *CONFORMANCE_ARGS]
            self.shared.start_script(f"import keras\nimport pytest, sys\n"
                                     f"sys.exit(pytest.main({args!r}))",
                                     {"KERAS_BACKEND": self.backend})
        self.returncode: int | None = None
        self._results: dict[str, tuple[str, str]] | None = None

    def results(self) -> dict[str, tuple[str, str]]:
        """``classname::name`` -> (outcome, message) of every test the child ran."""
        if self._results is None:
            self.returncode = self.shared.wait()
            self._results = {}
            if self.report.exists():
                for case in ET.parse(self.report).getroot().iter("testcase"):
                    outcome, message = "passed", ""
                    for child in case:
                        if child.tag in ("failure", "error", "skipped"):
                            outcome = "skipped" if child.tag == "skipped" else "failed"
                            message = f"{child.get('message', '')}\n{child.text or ''}"[-4000:]
                    key = f"{case.get('classname')}::{case.get('name')}"
                    self._results[key] = (outcome, message)
        return self._results

    def tail(self) -> str:
        return self.shared.tail()

    def outcome(self, check: str) -> tuple[str, str]:
        name = "::test_" + check.removeprefix("check_")
        found = [v for k, v in self.results().items() if k.endswith(name)]
        if not found:
            pytest.fail(f"KERAS_BACKEND={self.backend}: the child ran no {name[2:]} "
                        f"(exit code {self.returncode}):\n{self.tail()}")
        return found[0]


@pytest.fixture(scope="module", autouse=True)
def keras_children(request, tmp_path_factory):
    """Starts the child of each Keras backend that a selected test needs, when the module's
    first test runs, so that the children work while the TensorFlow tests run here."""
    wanted = set()
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        # getattr: a doctest item of the same session has no module.
        if getattr(item, "module", None) is request.module and \
                params.get("backend") in CHILD_BACKENDS:
            wanted.add(params["backend"])
    return {b: _Child(b, tmp_path_factory) for b in sorted(wanted)}


def _in_process_keras():
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip(f"this process runs Keras on {keras.backend.backend()}, not tensorflow")
    return keras


# ------------------------------------------------------------ 1. the wrapper (TensorFlow here)


@pytest.fixture
def keras():
    keras = _in_process_keras()
    yield keras
    keras.mixed_precision.set_dtype_policy("float32")


def test_wrap_returns_a_loss_scale_optimizer_that_compile_keeps(keras):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    scaler = _scaler(**CUSTOM)
    sgd = keras.optimizers.SGD(0.1)
    opt = scaler.wrap(sgd)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert isinstance(opt, SpecLossScaleOptimizer)
    assert opt.inner_optimizer is sgd and scaler.optimizer is opt
    with _policy("mixed_float16"):
        model = _model()
        model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt  # not wrapped a second time by the mixed_float16 policy
    assert opt.scaler_config == scaler.config == ScalerConfig(**CUSTOM)


def test_wrap_refuses_loss_scale_optimizers_non_optimizers_and_a_second_optimizer(keras):
    scaler = _scaler()
    native = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(TypeError, match="LossScaleOptimizer already: wrap its inner_optimizer"):
        scaler.wrap(native)
    with pytest.raises(TypeError, match=r"takes a keras.optimizers.Optimizer, got Sequential"):
        scaler.wrap(_model())
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
    first, second = _scaler(8.0), _scaler(16.0)
    opt = first.wrap(sgd)
    with pytest.raises(RuntimeError, match=r"SGD optimizer 'sgd' is wrapped already, by another "
                                           r"scaler: .*\(KerasGradScaler.of\(it\)"):
        second.wrap(sgd)
    with pytest.raises(RuntimeError, match=r"wraps this optimizer already: .*scaler.optimizer"):
        first.wrap(sgd)
    assert second.optimizer is None and first.optimizer is opt and opt.inner_optimizer is sgd
    assert second.wrap(keras.optimizers.SGD()).scaler_config.init_scale == 16.0
    model = _model()
    model.compile(optimizer=opt, loss="mse")  # a model lives in reference cycles
    del first, opt, model  # a wrapper no one holds wraps nothing
    assert _scaler(4.0).wrap(sgd).inner_optimizer is sgd


def _eager_steps(model, opt, kinds: str) -> None:
    """Custom-loop steps (eager: no train function to trace), ``F`` finite, ``I`` inf."""
    x, y = _data(8)
    for kind in kinds:
        grads = _gradients(model, _with_inf(x) if kind == "I" else x, y, opt.scale_loss)
        opt.apply(grads, model.trainable_variables)


def test_disabled_scaler_returns_the_inner_optimizer(keras):
    scaler = _scaler(1024.0, enabled=False)
    sgd = keras.optimizers.SGD(0.1)
    assert scaler.wrap(sgd) is sgd and scaler.optimizer is None
    assert scaler.get_scale() == 1.0 and not scaler.is_enabled()
    assert scaler.state_dict()["config"]["enabled"] is False


def test_of_gives_the_scaler_of_a_wrapped_optimizer(keras):
    from unifiedamp.backends.keras import KerasGradScaler

    opt = _scaler(**CUSTOM).wrap(keras.optimizers.SGD())
    _eager_steps(_model(), opt, "FFFFI")
    again = KerasGradScaler.of(opt)
    assert again.optimizer is opt and again.config == ScalerConfig(**CUSTOM)
    assert _as_tuple(again.state) == _reference(again.config, [True] * 4 + [False])[-1]
    assert again.state_dict() == KerasGradScaler.of(opt).state_dict()
    with pytest.raises(TypeError, match="made by KerasGradScaler.wrap, got LossScaleOptimizer"):
        KerasGradScaler.of(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))


def test_scaler_reads_the_optimizer_variables_after_fit(keras):
    scaler = _scaler(**CUSTOM)
    model = _model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=opt, loss="mse")
    x, y = _data(20)
    model.fit(_with_inf(x, row=12), y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    expected = _reference(scaler.config, [True, True, True, False, True] * 2)[-1]
    assert expected != (np.float32(1024.0), 0, 0)
    assert _variable_state(opt) == expected
    assert _as_tuple(scaler.state) == expected and scaler.get_scale() == expected[0]
    assert scaler.state_dict() == spec.to_state_dict(
        scaler.config, ScalerState(float(expected[0]), *expected[1:]), "keras")


def test_load_state_dict_before_build_is_written_when_the_optimizer_builds(keras):
    scaler = _scaler(**CUSTOM)
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    config = ScalerConfig(**{**CUSTOM, "growth_interval": 4})
    loaded = ScalerState(1536.0, 3, 0)
    scaler.load_state_dict(spec.to_state_dict(config, loaded, "torch"))
    assert not opt.built and opt.scaler_config == config
    model = _model()
    opt.build(model.trainable_variables)
    assert _variable_state(opt) == _as_tuple(loaded)
    _eager_steps(model, opt, "FF")  # the first step grows
    assert _as_tuple(scaler.state) == _reference(config, [True, True], start=loaded)[-1]
    assert scaler.get_scale() == np.float32(2304.0)


def test_load_state_dict_after_build_writes_the_variables(keras):
    scaler = _scaler(**CUSTOM)
    model = _model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    _eager_steps(model, opt, "FF")
    assert opt.built
    config = ScalerConfig(**{**CUSTOM, "backoff_factor": 0.875})
    loaded = ScalerState(1000.0, 0, 1)
    scaler.load_state_dict(spec.to_state_dict(config, loaded, "jax"))
    assert opt.scaler_config == config
    assert _variable_state(opt) == _as_tuple(loaded)
    _eager_steps(model, opt, "I")  # the second inf backs off, with the loaded factor
    assert _variable_state(opt) == _reference(config, [False], start=loaded)[-1]
    assert _variable_state(opt) == (np.float32(875.0), 0, 0)


@pytest.mark.parametrize("built", [False, True], ids=["before_build", "after_build"])
def test_a_bad_state_dict_changes_nothing(keras, built):
    scaler = _scaler(**CUSTOM)
    model = _model()
    opt = scaler.wrap(keras.optimizers.SGD())
    if built:
        _eager_steps(model, opt, "FI")
    before = (_as_tuple(scaler.state), scaler.config, scaler.state_dict())
    good = spec.to_state_dict(ScalerConfig(4.0, growth_interval=5), ScalerState(4.0, 1), "keras")
    for bad in [{**good, "scale": -1.0}, {**good, "growth_tracker": -2},
                {**good, "config": {**good["config"], "growth_interval": 0}},
                {k: v for k, v in good.items() if k != "hysteresis_tracker"}, [good]]:
        with pytest.raises((ValueError, TypeError)):
            scaler.load_state_dict(bad)
        assert (_as_tuple(scaler.state), scaler.config, scaler.state_dict()) == before
        assert opt.scaler_config == before[1]
        if built:
            assert _variable_state(opt) == before[0]
    if not built:
        opt.build(model.trainable_variables)
        assert _variable_state(opt) == before[0]


def test_counters_are_read_only_and_capabilities_list_the_optional_members(keras):
    from unifiedamp.backends.keras import KerasGradScaler

    scaler = _scaler(8.0)
    for name in ("num_steps", "num_skipped_steps", "last_step_skipped"):
        with pytest.raises(AttributeError):
            setattr(scaler, name, 3)
    assert KerasGradScaler.capabilities == {"wrap", "watch", "overflow_report", "history"}
    assert scaler.supports("wrap") and not scaler.supports("step")
    assert not scaler.functional
    with pytest.raises(NotImplementedError, match=r"no step\(\).*'wrap'.*scaler.update"):
        scaler.step(keras.optimizers.SGD())


def test_setters_return_the_scaler_and_reach_the_wrapped_optimizer(keras):
    scaler = _scaler(**CUSTOM)
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
    assert scaler.restore(_scaler(2.0).state_dict()) is scaler and scaler.get_scale() == 2.0
    assert scaler.restore(state).get_scale() == CUSTOM["init_scale"]


def test_update_is_the_custom_loop_protocol_and_refuses_a_wrapped_scaler(keras):
    import tensorflow as tf

    from unifiedamp.errors import NoInfChecksError

    scaler = _scaler(1024.0, growth_interval=2, history=3)
    with pytest.raises(NoInfChecksError, match=r"records none.*scaler.update\(finite\)"):
        scaler.update()
    flags = [tf.constant(True), np.bool_(True), True, tf.constant(False), np.array(True)]
    for flag in flags:
        assert scaler.update(flag) is scaler
    expected = _reference(scaler.config, [bool(f) for f in flags])
    assert _as_tuple(scaler.state) == expected[-1]
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
    with pytest.raises(TypeError, match="new_scale must be a float"):
        scaler.update("yes")  # not a flag: torch's positional new_scale

    @tf.function
    def compiled(finite):
        return scaler.update(finite)

    with pytest.raises(TypeError, match=r"symbolic flag .*tf.function.*scaler.wrap\(optimizer\)"):
        compiled(tf.constant(True))
    assert scaler.num_steps == 5
    disabled = _scaler(enabled=False)
    assert disabled.update(False) is disabled and disabled.num_steps == 0

    # The updates made before a wrap count on; the optimizer takes the state over.
    held = scaler.state
    model = _model()
    opt = scaler.wrap(keras.optimizers.SGD())
    _eager_steps(model, opt, "FI")
    assert _as_tuple(scaler.state) == _reference(scaler.config, [True, False], held)[-1]
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
    assert type(ua.GradScaler(backend=_model())) is KerasGradScaler
    assert by_name.state_dict()["backend"] == "keras"


# ------------------------------------------------------------ 2 and 3. TensorFlow, in this process


def test_fit_with_mixed_float16_follows_spec_over_epochs(keras):
    check_fit_with_mixed_float16_follows_spec_over_epochs()


def test_fit_and_compiled_apply_follow_a_rule_changed_after_compiling(keras):
    check_fit_and_compiled_apply_follow_a_rule_changed_after_compiling()


def test_custom_loop_with_gradient_tape_follows_spec_step_by_step(keras):
    check_custom_loop_follows_spec_step_by_step()


def test_unscaled_gradients_are_the_gradients_of_the_unscaled_loss(keras):
    check_unscaled_gradients_are_the_gradients_of_the_unscaled_loss()


def test_skipped_step_leaves_weights_moments_and_iterations_untouched(keras):
    check_skipped_step_leaves_weights_moments_and_iterations_untouched()


def test_huge_finite_gradients_are_applied_and_one_inf_among_them_skipped(keras):
    check_huge_finite_gradients_are_applied_and_one_inf_among_them_skipped()


def test_finiteness_test_is_exact_for_every_shape_and_dtype(keras):
    check_finiteness_test_is_exact_for_every_shape_and_dtype()


def test_counters_follow_fit_and_a_compiled_apply(keras):
    check_counters_follow_fit_and_a_compiled_apply()


def test_protocol_custom_loop_follows_spec_without_wrap(keras):
    check_protocol_custom_loop_follows_spec_without_wrap()


def test_where_finite_compiles_and_selects_leaf_by_leaf(keras):
    check_where_finite_compiles_and_selects_leaf_by_leaf()


def test_reciprocal_is_exact_inside_a_tf_graph(keras):
    """Grappler turns 1 / x into an approximate reciprocal inside tf.function (up to 3 ulps
    off); the scale's reciprocal must still be f32(1 / scale), over the whole float32
    range (200k random bit patterns, subnormal results included)."""
    import tensorflow as tf

    from unifiedamp.backends.keras._paths import F32

    bits = np.random.default_rng(0).integers(1, 0x7F7FFFFF, 200_000).astype(np.int32)
    got = tf.function(F32.reciprocal_bits)(tf.constant(bits)).numpy()
    with np.errstate(over="ignore"):
        want = (np.float32(1) / bits.view(np.float32)).view(np.int32)
    wrong = np.nonzero(got != want)[0]
    assert not len(wrong), (f"{len(wrong)} wrong, e.g. 1 / {bits[wrong[0]].view(np.float32)!r}: "
                            f"{got[wrong[0]]:#x} != {want[wrong[0]]:#x}")


# ------------------------------------------------------------ 4. XLA


def test_xla_train_loop_follows_spec_with_no_host_reads(keras):
    import tensorflow as tf
    from keras import ops

    flags = [True, True, True, True, False, False, True, False, True, True, True, False, False]
    with _policy("mixed_float16"):
        scaler = _scaler(**CUSTOM)
        model = _model()
        opt = scaler.wrap(keras.optimizers.Adam(1e-3))
        opt.build(model.trainable_variables)
        x, y = _data(4)
        xs = np.stack([x if finite else _with_inf(x) for finite in flags])

        @tf.function(jit_compile=True)
        def train(xs, y):
            # Every step in one XLA computation: nothing is read back until it returns.
            out = [tf.TensorArray(tf.float32, size=len(flags)),
                   tf.TensorArray(tf.int64, size=len(flags)),
                   tf.TensorArray(tf.int64, size=len(flags))]
            for i in tf.range(len(flags)):
                with tf.GradientTape() as tape:
                    scaled = opt.scale_loss(_loss(model(xs[i], training=True), y))
                grads = tape.gradient(scaled, model.trainable_variables)
                opt.apply(grads, model.trainable_variables)
                out = [out[0].write(i, ops.convert_to_tensor(opt.dynamic_scale)),
                       out[1].write(i, tf.cast(opt.step_counter, tf.int64)),
                       out[2].write(i, tf.cast(opt.hysteresis_counter, tf.int64))]
            return [o.stack() for o in out]

        scales, growth, hysteresis = (t.numpy() for t in train(tf.constant(xs), tf.constant(y)))
    seen = [(np.float32(s), int(g), int(h)) for s, g, h in zip(scales, growth, hysteresis,
                                                                strict=True)]
    expected = _reference(scaler.config, flags)
    assert len({s[0] for s in expected}) >= 3  # it grows and backs off
    _assert_states(seen, expected)
    assert _as_tuple(scaler.state) == expected[-1]
    assert int(opt.iterations) == sum(flags)
    assert all(np.isfinite(w).all() for w in _numpy(model.trainable_variables))


# ------------------------------------------------------------ 5. serialisation


def test_get_config_and_from_config_keep_the_unifiedamp_config(keras):
    from unifiedamp.backends.keras import SpecLossScaleOptimizer

    opt = _scaler(**CUSTOM).wrap(keras.optimizers.Adam(1e-3))
    config = opt.get_config()
    assert config["scaler_config"] == ScalerConfig(**CUSTOM).to_dict()
    for again in (SpecLossScaleOptimizer.from_config(config),
                  keras.optimizers.deserialize(keras.optimizers.serialize(opt))):
        assert type(again) is SpecLossScaleOptimizer
        assert again.scaler_config == ScalerConfig(**CUSTOM)
        assert type(again.inner_optimizer) is keras.optimizers.Adam
        again.build(_model().trainable_variables)
        assert _variable_state(again) == (np.float32(1024.0), 0, 0)


@pytest.mark.parametrize(("before", "after"), [
    ("FFFFIIFF", "FFIIFFF"),  # saved mid growth interval: the next finite step grows
    ("FFFFIIFFI", "IFFFIF"),  # saved mid hysteresis: the next inf backs off
], ids=["mid_growth_interval", "mid_hysteresis"])
def test_saved_model_resumes_exactly_like_an_uninterrupted_run(keras, tmp_path, before, after):
    from unifiedamp.backends.keras import KerasGradScaler

    with _policy("mixed_float16"):
        scaler = _scaler(**CUSTOM)
        model = _model()
        model.compile(optimizer=scaler.wrap(keras.optimizers.Adam(1e-2)), loss="mse")
        x, y = _data(8)
        batches = {"F": x, "I": _with_inf(x)}
        for kind in before:
            model.train_on_batch(batches[kind], y)
        saved = scaler.state
        expected = _reference(scaler.config, [k == "F" for k in before])[-1]
        assert _as_tuple(saved) == expected and saved.growth_tracker + saved.hysteresis_tracker
        model.save(tmp_path / "m.keras")
        loaded = keras.models.load_model(tmp_path / "m.keras")
        again = KerasGradScaler.of(loaded.optimizer)
        assert again.config == ScalerConfig(**CUSTOM)
        assert _as_tuple(again.state) == expected and _variable_state(loaded.optimizer) == expected
        seen, uninterrupted = [], []
        for kind in after:
            model.train_on_batch(batches[kind], y)
            loaded.train_on_batch(batches[kind], y)
            uninterrupted.append(_as_tuple(scaler.state))
            seen.append(_as_tuple(again.state))
    _assert_states(uninterrupted, _reference(scaler.config, [k == "F" for k in after], saved))
    _assert_states(seen, uninterrupted)
    _assert_same_arrays(_snapshot(loaded, loaded.optimizer), _snapshot(model, model.optimizer),
                        "loaded vs uninterrupted")


_FRESH_LOAD = """
import sys
import unifiedamp
import keras
assert "unifiedamp.backends.keras" not in sys.modules
try:
    keras.saving.load_model({path!r})
except TypeError as error:
    print("WITHOUT", str(error).replace("\\n", " "))
import unifiedamp.backends.keras  # the documented line
model = keras.saving.load_model({path!r})
scaler = unifiedamp.backends.keras.KerasGradScaler.of(model.optimizer)
print("STATE", scaler.state_dict()["scale"], scaler.state.growth_tracker, scaler.num_steps)
"""


def test_a_saved_model_loads_in_a_fresh_process_after_the_documented_import(keras, tmp_path,
                                                                              run_python):
    """Keras resolves a class that is not its own from its registration alone (it imports
    only the modules of keras, keras_hub, keras_cv, keras_nlp): after ``import unifiedamp``
    alone, which imports no framework, the wrapper is unknown, and the error names its
    module; ``import unifiedamp.backends.keras`` registers it."""
    scaler = _scaler(**CUSTOM)
    model = _model()
    model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
    _eager_steps(model, model.optimizer, "FFI")
    path = str(tmp_path / "m.keras")
    model.save(path)
    proc = run_python(_FRESH_LOAD.format(path=path), env={"KERAS_BACKEND": "tensorflow"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.startswith(("WITHOUT", "STATE")))
    assert "'SpecLossScaleOptimizer'" in lines["WITHOUT"]
    assert "'module': 'unifiedamp.backends.keras'" in lines["WITHOUT"]
    state = scaler.state
    assert lines["STATE"] == f"{state.scale} {state.growth_tracker} 0"


def test_the_file_leaves_the_rule_and_the_counters_out(keras, tmp_path):
    """``model.save`` writes the variables the optimizer had before the rule and the
    counters existed (the scale, the trackers, the inner optimizer's), so files saved
    before load, and files saved now load into that layout."""
    import zipfile

    import h5py

    scaler = _scaler(**CUSTOM)
    model = _model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=opt, loss="mse")
    _eager_steps(model, opt, "FI")
    path = tmp_path / "m.keras"
    model.save(path)
    unsaved = {"scaler_rule", "update_count", "skipped_count", "last_skipped",
               "unscale_factors"}
    assert unsaved <= {v.name for v in opt.variables}
    kept = [v for v in opt.variables if v.name not in unsaved]
    with zipfile.ZipFile(path) as z, h5py.File(z.open("model.weights.h5")) as f:
        stored = f["optimizer/vars"]
        assert len(stored) == len(kept)
        for i, v in enumerate(kept):
            np.testing.assert_array_equal(stored[str(i)][()], _numpy([v])[0], err_msg=v.name)
    loaded = keras.models.load_model(path)
    again = _scaler_of(loaded.optimizer)
    assert _as_tuple(again.state) == _as_tuple(scaler.state)
    assert (again.num_steps, again.num_skipped_steps) == (0, 0)  # counted afresh


def _docs_protocol_example() -> str:
    page = (pathlib.Path(__file__).parents[1] / "docs" / "backends" / "keras.md").read_text()
    found = [b for b in re.findall(r"```python\n(.*?)```", page, re.S)
             if "scaler.update(finite)" in b]
    assert len(found) == 1, "docs/backends/keras.md shows the protocol's loop once"
    return found[0]


@pytest.mark.parametrize("backend", ["tensorflow", *CHILD_BACKENDS])
def test_docs_protocol_loop_runs_under_each_keras_backend(backend, run_python, tmp_path):
    """The custom loop of docs/backends/keras.md (tests/test_docs.py runs it on TensorFlow
    alone): its gradient call for each backend, and the scale it prints per step."""
    proc = run_python(_docs_protocol_example(), env={"KERAS_BACKEND": backend}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    finite = [True, True, False, True]  # the example's inf is in step 2
    expected = _reference(ScalerConfig(1024.0, growth_interval=2), finite)
    assert proc.stdout.splitlines()[-4:] == [
        f"{step} {float(state[0])} {not ok}"
        for step, (state, ok) in enumerate(zip(expected, finite, strict=True))]


def _scaler_of(opt):
    from unifiedamp.backends.keras import KerasGradScaler

    return KerasGradScaler.of(opt)


# ------------------------------------------------------------ Keras's private surface


def keras_private_changes(lso_cls) -> list[str]:
    """How ``lso_cls`` (keras.optimizers.LossScaleOptimizer or a stand-in) differs from the
    private API unifiedamp/backends/keras/_compat.py lists."""
    import inspect

    import keras

    from unifiedamp.backends.keras import _compat

    changes = []
    for table in (_compat.OVERRIDDEN, _compat.CALLED):
        for name, params in table.items():
            method = getattr(lso_cls, name, None)
            if not callable(method):
                changes.append(f"no method {name}")
                continue
            got = list(inspect.signature(method).parameters)
            if got != params:
                changes.append(f"{name}{tuple(got)}, expected {tuple(params)}")
    apply = inspect.getsource(lso_cls.apply)
    changes += [f"apply() no longer calls {hook}" for hook in ("_tf_apply", "_common_apply")
                if hook not in apply]
    opt = lso_cls(keras.optimizers.SGD())
    opt.build([keras.Variable(1.0)])
    changes += [f"no attribute {a}" for a in _compat.ATTRIBUTES if not hasattr(opt, a)]
    return changes


def test_keras_private_surface_is_what_the_backend_was_written_for(keras):
    import importlib.metadata

    changes = keras_private_changes(keras.optimizers.LossScaleOptimizer)
    extra = {r.split(";")[0] for r in importlib.metadata.requires("unifiedamp")
             if 'extra == "keras"' in r}
    assert not changes, (
        f"keras {keras.__version__} changed the private LossScaleOptimizer API that "
        f"unifiedamp's Keras backend overrides or calls: {'; '.join(changes)}. The keras "
        f"extra ({sorted(extra)}, tested with 3.15) is what the backend supports: adapt "
        "unifiedamp/backends/keras/_compat.py, or install a Keras in that range")
    from unifiedamp.backends.keras import _compat

    assert callable(_compat.no_automatic_dependency_tracking)
    assert isinstance(_compat.replicas_update_themselves(), bool)


def test_the_private_surface_check_sees_a_changed_hook(keras):
    class NewerLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
        def _stateful_handle_non_finite_grads(self, grads):
            super()._stateful_handle_non_finite_grads()

    assert keras_private_changes(NewerLossScaleOptimizer) == [
        "_stateful_handle_non_finite_grads('self', 'grads'), expected ('self',)"]


def test_the_overrides_take_every_call_shaped_like_keras(keras):
    """Each override takes Keras's parameters first, and any more are optional: two take
    more (the gradients, for diagnose's counts in the skipped branch)."""
    import inspect

    from unifiedamp.backends.keras._compat import OVERRIDDEN, LossScaleOptimizerHooks

    lso = keras.optimizers.LossScaleOptimizer
    overridden = {n for n in vars(LossScaleOptimizerHooks)
                  if n.startswith("_") and not n.startswith("__") and hasattr(lso, n)}
    assert overridden == set(OVERRIDDEN)
    widened = []
    for name, params in OVERRIDDEN.items():
        ours = list(inspect.signature(getattr(LossScaleOptimizerHooks, name)).parameters.values())
        assert [p.name for p in ours[:len(params)]] == params, name
        assert all(p.default is not p.empty for p in ours[len(params):]), name
        if len(ours) > len(params):
            widened.append(name)
    assert widened == ["_stateful_handle_non_finite_grads", "_stateless_handle_non_finite_grads"]


def keras_private_names() -> set[str]:
    """The private names of Keras's optimizers, on every Keras backend: the methods their
    sources define and the attributes they set or read on ``self``, and what a built
    ``LossScaleOptimizer`` holds on this process's backend."""
    import ast

    import keras

    root = pathlib.Path(keras.__file__).parent / "src"
    sources = [*(root / "optimizers").glob("*.py"), *root.glob("backend/*/optimizer.py"),
               *(root / "backend" / "torch" / "optimizers").glob("*.py")]
    names = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                names.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "self"):
                names.add(node.attr)
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    opt.build([keras.Variable(1.0)])
    names |= set(dir(opt)) | set(vars(opt))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_keras_uses(source: str, names: set[str]) -> list[str]:
    """Where ``source`` touches Keras's private API: an import from ``keras.src``, a name of
    ``names`` as an attribute, a method defined (an override) or a getattr string, and
    TensorFlow's ``__internal__``; as ``"line: what"``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Import):
            private = [a.name for a in node.names if a.name.startswith("keras.src")]
            what = f"import {private[0]}" if private else None
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras.src"):
            what = f"from {node.module} import"
        elif isinstance(node, ast.Attribute) and (node.attr in names
                                                  or node.attr == "__internal__"):
            what = f".{node.attr}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            what = f"def {node.name}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            what = f"{node.func.id}(..., {node.args[1].value!r})"
        if what:
            found.append(f"{node.lineno}: {what}")
    return found


def test_only_compat_touches_keras_private_api(keras):
    import unifiedamp.backends.keras as package

    names = keras_private_names()
    assert {"_trainable_variables", "_tf_apply", "_get_variable_index"} <= names
    folder = pathlib.Path(package.__file__).parent
    uses = {path.name: private_keras_uses(path.read_text(), names)
            for path in sorted(folder.glob("*.py")) if path.name != "_compat.py"}
    assert len(uses) >= 8, sorted(uses)
    wrong = {name: found for name, found in uses.items() if found}
    assert not wrong, ("only _compat.py may use Keras's private API (add what is needed "
                       f"there, under a name of ours): {wrong}")


def test_the_private_api_check_sees_each_kind_of_use(keras):
    names = keras_private_names()
    source = ("from keras.src.utils import tracking\n"
              "import keras.src.ops\n"
              "class W:\n"
              "    def _tf_apply(self):\n"
              "        return self._trainable_variables, getattr(self, '_variables')\n"
              "tf.__internal__.distribute\n")
    assert private_keras_uses(source, names) == [
        "1: from keras.src.utils import", "2: import keras.src.ops", "4: def _tf_apply",
        "6: .__internal__", "5: ._trainable_variables", "5: getattr(..., '_variables')"]


def test_only_the_torch_paths_import_the_torch_backend_and_only_its_two_shared_modules():
    """Keras-on-torch reuses the torch backend's kernel call and overflow counts; nothing
    else of the Keras package reaches into another backend (the shared modules of the
    backends layer, ``unifiedamp.backends._*``, are for every backend)."""
    import ast

    folder = pathlib.Path(__file__).parents[1] / "src" / "unifiedamp" / "backends" / "keras"
    allowed = {"_torch.py": {"unifiedamp.backends.torch._compat",
                             "unifiedamp.backends.torch._diagnostics"}}
    wrong, used = [], set()
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[:2] != ["unifiedamp", "backends"] or len(parts) < 3 \
                        or parts[2] == "keras" or parts[2].startswith("_"):
                    continue
                if module in allowed.get(path.name, set()):
                    used.add(module)
                else:
                    wrong.append(f"{path.name}:{node.lineno} imports {module}")
    assert not wrong, wrong
    assert used == allowed["_torch.py"]


# ------------------------------------------------------------ 2, 3 and 6. JAX and torch (children)
# Last in the file: the children run while the TensorFlow tests above run here.

CHILD_CASES = [(backend, check) for backend in CHILD_BACKENDS for check in CHILD_CHECKS[backend]]


@pytest.mark.parametrize(("backend", "check"), CHILD_CASES,
                         ids=[f"{b}-{c.removeprefix('check_')}" for b, c in CHILD_CASES])
def test_under_keras_backend(backend, check, keras_children):
    outcome, message = keras_children[backend].outcome(check)
    if outcome == "skipped":
        pytest.skip(f"KERAS_BACKEND={backend}: {message}")
    assert outcome == "passed", f"KERAS_BACKEND={backend}:\n{message}"


@pytest.mark.parametrize("backend", CHILD_BACKENDS)
def test_packaged_conformance_suite_passes(backend, keras_children):
    child = keras_children[backend]
    results = {k: v for k, v in child.results().items() if "TestConformance" in k}
    failed = {k: v[1] for k, v in results.items() if v[0] == "failed"}
    assert len(results) >= 30, f"KERAS_BACKEND={backend}: no suite ran:\n{child.tail()}"
    assert not failed, f"KERAS_BACKEND={backend}: " + "\n\n".join(
        f"{k}\n{v[-3000:]}" for k, v in failed.items())
    assert sum(outcome == "passed" for outcome, _ in results.values()) >= 30
    # Exit code 0 unless one of the checks (reported by test_under_keras_backend) failed.
    own_failures = any(v[0] == "failed" for k, v in child.results().items()
                       if "TestConformance" not in k)
    assert child.returncode == (1 if own_failures else 0), child.tail()


def test_from_config_without_the_inner_optimizer_names_what_to_pass(keras):
    opt = _scaler(1024.0, growth_interval=7).wrap(keras.optimizers.SGD(0.1))
    config = opt.get_config()
    assert type(opt).from_config(config).scaler_config.growth_interval == 7
    for bad in ({k: v for k, v in config.items() if k != "inner_optimizer"}, None):
        with pytest.raises(ValueError, match=r"from_config: the config has no 'inner_optimizer'"
                                             r".*pass the dict get_config\(\) returns"):
            type(opt).from_config(bad)
