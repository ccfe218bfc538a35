"""The Keras wrapper in training, on the session's Keras backend (the keras session runs once
per ``KERAS_BACKEND``: tensorflow, jax, torch): ``model.fit`` and custom loops with the
backend's own autodiff (``tf.GradientTape``, ``jax.grad``, torch autograd), skipped steps,
``apply`` compiled by the user, a rule changed after compiling, the protocol without
``wrap``, the finiteness test; then what one backend alone has: JAX's functional step and
its compilations, TensorFlow's graph rewrites and XLA. Each step follows the spec's
reference rule bit for bit.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from keras_helpers import (
    CUSTOM,
    all_finite,
    as_tuple,
    assert_same_arrays,
    assert_states,
    compiled_apply,
    counters,
    dtype_policy,
    fit_states,
    gradients,
    make_data,
    make_model,
    make_scaler,
    mse,
    only_on,
    reference_states,
    snapshot,
    snapshot_plain,
    to_numpy,
    variable_state,
    with_inf,
)

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState

# ------------------------------------------------------------ on every Keras backend


def test_fit_with_mixed_float16_follows_spec_over_epochs(keras):
    with dtype_policy("mixed_float16"):
        scaler = make_scaler(1024.0, growth_factor=1.5, backoff_factor=0.25, growth_interval=2)
        opt = scaler.wrap(keras.optimizers.Adam(1e-3))
        model = make_model()
        model.compile(optimizer=opt, loss="mse")
        assert model.optimizer is opt
        assert model.layers[0].compute_dtype == "float16"
        seen = fit_states(model, scaler, "FFFFIF", epochs=3)
    expected = reference_states(scaler.config, [True, True, True, True, False, True] * 3)
    assert max(s[0] for s in expected) > 1024.0 and min(s[0] for s in expected) < 1024.0
    assert_states(seen, expected)
    assert as_tuple(scaler.state) == expected[-1] and scaler.get_scale() == expected[-1][0]
    assert int(opt.iterations) == 15  # the 3 skipped steps are not counted
    assert all(np.isfinite(w).all() for w in to_numpy(model.trainable_variables))


def test_custom_loop_follows_spec_step_by_step(keras):
    """The backend's own autodiff (GradientTape, torch autograd, jax.grad) and the stateful
    ``opt.apply`` (which Keras 3.15's own LossScaleOptimizer cannot do under JAX)."""

    pattern = "FFFIIFFFIFIIF"
    with dtype_policy("mixed_float16"):
        scaler = make_scaler(**CUSTOM)
        model = make_model()
        opt = scaler.wrap(keras.optimizers.Adam(1e-3))
        opt.build(model.trainable_variables)
        x, y = make_data(8)
        seen, flags = [], []
        for step, kind in enumerate(pattern):
            xb = with_inf(x) if kind == "I" else x
            scale_fn = opt.scale_loss if step % 2 else opt.get_scaled_loss
            grads = gradients(model, xb, y, scale_fn)
            flags.append(all_finite(grads))
            opt.apply(grads, model.trainable_variables)
            seen.append(as_tuple(scaler.state))
    assert flags == [kind == "F" for kind in pattern]
    assert_states(seen, reference_states(scaler.config, flags))
    assert int(opt.iterations) == pattern.count("F")


def test_unscaled_gradients_are_the_gradients_of_the_unscaled_loss(keras):
    scaler = make_scaler(512.0, growth_interval=1)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.SGD(1e-2))
    opt.build(model.trainable_variables)
    x, y = make_data(8)
    opt.apply(gradients(model, x, y, opt.scale_loss), model.trainable_variables)
    assert scaler.get_scale() == 1024.0  # unscaling must use the current scale, not init_scale
    reference = to_numpy(gradients(model, x, y, lambda loss: loss))
    scaled = gradients(model, x, y, opt.scale_loss)
    # A power of two: scaling and unscaling are exact.
    assert_same_arrays(to_numpy(opt.get_unscaled_gradients(scaled)), reference, "2**10")
    assert_same_arrays(to_numpy(opt.unscale_gradients(scaled)), reference, "2**10")
    scaler.load_state_dict(spec.to_state_dict(scaler.config, ScalerState(1000.0), "keras"))
    scaled = gradients(model, x, y, opt.scale_loss)
    assert not np.allclose(to_numpy(scaled)[0], reference[0], rtol=0.5)
    for got, want in zip(to_numpy(opt.get_unscaled_gradients(scaled)), reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)


def test_skipped_step_leaves_weights_moments_and_iterations_untouched(keras):
    scaler = make_scaler(256.0, growth_interval=1000)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=opt, loss="mse")
    x, y = make_data(8)
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    before = snapshot(model, opt)
    assert int(opt.iterations) == 2 and np.abs(before[-1]).max() > 0  # moments are non-zero
    model.train_on_batch(with_inf(x), y)  # the compiled fit step
    assert_same_arrays(snapshot(model, opt), before, "train_on_batch on an inf batch")
    assert as_tuple(scaler.state) == (np.float32(128.0), 0, 0)
    grads = gradients(model, with_inf(x), y, opt.scale_loss)  # a custom loop's apply
    opt.apply(grads, model.trainable_variables)
    assert_same_arrays(snapshot(model, opt), before, "apply() of inf gradients")
    assert as_tuple(scaler.state) == (np.float32(64.0), 0, 0)
    assert int(opt.iterations) == 2
    model.train_on_batch(x, y)
    assert int(opt.iterations) == 3
    assert not np.array_equal(to_numpy(model.trainable_variables)[0], before[0])
    assert as_tuple(scaler.state) == (np.float32(64.0), 1, 0)


def test_fit_and_compiled_apply_follow_a_rule_changed_after_compiling(keras):
    """``model.fit``'s train step and a loop's ``apply`` compiled by the user follow each
    change of the rule made after they were traced, also in the middle of ``fit``: the
    setters; ``load_state_dict`` of another config (before the optimizer is built; min_scale
    and max_scale; dynamic=False), its state included."""
    from keras import ops

    scaler = make_scaler(1024.0, growth_interval=3)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.SGD(1e-3))
    model.compile(optimizer=opt, loss="mse")
    apply = compiled_apply(opt, model.trainable_variables)
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
        expected = reference_states(config, flags, start)
        assert expected != reference_states(previous, flags, start), "the change changes nothing"
        assert_states(fit_states(model, scaler, kinds), expected)
        expected = reference_states(config, flags, scaler.state)
        seen = []
        for kind in kinds:
            apply([ops.convert_to_tensor(g) for g in grads[kind]])
            seen.append(as_tuple(scaler.state))
        assert_states(seen, expected)

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
    seen = fit_states(model, scaler, kinds, change=(1, lambda: scaler.set_growth_interval(2)))
    before = reference_states(previous, flags[:2], start)
    after = reference_states(scaler.config, flags[2:], ScalerState(float(before[-1][0]),
                                                             *before[-1][1:]))
    assert before + after != reference_states(previous, flags, start)
    assert_states(seen, before + after)
    follows(load(ScalerConfig(512.0, 4.0, 0.125, 2, min_scale=200.0, max_scale=1000.0),
                 ScalerState(300.0, 1, 0)))
    follows(load(ScalerConfig(512.0, dynamic=False), ScalerState(300.0, 1, 0)))



def test_counters_follow_fit_and_a_compiled_apply(keras):
    """``num_steps``, ``num_skipped_steps`` and ``last_step_skipped`` count the wrapped
    optimizer's updates, read from its device counters: in ``fit`` (compiled by the
    backend), in a custom loop's ``apply`` compiled by the user, across epochs."""
    from keras import ops

    scaler = make_scaler(1024.0, growth_interval=2)
    assert counters(scaler) == (0, 0, False)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=opt, loss="mse")
    assert counters(scaler) == (0, 0, False)  # not built yet
    kinds = "FFIFIIF"
    seen = []
    x, y = make_data(4 * len(kinds))
    for i, kind in enumerate(kinds):
        if kind == "I":
            x = with_inf(x, row=4 * i + 1)

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            assert self.model is model  # under JAX, reading .model syncs the variables
            seen.append(counters(scaler))

    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[Record()])
    flags = [kind == "I" for kind in kinds] * 2
    assert seen == [(k + 1, sum(flags[:k + 1]), flags[k]) for k in range(len(flags))]
    assert counters(scaler) == (14, 6, False)
    apply = compiled_apply(opt, model.trainable_variables)
    grads = [np.full(v.shape, 0.5, np.float32) for v in model.trainable_variables]
    bad = [g.copy() for g in grads]
    bad[0].flat[-1] = np.nan
    apply([ops.convert_to_tensor(g) for g in bad])
    assert counters(scaler) == (15, 7, True)
    apply([ops.convert_to_tensor(g) for g in grads])
    assert counters(scaler) == (16, 7, False)
    assert as_tuple(scaler.state) == reference_states(scaler.config, [not f for f in flags] +
                                                 [False, True])[-1]
    # A manual scale is no update.
    assert scaler.update(new_scale=64.0) is scaler and scaler.get_scale() == 64.0
    assert counters(scaler) == (16, 7, False) and variable_state(opt)[0] == 64.0


def test_protocol_custom_loop_follows_spec_without_wrap(keras):
    """The protocol every backend shares, in an eager Keras loop where only the gradient
    call is the backend's (GradientTape, jax.grad over stateless_call, torch backward):
    scale, unscale, a step where finite (``apply``, or ``where_finite`` over the
    variables' values), ``update(finite)``. The scale, the trackers and the skips follow
    the spec bit for bit, the unscaled gradients are ``g * f32(1 / scale)`` bit for bit,
    and a skipped step leaves the weights and the optimizer as they were."""
    from keras import ops

    pattern = "FFFIIFFFIFIIF"
    with dtype_policy("mixed_float16"):
        scaler = make_scaler(**CUSTOM, history=4)
        model = make_model()
        opt = keras.optimizers.Adam(1e-3)
        opt.build(model.trainable_variables)
        tvs = model.trainable_variables
        x, y = make_data(8)
        seen, skips = [], []
        for step, kind in enumerate(pattern):
            before = snapshot_plain(model, opt)
            scale = np.float32(scaler.get_scale())
            scaled = gradients(model, with_inf(x) if kind == "I" else x, y, scaler.scale)
            grads, finite = scaler.unscale(scaled)
            assert to_numpy([finite])[0].dtype == bool and to_numpy([finite])[0].shape == ()
            assert bool(finite) == (kind == "F")
            if kind == "F":
                with np.errstate(over="ignore"):
                    want = [g * np.float32(1.0 / float(scale)) for g in to_numpy(scaled)]
                assert_same_arrays(to_numpy(grads), want, f"step {step}: unscaled gradients")
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
                assert_same_arrays(snapshot_plain(model, opt), before, f"step {step}")
            else:
                assert not np.array_equal(to_numpy(tvs)[0], before[0]), f"step {step}"
            assert scaler.update(finite) is scaler
            seen.append(as_tuple(scaler.state))
            skips.append(scaler.last_step_skipped)
    flags = [kind == "F" for kind in pattern]
    expected = reference_states(scaler.config, flags)
    assert len({s[0] for s in expected}) >= 3  # grows and backs off
    assert_states(seen, expected)
    assert skips == [not f for f in flags]
    assert (scaler.num_steps, scaler.num_skipped_steps) == (len(pattern), pattern.count("I"))
    assert scaler.history().as_list()[-1] == (len(pattern), float(expected[-1][0]), False)
    assert [r[2] for r in scaler.history().as_list()] == skips[-4:]



def test_where_finite_compiles_and_selects_leaf_by_leaf(keras):
    """``where_finite`` under the backend's compiler (``tf.function``, ``jax.jit``; eager
    on torch): a dict of leaves, each kept in ``old``'s dtype, with no host read."""
    from keras import ops

    scaler = make_scaler()
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



def test_huge_finite_gradients_are_applied_and_one_inf_among_them_skipped(keras):
    """Finite gradients whose float32 sum would overflow are finite: a check that sums
    the gradients (or |g|) is wrong there; only an inf or NaN element may skip the step."""
    from keras import ops

    scaler = make_scaler(1.0, growth_interval=1)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.SGD(0.0))
    tvs = model.trainable_variables
    opt.build(tvs)
    huge = [np.full(v.shape, 3e38, np.float32) for v in tvs]
    opt.apply([ops.convert_to_tensor(g) for g in huge], tvs)
    assert as_tuple(scaler.state) == (np.float32(2.0), 0, 0), "3e38 everywhere is finite"
    huge[-1].flat[-1] = -np.inf
    opt.apply([ops.convert_to_tensor(g) for g in huge], tvs)
    assert as_tuple(scaler.state) == (np.float32(1.0), 0, 0), "one -inf must skip"


def test_finiteness_test_is_exact_for_every_shape_and_dtype(keras):
    """The wrapper's test of the gradients, also where fast forms go wrong: an inf or NaN
    as the last element of a large array (XLA's CPU ``max`` drops a NaN there), empty and
    scalar gradients, float16 and bfloat16; under ``jax.jit`` too on JAX."""
    from keras import ops

    from unifiedamp.backends.keras._optimizer import paths_for

    is_finite = paths_for(keras.backend.backend()).all_finite
    jitted = None
    if keras.backend.backend() == "jax":
        import jax

        jitted = jax.jit(is_finite)  # once: it compiles once per list of shapes and dtypes

    def run(arrays: list[np.ndarray], dtype: str) -> bool:
        tensors = [ops.cast(ops.convert_to_tensor(a), dtype) for a in arrays]
        eager = bool(ops.convert_to_numpy(is_finite(tensors)))
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


# ------------------------------------------------------------ JAX: jit and its compilations


@only_on("jax", why="a train step compiled by jax.jit over stateless_call and "
         "stateless_apply, as Keras's JAX trainer runs it")
def test_jax_stateless_apply_under_jit_follows_spec_and_skips(keras):
    import jax

    pattern = "FFFIIFFIF"
    scaler = make_scaler(**CUSTOM)
    model = make_model()
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
                return opt.scale_loss(mse(y_pred, y))

        grads = jax.grad(scaled_loss)(trainable)
        return opt.stateless_apply(opt_vars, grads, trainable)

    trainable = [v.value for v in model.trainable_variables]
    opt_vars = [v.value for v in opt.variables]
    x, y = make_data(8)
    seen = []
    for kind in pattern:
        new_trainable, new_opt_vars = train_step(trainable, opt_vars,
                                                 with_inf(x) if kind == "I" else x, y)
        if kind == "I":
            assert_same_arrays(to_numpy(new_trainable), to_numpy(trainable), "weights")
            assert_same_arrays(to_numpy(new_opt_vars[own:]), to_numpy(opt_vars[own:]), "inner")
        else:
            assert not np.array_equal(to_numpy(new_trainable)[0], to_numpy(trainable)[0])
        trainable, opt_vars = new_trainable, new_opt_vars
        for var, value in zip(opt.variables, opt_vars, strict=True):
            var.assign(value)
        seen.append(as_tuple(scaler.state))
    assert_states(seen, reference_states(scaler.config, [k == "F" for k in pattern]))
    assert int(opt.iterations) == pattern.count("F")


@only_on("jax", why="Keras's own LossScaleOptimizer leaks tracers from its stateful "
         "apply() under JAX alone (jax.errors.UnexpectedTracerError)")
def test_jax_stateful_apply_works_where_keras_own_fails(keras):
    import jax

    x, y = make_data(8)
    other = make_model(1)  # Keras's failed apply leaves tracers in the variables it touched
    native = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    native.build(other.trainable_variables)
    # Keras 3.15: its stateful cond leaks tracers (what SpecLossScaleOptimizer works around;
    # if this starts passing, the JAX branch of _common_apply may be simplified).
    with pytest.raises(jax.errors.UnexpectedTracerError):
        native.apply(gradients(other, x, y, lambda loss: loss * 32768.0),
                     other.trainable_variables)
    model = make_model()
    scaler = make_scaler(8.0, growth_interval=2)
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    before = to_numpy(model.trainable_variables)
    for _ in range(2):
        opt.apply(gradients(model, x, y, opt.scale_loss), model.trainable_variables)
    assert not np.array_equal(to_numpy(model.trainable_variables)[0], before[0])
    assert as_tuple(scaler.state) == (np.float32(16.0), 0, 0)
    assert int(opt.iterations) == 2


@only_on("jax", why="counts XLA compilations by jax.monitoring's events")
def test_jax_stateful_apply_compiles_once(keras, request):
    """A custom loop's ``opt.apply`` must not compile anything once warm: it runs at the
    speed of a jitted step, not ~0.5 s of XLA compilation per step (2 CPU cores)."""
    import jax

    compiles = []

    def on_duration(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    def on_event(event, **kw):
        # An executable found in the persistent compilation cache (the test session sets
        # one up: tests/conftest.py) was compiled for this step all the same.
        if event == "/jax/compilation_cache/cache_hits":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    # The process runs the session's other tests after this one.
    request.addfinalizer(lambda: jax.monitoring.unregister_event_duration_listener(on_duration))
    request.addfinalizer(lambda: jax.monitoring.unregister_event_listener(on_event))
    model = make_model()
    scaler = make_scaler(8.0, growth_interval=2)
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    x, y = make_data(8)
    counts = []
    for step in range(6):
        xb = with_inf(x) if step == 3 else x
        grads = gradients(model, xb, y, opt.scale_loss)
        before = len(compiles)
        opt.apply(grads, model.trainable_variables)
        counts.append(len(compiles) - before)
    expected = reference_states(scaler.config, [True, True, True, False, True, True])
    assert as_tuple(scaler.state) == expected[-1]
    assert counts[2:] == [0, 0, 0, 0], f"XLA compilations per apply(): {counts}"


# ------------------------------------------------------------ TensorFlow: its graph and XLA


@only_on("tensorflow", why="Grappler's rewrite of 1 / x inside a tf.function")
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


@only_on("tensorflow", why="a tf.function(jit_compile=True) loop over a "
         "tf.GradientTape and tf.TensorArray")
def test_xla_train_loop_follows_spec_with_no_host_reads(keras):
    import tensorflow as tf
    from keras import ops

    flags = [True, True, True, True, False, False, True, False, True, True, True, False, False]
    with dtype_policy("mixed_float16"):
        scaler = make_scaler(**CUSTOM)
        model = make_model()
        opt = scaler.wrap(keras.optimizers.Adam(1e-3))
        opt.build(model.trainable_variables)
        x, y = make_data(4)
        xs = np.stack([x if finite else with_inf(x) for finite in flags])

        @tf.function(jit_compile=True)
        def train(xs, y):
            # Every step in one XLA computation: nothing is read back until it returns.
            out = [tf.TensorArray(tf.float32, size=len(flags)),
                   tf.TensorArray(tf.int64, size=len(flags)),
                   tf.TensorArray(tf.int64, size=len(flags))]
            for i in tf.range(len(flags)):
                with tf.GradientTape() as tape:
                    scaled = opt.scale_loss(mse(model(xs[i], training=True), y))
                grads = tape.gradient(scaled, model.trainable_variables)
                opt.apply(grads, model.trainable_variables)
                out = [out[0].write(i, ops.convert_to_tensor(opt.dynamic_scale)),
                       out[1].write(i, tf.cast(opt.step_counter, tf.int64)),
                       out[2].write(i, tf.cast(opt.hysteresis_counter, tf.int64))]
            return [o.stack() for o in out]

        scales, growth, hysteresis = (t.numpy() for t in train(tf.constant(xs), tf.constant(y)))
    seen = [(np.float32(s), int(g), int(h)) for s, g, h in zip(scales, growth, hysteresis,
                                                                strict=True)]
    expected = reference_states(scaler.config, flags)
    assert len({s[0] for s in expected}) >= 3  # it grows and backs off
    assert_states(seen, expected)
    assert as_tuple(scaler.state) == expected[-1]
    assert int(opt.iterations) == sum(flags)
    assert all(np.isfinite(w).all() for w in to_numpy(model.trainable_variables))


# ------------------------------------------------------------ the docs' custom loop


def _docs_protocol_example() -> str:
    page = (pathlib.Path(__file__).parents[2] / "docs" / "backends" / "keras.md").read_text()
    found = [b for b in re.findall(r"```python\n(.*?)```", page, re.S)
             if "scaler.update(finite)" in b]
    assert len(found) == 1, "docs/backends/keras.md shows the protocol's loop once"
    return found[0]


def test_docs_protocol_loop_runs_under_each_keras_backend(keras, capsys, monkeypatch, tmp_path):
    """The custom loop of docs/backends/keras.md, run as written on the session's Keras
    backend (its gradient call branches on the backend; the docs examples run every block
    of the page on TensorFlow alone): the scale it prints per step."""
    monkeypatch.chdir(tmp_path)
    exec(compile(_docs_protocol_example(), "docs/backends/keras.md", "exec"),
         {"__name__": "__main__"})
    finite = [True, True, False, True]  # the example's inf is in step 2
    expected = reference_states(ScalerConfig(1024.0, growth_interval=2), finite)
    assert capsys.readouterr().out.splitlines()[-4:] == [
        f"{step} {float(state[0])} {not ok}"
        for step, (state, ok) in enumerate(zip(expected, finite, strict=True))]
