"""The JAX backend: pytree behaviour, optax, flax nnx, no host sync, the package's layout
(the shared contract runs in test_conformance.py, what needs four devices in
test_jax_devices.py)."""

from __future__ import annotations

import ast
import json
import pathlib
import pickle
import re
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.backends import jax as jax_backend  # noqa: E402
from unifiedamp.backends.jax import (  # noqa: E402
    JaxGradScaler,
    all_finite,
    find_scaler,
    loss_scaled,
    replace_scaler,
    step_if_finite,
    where_finite,
)
from unifiedamp.backends.jax._scaler import F32  # noqa: E402
from unifiedamp.errors import MissingBackendError  # noqa: E402

EXTRAS = {"init_scale": 1024.0, "growth_factor": 3.0, "backoff_factor": 0.25,
          "growth_interval": 3, "hysteresis": 2, "min_scale": 4.0, "max_scale": 1e6,
          "dynamic": True}


def test_detected_from_jax_arrays_and_is_a_grad_scaler():
    scaler = ua.GradScaler(backend=jnp.ones(2))
    assert type(scaler) is JaxGradScaler and isinstance(scaler, ua.GradScaler)


def test_it_is_immutable():
    scaler = JaxGradScaler(8.0)
    with pytest.raises(AttributeError, match="immutable"):
        scaler.loss_scale = jnp.float32(1.0)


def test_imperative_verbs_say_which_functional_verbs_to_use():
    scaler = JaxGradScaler(8.0)
    with pytest.raises(NotImplementedError, match=r"the 'jax' backend has no step\(\) .*"
                                                  r"grads, finite = scaler.unscale\(grads\)"):
        scaler.step(optax.sgd(0.1))
    with pytest.raises(NotImplementedError, match=r"has no unscale_\(\)"):
        scaler.unscale_(optax.sgd(0.1))


def test_arrays_are_leaves_and_every_option_is_static_aux_data():
    scaler = JaxGradScaler(**EXTRAS).update(jnp.array(False))
    leaves, treedef = jax.tree.flatten(scaler)
    assert [leaf.dtype for leaf in leaves] == [jnp.float32] + [jnp.int32] * 5
    back = jax.tree.unflatten(treedef, leaves)
    assert back.config == scaler.config == spec.ScalerConfig(**EXTRAS)
    assert back.state == scaler.state == spec.ScalerState(1024.0, 0, 1)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(scaler)[0]]
    assert paths == [".loss_scale", ".growth_tracker", ".hysteresis_tracker", ".skipped_steps",
                     ".consecutive_skips", ".updates"]


def test_config_survives_jit_and_scan_where_jmp_loses_min_loss_scale():
    scaler = JaxGradScaler(**EXTRAS)
    out = jax.jit(lambda s: s.update(jnp.array(False)))(scaler)
    assert out.config == scaler.config  # min_scale, max_scale, hysteresis... intact

    def body(s, finite):
        s = s.update(finite)
        return s, s.loss_scale

    finites = jnp.array([False] * 8 + [True] * 3)
    final, scales = jax.lax.scan(body, scaler, finites)
    assert final.config == scaler.config
    # the trajectory equals the reference, min_scale clamp included
    state, expected = spec.ScalerState.initial(scaler.config), []
    for f in finites.tolist():
        state = spec.update(scaler.config, state, not f)
        expected.append(state.scale)
    assert np.asarray(scales).tolist() == expected and min(expected) == 4.0


def test_checkpointing_round_trips_through_json_pickle_and_array_checkpoints(tmp_path):
    scaler = JaxGradScaler(**EXTRAS).update(jnp.array(True))
    assert JaxGradScaler().restore(json.loads(json.dumps(
        scaler.state_dict()))).state == scaler.state
    assert pickle.loads(pickle.dumps(scaler)).config == scaler.config
    # Array checkpointers (orbax and the like) save leaves and restore them into a
    # template's structure: the config comes back with the structure.
    np.savez(tmp_path / "ckpt.npz", *[np.asarray(x) for x in jax.tree.leaves(scaler)])
    saved = np.load(tmp_path / "ckpt.npz")
    template = JaxGradScaler(**EXTRAS)
    restored = jax.tree.unflatten(jax.tree.structure(template),
                                  [jnp.asarray(saved[f"arr_{i}"]) for i in range(6)])
    assert restored.state == scaler.state and restored.config == scaler.config


def test_restore_returns_a_new_scaler_and_validates():
    scaler = JaxGradScaler(8.0)
    loaded = scaler.restore({"scale": 64.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                             "growth_interval": 7, "_growth_tracker": 3})
    assert loaded.state == spec.ScalerState(64.0, 3, 0) and loaded.config.growth_interval == 7
    assert scaler.get_scale() == 8.0
    with pytest.raises(ValueError, match="nothing was loaded"):
        scaler.restore({**scaler.state_dict(), "scale": -1.0})


def test_torch_style_load_state_dict_fails_loudly_showing_the_right_line():
    # MLX's scaler says the same (tests/mlx/test_mlx_backend.py).
    scaler = ua.GradScaler(8.0, backend="jax")
    saved = ua.GradScaler(64.0, backend="jax").state_dict()
    with pytest.raises(TypeError, match=r"immutable value: load_state_dict\(\) cannot change it "
                                        r"in place.*scaler = scaler.restore\(state_dict\)"):
        scaler.load_state_dict(saved)  # torch's habit: the result would be dropped
    assert scaler.restore(saved).get_scale() == 64.0


def test_scale_keeps_dtypes_and_unscale_checks_in_one_pass():
    scaler = JaxGradScaler(1024.0)
    tree = {"a": jnp.ones(3, jnp.float16), "b": [jnp.full(2, 0.5, jnp.bfloat16)]}
    scaled = scaler.scale(tree)
    assert scaled["a"].dtype == jnp.float16 and scaled["b"][0].dtype == jnp.bfloat16
    grads, finite = scaler.unscale(scaled)
    assert bool(finite) and float(grads["a"][0]) == 1.0 and grads["a"].dtype == jnp.float16
    _, finite = scaler.unscale({"a": jnp.array([1.0, jnp.nan])})
    assert not bool(finite)
    assert bool(all_finite([])) and not bool(all_finite([jnp.array([-jnp.inf])]))


def test_disabled_is_a_pass_through():
    scaler = JaxGradScaler(8.0, enabled=False)
    x = jnp.ones(2)
    assert scaler.scale(x) is x
    assert scaler.unscale(x)[0] is x and scaler.update(jnp.array(False)) is scaler
    assert scaler.get_scale() == 1.0


def test_exact_float32_multiply_under_flush_to_zero():
    # XLA flushes subnormals; the update's multiply must not.
    rng = np.random.default_rng(0)
    # 0 too: a scale reaches it after enough backoffs, and 0 * c is 0.
    xs = np.concatenate([[0], rng.integers(1, 0x00800000, 3000, dtype=np.uint32),
                         rng.integers(0x00800000, 0x7F7FFFFF, 3000, dtype=np.uint32)]
                        ).astype(np.uint32).view(np.float32)
    for c in (0.5, 0.7, 1.1, 3.3, 0.999, 1e-20, 2.5e30):
        c = spec.f32(c)
        got = np.asarray(jax.jit(jax.vmap(lambda x, c=c: F32.mul_bits_by(F32.bits(x), c)))(
            jnp.asarray(xs)))
        with np.errstate(over="ignore"):
            expected = (xs * np.float32(c)).view(np.uint32)
        assert (got.view(np.uint32) == expected).all(), c


def test_subnormal_scales_follow_the_spec():
    config = spec.ScalerConfig(2.0**-140, growth_factor=1.1, backoff_factor=0.7,
                               growth_interval=1)
    scaler, state = JaxGradScaler(**config.to_dict()), spec.ScalerState.initial(config)
    for finite in [True, True, False, True, False, False]:
        scaler, state = scaler.update(jnp.array(finite)), spec.update(config, state, not finite)
        assert spec.f32_hex(scaler.get_scale()) == spec.f32_hex(state.scale)


def loss(params, x):
    return ((x @ params["w"] + params["b"]) ** 2).mean()


def data(poison=None):
    x = jnp.ones((8, 3)) * 0.5
    return x if poison is None else x.at[0, 0].set(poison)


def test_whole_train_step_is_one_jit_with_no_host_transfer():
    # The README's recipe: the flag from one unscale, the product from another in the branch.
    scaler = JaxGradScaler(1024.0, growth_interval=2, hysteresis=2, min_scale=1.0)
    tx = optax.adam(1e-2)
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, scaler, x):
        grads = jax.grad(lambda p: scaler.scale(loss(p, x)))(params)
        finite = scaler.unscale(grads)[1]

        def apply(state):
            params, opt_state = state
            updates, opt_state = tx.update(scaler.unscale(grads)[0], opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        return (*step_if_finite(finite, apply, (params, opt_state)), scaler.update(finite))

    x_good, x_bad = jax.device_put(data()), jax.device_put(data(jnp.inf))
    step(params, opt_state, scaler, x_good)  # compile outside the guard
    with jax.transfer_guard("disallow"):
        for x in (x_good, x_bad, x_bad, x_good):
            params, opt_state, scaler = step(params, opt_state, scaler, x)
    assert scaler.state == spec.ScalerState(512.0, 1, 0)
    assert len(jax.jit(step).lower(params, opt_state, scaler, x_good).as_text()) > 0


def test_readme_recipe_unscales_inside_the_branch_only():
    # Unscaled outside the lax.cond, the product is a full-size pass of its own before
    # the branch; the recipe's outer unscale (flag only) must leave none of it.
    scaler, grads = JaxGradScaler(8.0), {"w": jnp.ones(1000)}

    def outside(grads, scaler):
        unscaled, finite = scaler.unscale(grads)
        return step_if_finite(finite, lambda _: unscaled, grads)

    def recipe(grads, scaler):
        finite = scaler.unscale(grads)[1]
        return step_if_finite(finite, lambda g: scaler.unscale(g)[0], grads)

    def full_size_passes(fn):
        hlo = jax.jit(fn).lower(grads, scaler).compile().as_text()
        return len(re.findall(r"= f32\[1000\]\{0\} fusion\(", hlo[hlo.index("\nENTRY"):]))

    assert full_size_passes(recipe) < full_size_passes(outside)


def test_all_finite_is_exact_for_every_float_dtype():
    big32 = jnp.full(8, 3e38, jnp.float32)  # finite; any float32 sum of |g| overflows
    big16 = jnp.full(8, 65504.0, jnp.float16)  # the largest float16; its sum overflows too
    for dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
        ones = jnp.ones(8, dtype)
        assert bool(all_finite({"a": ones, "b": [ones]})), dtype
        for bad in (jnp.inf, -jnp.inf, jnp.nan):
            assert not bool(all_finite({"a": ones, "b": [ones.at[5].set(bad)]})), (dtype, bad)
    assert bool(all_finite([big32, big16, -big32])) and bool(jax.jit(all_finite)([big32, big16]))
    for bad in (jnp.inf, jnp.nan):
        assert not bool(all_finite([big32.at[3].set(bad), big16]))
        assert not bool(all_finite([big32, big16.at[3].set(bad)]))
    # A step whose finite gradients sum past float32's range is taken, not skipped.
    _, finite = JaxGradScaler(1.0).unscale({"w": big32, "h": big16})
    assert bool(finite)
    # An empty leaf (a zero-size parameter) and an integer one are finite, eager and jitted.
    empty, count = jnp.zeros((0, 3)), jnp.arange(4)
    for check in (all_finite, jax.jit(all_finite)):
        assert bool(check([empty, count, big32]))
        assert not bool(check([empty, count, big32.at[0].set(jnp.nan)]))


def test_step_if_finite_and_where_finite_keep_the_old_state():
    old, new = {"w": jnp.ones(2)}, {"w": jnp.zeros(2)}
    assert (where_finite(jnp.array(False), new, old)["w"] == 1).all()
    assert (step_if_finite(jnp.array(True), lambda s: new, old)["w"] == 0).all()


def train_optax(tx, poison_steps=(), steps=6):
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    opt_state = tx.init(params)
    history = []

    @jax.jit
    def step(params, opt_state, x):
        scaler = find_scaler(opt_state)
        grads = jax.grad(lambda p: scaler.scale(loss(p, x)))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for i in range(steps):
        before = jax.tree.map(np.asarray, (params, opt_state))
        params, opt_state = step(params, opt_state, data(jnp.nan if i in poison_steps else None))
        history.append((before, jax.tree.map(np.asarray, (params, opt_state))))
    return params, opt_state, history


def test_loss_scaled_skips_and_keeps_params_and_inner_state():
    tx = loss_scaled(optax.adam(1e-2), JaxGradScaler(1024.0, growth_interval=2))
    params, opt_state, history = train_optax(tx, poison_steps=(2,))
    before, after = history[2]
    inner = lambda s: jax.tree.leaves(s[1].inner_state)  # noqa: E731
    assert all((a == b).all() for a, b in zip(jax.tree.leaves(before[0]),
                                             jax.tree.leaves(after[0]), strict=True))
    assert all((a == b).all() for a, b in zip(inner(before), inner(after), strict=True))
    # F F I F F F: 1024 -> 2048 at step 2, 1024 after the inf, 2048 after two more finite
    assert find_scaler(opt_state).state == spec.ScalerState(2048.0, 1, 0)


def test_unscaled_training_equals_training_without_a_scaler():
    plain_tx = optax.adam(1e-2)
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    state = plain_tx.init(params)
    for _ in range(4):
        grads = jax.grad(loss)(params, data())
        updates, state = plain_tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    scaled, _, _ = train_optax(loss_scaled(optax.adam(1e-2), JaxGradScaler(1024.0)), steps=4)
    # Not bitwise: XLA fuses the jitted scaled step differently from the eager one.
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(scaled), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_loss_scaled_in_chain_and_multisteps():
    chained = optax.chain(optax.clip_by_global_norm(1.0),
                          loss_scaled(optax.sgd(0.1), JaxGradScaler(8.0, growth_interval=1)))
    _, opt_state, _ = train_optax(chained, poison_steps=(1,), steps=3)
    assert find_scaler(opt_state).get_scale() == 16.0  # 16, 8, 16
    # Gradient accumulation: loss_scaled around MultiSteps checks every micro-batch, so an
    # inf is dropped before it reaches the accumulator (inside MultiSteps it would stay:
    # optax 0.2.8 resets the accumulator as (1 - emit) * acc, and 0 * inf is NaN).
    multi = loss_scaled(optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2),
                        JaxGradScaler(8.0, growth_interval=2))
    params, opt_state, history = train_optax(multi, poison_steps=(0,), steps=5)
    # micro-steps I F F F F: 4, 4, 8, 8, 16; the windows are micro-steps 2-3 and 4-5
    assert find_scaler(opt_state).state == spec.ScalerState(16.0, 0, 0)
    w = [h[1][0]["w"] for h in history]
    np.testing.assert_array_equal(w[0], np.ones(3))  # skipped
    np.testing.assert_array_equal(w[1], np.ones(3))  # accumulating
    assert (w[2] != 1).all() and (w[3] == w[2]).all() and (w[4] != w[3]).all()
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(history[-1][1]))


def test_the_former_transformation_type_warns_and_names_what_loss_scaled_returns():
    import unifiedamp.backends.jax as backend

    with pytest.warns(DeprecationWarning, match="optax.GradientTransformationExtraArgs"):
        former = backend.LossScaledTransformation
    assert isinstance(loss_scaled(optax.sgd(0.1), JaxGradScaler()), former)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        backend.nope  # noqa: B018


def test_find_scaler_explains_a_missing_scaler():
    with pytest.raises(ValueError, match="build the optimizer with"):
        find_scaler(optax.sgd(0.1).init({"w": jnp.ones(2)}))


def test_flax_nnx_training_loop_in_float16_and_bfloat16():
    from flax import nnx

    for dtype in (jnp.float16, jnp.bfloat16):
        class MLP(nnx.Module):
            def __init__(self, rngs, dtype=dtype):
                self.l1 = nnx.Linear(4, 16, dtype=dtype, param_dtype=jnp.float32, rngs=rngs)
                self.l2 = nnx.Linear(16, 1, dtype=dtype, param_dtype=jnp.float32, rngs=rngs)

            def __call__(self, x):
                return self.l2(nnx.relu(self.l1(x)))

        model = MLP(nnx.Rngs(0))
        tx = loss_scaled(optax.adam(1e-2), JaxGradScaler(2.0**15, growth_interval=10))
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

        @nnx.jit
        def train_step(model, optimizer, x, y):
            scaler = find_scaler(optimizer.opt_state)

            def loss_fn(model):
                pred = model(x).astype(jnp.float32)
                return scaler.scale(((pred - y) ** 2).mean())

            scaled_loss, grads = nnx.value_and_grad(loss_fn)(model)
            optimizer.update(model, grads)
            return scaled_loss / scaler.loss_scale

        x = jax.random.normal(jax.random.key(0), (64, 4))
        y = x.sum(1, keepdims=True)
        first = float(train_step(model, optimizer, x, y))
        for _ in range(60):
            last = float(train_step(model, optimizer, x, y))
        assert last < first / 4, dtype
        assert find_scaler(optimizer.opt_state).get_scale() >= 2.0**15


# ------------------------------------------------------------ scale/unscale at extreme scales

MIN_NORMAL = np.float32(2.0**-126)


def numpy_product(x, c):
    """NumPy's f32(x * c), with the results XLA flushes (below 2**-126) as signed zeros."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = x * np.float32(c)
    return np.where(np.abs(out) < MIN_NORMAL, np.copysign(np.float32(0), out), out)


def numpy_reciprocal(scale):
    """What torch, NumPy and MLX unscale with: the float64 reciprocal rounded once."""
    with np.errstate(over="ignore", divide="ignore"):
        return (1.0 / np.asarray(scale, np.float64)).astype(np.float32)


def scalers_with_scales(scales):
    """One JaxGradScaler whose loss_scale leaf holds a batch of scales (for vmap)."""
    treedef = jax.tree.structure(JaxGradScaler())
    zeros = jnp.zeros(len(scales), jnp.int32)
    return jax.tree.unflatten(treedef, [jnp.asarray(scales, jnp.float32)] + [zeros] * 5)


def same_bits(got, expected):
    got, expected = np.asarray(got), np.asarray(expected)
    both_nan = np.isnan(got) & np.isnan(expected)
    return both_nan | (got.view(np.uint32 if got.dtype == np.float32 else np.uint16)
                       == expected.view(np.uint32 if got.dtype == np.float32 else np.uint16))


def test_unscale_at_two_to_the_127_gives_numpy_s_value_not_zero():
    grads, finite = JaxGradScaler(2.0**127).unscale({"g": jnp.float32(1.7e8)})
    expected = np.float32(1.7e8) * numpy_reciprocal(2.0**127)
    assert bool(finite) and float(grads["g"]) == float(expected) != 0.0  # ~1e-30


def test_scale_and_unscale_match_numpy_over_the_whole_float32_range():
    rng = np.random.default_rng(0)
    scales = np.concatenate([
        np.float32([2.0**127, 2.0**126, 2.0**-126, 2.0**-127, 2.0**-149, 3 * 2.0**-149,
                    2.9387359e-39, 2.9387361e-39, 1.0, 65536.0]),
        np.nextafter(np.float32(2.0**126), np.float32(np.inf))[None],
        np.finfo(np.float32).max[None],
        rng.integers(1, 0x7F7FFFFF, 120, dtype=np.uint32).view(np.float32),   # anywhere
        rng.integers(0x7E800000, 0x7F7FFFFF, 60, dtype=np.uint32).view(np.float32),  # >2**126
        rng.integers(1, 0x00800000, 60, dtype=np.uint32).view(np.float32),   # subnormal
    ])
    # normal inputs of every magnitude and sign (XLA reads a subnormal input as zero)
    xs = np.concatenate([
        rng.integers(0x00800000, 0x7F7FFFFF, 400, dtype=np.uint32).view(np.float32),
        np.float32([1.0, 1.7e8, 0.0, -0.0, np.inf, -np.inf, np.nan, -3.5, 6.5e-38]),
    ])
    xs = np.where(rng.random(xs.size) < 0.5, -xs, xs).astype(np.float32)
    batched = scalers_with_scales(scales)
    scaled = jax.jit(jax.vmap(lambda s: s.scale(jnp.asarray(xs))))(batched)
    unscaled, finite = jax.jit(jax.vmap(lambda s: s.unscale(jnp.asarray(xs))))(batched)
    inv = numpy_reciprocal(scales)
    for i, s in enumerate(scales):
        bad = ~same_bits(scaled[i], numpy_product(xs, s))
        assert not bad.any(), ("scale", s, xs[bad][:3])
        bad = ~same_bits(unscaled[i], numpy_product(xs, inv[i]))
        assert not bad.any(), ("unscale", s, xs[bad][:3])
    assert not np.asarray(finite).any()  # the inputs hold an inf


def test_float16_leaves_match_numpy_at_extreme_scales():
    xs = np.float16([1.0, -2.5, 65504.0, 6e-5, 0.0])
    for s in (2.0**127, 2.0**-126, 2.0**-149, 2.0**-140, 3.0e38):
        scaler = JaxGradScaler(s)
        with np.errstate(over="ignore", invalid="ignore"):
            expected_scale = (xs * np.float32(s)).astype(np.float16)
            expected_unscale = (xs * numpy_reciprocal(s)).astype(np.float16)
        got = np.asarray(scaler.scale(jnp.asarray(xs)))
        assert got.dtype == np.float16 and same_bits(got, expected_scale).all(), s
        got = np.asarray(scaler.unscale(jnp.asarray(xs))[0])
        assert same_bits(got, expected_unscale).all(), s


def test_scale_stays_differentiable_and_exact_for_a_loss():
    scaler = JaxGradScaler(2.0**-140)
    # a loss large enough that the scaled loss is a normal float32
    value, grad = jax.value_and_grad(lambda w: scaler.scale(w * 2.0**120))(jnp.float32(1.0))
    assert float(value) == 2.0**-20
    assert float(jax.grad(lambda w: JaxGradScaler(8.0).scale(w * 3.0))(jnp.float32(1.0))) == 24.0


# ------------------------------------------------------------ get_scale under tracing


def test_get_scale_is_a_float_outside_jit_and_an_array_when_traced():
    scaler = JaxGradScaler(8.0, growth_interval=1)
    assert type(scaler.get_scale()) is float
    traced = jax.jit(lambda s: s.update(True).get_scale())(scaler)
    assert traced.dtype == jnp.float32 and float(traced) == 16.0

    def body(s, finite):
        s = s.update(finite)
        return s, s.get_scale()

    _, logged = jax.lax.scan(body, scaler, jnp.array([True, False, False]))
    assert np.asarray(logged).tolist() == [16.0, 8.0, 4.0]
    disabled = JaxGradScaler(8.0, enabled=False)
    assert jax.jit(lambda s: jnp.asarray(s.get_scale()))(disabled) == 1.0


# ------------------------------------------------------------ update(finite) validation


@pytest.mark.parametrize("bad, error, message", [
    ("no", TypeError, r"got str 'no'.*Python bool or a 0-d bool array"),
    (float("nan"), TypeError, r"got float nan"),
    (1, TypeError, r"got int 1"),
    (None, TypeError, r"needs the flag unscale\(\) returned"),
    (np.float32(1.0), TypeError, r"dtype float32"),
    (jnp.array(1.0), TypeError, r"dtype float32"),
    (jnp.array([True, False, True]), ValueError, r"shape \(3,\).*jnp.all"),
    (np.ones((2, 2), bool), ValueError, r"shape \(2, 2\)"),
])
def test_update_refuses_anything_but_one_flag(bad, error, message):
    with pytest.raises(error, match=message):
        JaxGradScaler(8.0).update(bad)


def test_update_refuses_bad_flags_under_jit_and_accepts_the_good_ones():
    scaler = JaxGradScaler(8.0, growth_interval=1)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        jax.jit(lambda s, f: s.update(f))(scaler, jnp.array([True, True]))
    with pytest.raises(TypeError, match="dtype int32"):
        jax.jit(lambda s, f: s.update(f))(scaler, jnp.int32(1))
    for flag in (True, np.bool_(True), np.array(True), jnp.array(True)):
        assert JaxGradScaler(8.0, growth_interval=1).update(flag).get_scale() == 16.0
    assert jax.jit(lambda s, f: s.update(f))(scaler, jnp.array(False)).get_scale() == 4.0
    leaves = jax.tree.leaves(jax.jit(lambda s: s.update(jnp.array(True)))(scaler))
    assert [leaf.shape for leaf in leaves] == [()] * 6


# ------------------------------------------------------------ loss_scaled without optax


def test_loss_scaled_without_optax_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "optax", None)  # makes 'import optax' fail
    with pytest.raises(MissingBackendError) as error:
        loss_scaled(object(), JaxGradScaler())
    assert str(error.value).startswith("loss_scaled needs optax")
    assert "pip install 'unifiedamp[jax]'" in str(error.value)


# ------------------------------------------------------------ skip counters, replacing the scaler


def test_skip_counters_are_leaves_that_count_under_jit_and_in_loss_scaled():
    @jax.jit
    def run(scaler, flags):
        def body(s, finite):
            s = s.update(finite)
            return s, (s.num_skipped_steps, s.last_step_skipped)
        return jax.lax.scan(body, scaler, flags)

    flags = jnp.array([True, False, False, True, False])
    scaler, (counts, last) = run(JaxGradScaler(8.0, growth_interval=100), flags)
    assert counts.tolist() == [0, 1, 2, 2, 3] and last.tolist() == [False, True, True, False, True]
    assert (scaler.num_skipped_steps, scaler.last_step_skipped) == (3, True)
    assert int(scaler.consecutive_skips) == 1
    # kept by with_config and restore (they are this run's, not the checkpoint's)
    assert scaler.with_config(growth_interval=5).num_skipped_steps == 3
    assert scaler.restore(JaxGradScaler(2.0).state_dict()).num_skipped_steps == 3
    tx = loss_scaled(optax.sgd(0.1), JaxGradScaler(8.0))
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    for g in ([1.0, 1.0], [jnp.inf, 1.0], [1.0, 1.0]):
        _, state = tx.update({"w": jnp.array(g)}, state, params)
    assert (find_scaler(state).num_skipped_steps, find_scaler(state).last_step_skipped) == (
        1, False)


def test_replace_scaler_puts_a_restored_scaler_inside_chain_and_multisteps():
    tx = optax.MultiSteps(optax.chain(optax.clip(1.0), loss_scaled(optax.sgd(0.1),
                                                                      JaxGradScaler())), 2)
    state = tx.init({"w": jnp.ones(2)})
    restored = JaxGradScaler().restore({**JaxGradScaler(64.0).state_dict(), "growth_tracker": 3})
    new = replace_scaler(state, restored)
    assert find_scaler(new).state == spec.ScalerState(64.0, 3, 0)
    assert new.acc_grads["w"] is state.acc_grads["w"] and new.mini_step is state.mini_step
    assert find_scaler(state).get_scale() == 65536.0  # the old state is unchanged
    with pytest.raises(ValueError, match="build the optimizer with"):
        replace_scaler(optax.sgd(0.1).init({"w": jnp.ones(2)}), restored)


def test_a_new_scaler_can_be_donated_to_a_jitted_step():
    # Every leaf its own buffer: donating one array twice is an error in XLA.
    for scaler in (JaxGradScaler(8.0), JaxGradScaler(8.0, dynamic=False).update(True)):
        leaves = jax.tree.leaves(scaler)
        assert len({id(leaf) for leaf in leaves}) == len(leaves)
        step = jax.jit(lambda s: s.update(jnp.array(True)), donate_argnums=0)
        assert step(scaler).growth_tracker.shape == ()


# ------------------------------------------------------------ the package's layout

#: What jax/_compat.py wraps: not JAX's stable API (attribute and string names).
JAX_INTERNALS = {"core", "_src", "pcast", "pvary", "vma", "manual_axis_type", "_check_vma",
                 "_check_rep"}


def _names_used(path):
    tree = ast.parse(path.read_text())
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {node.value for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    names |= {part for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              for part in (node.module or "").split(".")}
    return names


def test_only_compat_touches_jax_internals():
    package = pathlib.Path(jax_backend.__file__).parent
    compat = package / "_compat.py"
    assert JAX_INTERNALS - {"_src"} <= _names_used(compat)
    for path in sorted(package.glob("*.py")):
        if path != compat:
            assert not JAX_INTERNALS & _names_used(path), (
                f"{path.name} uses {sorted(JAX_INTERNALS & _names_used(path))}: go through "
                "unifiedamp/backends/jax/_compat.py")


def test_the_jax_internals_compat_wraps_work_on_this_jax():
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from unifiedamp.backends.jax import _compat

    seen = {}

    def body(x):
        zero = jnp.zeros(())
        seen.update(tracer=_compat.is_tracer(x), x=_compat.varying_axes(x),
                    zero=_compat.varying_axes(zero),
                    cast=_compat.varying_axes(_compat.cast_varying(zero, frozenset({"d"}))),
                    mapped=_compat.mapped_axes())
        return x

    mesh = Mesh(np.array(jax.devices()[:1]), ("d",))
    jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d"))(jnp.ones(1))
    assert seen == {"tracer": True, "x": {"d"}, "zero": frozenset(), "cast": {"d"},
                    "mapped": (("d",), True)}, (
        f"jax {jax.__version__}: {seen}; adapt unifiedamp/backends/jax/_compat.py")
    assert not _compat.is_tracer(jnp.ones(1))
    # pmap and shard_map(check_vma=False) map the axis without tracking what varies.
    mapped = []
    jax.pmap(lambda x: mapped.append(_compat.mapped_axes()) or x, axis_name="p")(jnp.ones(1))
    jax.shard_map(lambda x: mapped.append(_compat.mapped_axes()) or x, mesh=mesh,
                  in_specs=P("d"), out_specs=P("d"), check_vma=False)(jnp.ones(1))
    jax.jit(lambda x: mapped.append(_compat.mapped_axes()) or x)(jnp.ones(1))
    assert mapped == [(("p",), False), (("d",), False), ((), False)], mapped


def test_public_names_show_the_public_module():
    for name in jax_backend.__all__:
        if name != "LeafCounts":  # shared with the MLX backend
            assert getattr(jax_backend, name).__module__ == "unifiedamp.backends.jax", name
    assert pickle.loads(pickle.dumps(JaxGradScaler(8.0))).get_scale() == 8.0
    assert "unifiedamp.backends.jax.JaxGradScaler" in repr(JaxGradScaler)


# ------------------------------------------------------------ misuses named with the fix


def test_setting_an_attribute_says_the_scaler_is_a_value_and_how_to_get_a_new_one():
    import dataclasses

    scaler = ua.GradScaler(8.0, backend="jax")
    with pytest.raises(dataclasses.FrozenInstanceError,
                       match=r"cannot set 'loss_scale': .*scaler = scaler.update\(finite\)"):
        scaler.loss_scale = jnp.float32(4.0)
    assert scaler.get_scale() == 8.0


def test_a_donated_scaler_says_its_arrays_went_to_the_call_that_took_them():
    step = jax.jit(lambda s, g: s.update(s.unscale(g)[1]), donate_argnums=0)
    scaler = ua.GradScaler(8.0, backend="jax")
    new = step(scaler, [jnp.ones(3)])
    if not scaler.loss_scale.is_deleted():
        pytest.skip("this platform does not donate buffers")
    for read in (scaler.get_scale, scaler.state_dict, lambda: scaler.update(True)):
        with pytest.raises(ValueError, match=r"donated to a jitted call .*use the scaler that "
                                             r"call returned"):
            read()
    assert new.get_scale() == 8.0


def test_a_scaler_stacked_by_pmap_names_out_axes_and_how_to_take_one_copy():
    n = jax.local_device_count()
    stacked = jax.pmap(lambda s, g: s.update(s.unscale(g, axis_name="d")[1]),
                       in_axes=(None, 0), axis_name="d")(ua.GradScaler(8.0, backend="jax"),
                                                         jnp.ones((n, 3)))
    for read in (stacked.get_scale, stacked.state_dict, lambda: stacked.num_skipped_steps):
        with pytest.raises(ValueError, match=rf"shape \({n},\), a value per device: .*"
                                             r"out_axes=None.*x\[0\]"):
            read()
    assert jax.tree.map(lambda x: x[0], stacked).get_scale() == 8.0


def test_a_scaler_unflattened_from_other_values_names_the_leaf():
    leaves, treedef = jax.tree_util.tree_flatten(ua.GradScaler(8.0, backend="jax"))
    rebuilt = jax.tree_util.tree_unflatten(treedef, ["a"] * len(leaves))
    with pytest.raises(ValueError, match=r"a leaf is a str 'a', not an array: .*tree_unflatten"):
        rebuilt.get_scale()


def test_reading_the_state_inside_jit_says_to_return_the_scaler_or_use_its_arrays():
    scaler = ua.GradScaler(8.0, backend="jax")
    with pytest.raises(TypeError, match=r"inside a traced function .*return the scaler from "
                                        r"the traced function"):
        jax.jit(lambda s: s.state_dict())(scaler)
    assert float(jax.jit(lambda s: s.get_scale())(scaler)) == 8.0
