"""Every documented JAX recipe (docs/backends/jax.md) trains exactly like an unscaled run
that skips the same steps: loss_scaled alone, with clipping, with MultiSteps, in flax nnx
(with axis_name on four devices, in a default shard_map and under pmap: test_jax_devices.py).

The scale stays a power of two, so scaling the loss and unscaling the gradients is exact
in float32: the scaled run must give the reference's parameters bit for bit (up to the
fusion XLA picks, hence a tolerance of float32 rounding). SGD and clipping
are not scale-invariant, so a wrapper that handed the inner transformation the
still-scaled gradients would be off by the scale.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from unifiedamp.backends.jax import JaxGradScaler, find_scaler, loss_scaled  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends" / "jax.md"
POISON = (1, 4)  # the steps whose data holds an inf: skipped by the scaler


def loss(params, x):
    return ((x @ params["w"] + params["b"] - 1.0) ** 2).mean()


def batch(i):
    # Gradients of norm well above 1, so clip_by_global_norm(1.0) acts on every step.
    x = jnp.arange(24, dtype=jnp.float32).reshape(8, 3) / 8.0 + i
    return x.at[0, 0].set(jnp.inf) if i in POISON else x


def init_params():
    return {"w": jnp.full(3, 0.5), "b": jnp.zeros(())}


def train_scaled(tx, steps=7, scaler_loss=loss):
    params = init_params()
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x):
        scaler = find_scaler(opt_state)
        grads = jax.grad(lambda p: scaler.scale(scaler_loss(p, x)))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for i in range(steps):
        params, opt_state = step(params, opt_state, batch(i))
    return params, opt_state


def train_reference(tx, steps=7):
    """The same run without a scaler, leaving out the poisoned steps."""
    params = init_params()
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x):
        grads = jax.grad(loss)(params, x)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for i in range(steps):
        if i not in POISON:
            params, opt_state = step(params, opt_state, batch(i))
    return params


def assert_same_params(got, expected):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.isfinite(a).all()
        # within float32 rounding of the parameters' initial size (~0.5): the scaled and
        # unscaled steps are fused differently by XLA; a missed unscale is off by 1024x
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=6e-8)


def test_loss_scaled_trains_like_the_unscaled_inner_optimizer():
    scaler = JaxGradScaler(1024.0, growth_interval=2)
    params, opt_state = train_scaled(loss_scaled(optax.sgd(0.01), scaler))
    assert_same_params(params, train_reference(optax.sgd(0.01)))
    # F I F F I F F: 1024, 512, 512, 1024, 512, 512, 1024
    assert find_scaler(opt_state).get_scale() == 1024.0


def test_clipping_goes_inside_loss_scaled_and_clips_unscaled_gradients():
    clip_sgd = lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))  # noqa: E731
    expected = train_reference(clip_sgd())
    params, _ = train_scaled(loss_scaled(clip_sgd(), JaxGradScaler(1024.0, growth_interval=2)))
    assert_same_params(params, expected)
    # The order the page used to show clips the *scaled* gradients: a different run.
    wrong = optax.chain(optax.clip_by_global_norm(1.0),
                        loss_scaled(optax.sgd(0.1), JaxGradScaler(1024.0, growth_interval=2)))
    params, _ = train_scaled(wrong)
    assert not np.allclose(np.asarray(params["w"]), np.asarray(expected["w"]), rtol=1e-3)


def test_multisteps_accumulation_equals_unscaled_multisteps_without_bad_micro_batches():
    def multi():
        return optax.MultiSteps(optax.sgd(0.05), every_k_schedule=2)

    expected = train_reference(multi(), steps=9)
    params, _ = train_scaled(loss_scaled(multi(), JaxGradScaler(1024.0, growth_interval=3)),
                             steps=9)
    assert_same_params(params, expected)


def _doc_block(heading: str) -> str:
    text = DOC.read_text()
    section = text.split(f"## {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_optax_recipe_matches_its_unscaled_reference():
    namespace: dict = {}
    exec(compile(_doc_block("optax"), str(DOC), "exec"), namespace)  # runs one step
    tx, step = namespace["tx"], namespace["step"]
    # The same recipe, unscaled: every transformation of the page's optimizer, in order,
    # read off its definition (loss_scaled(<inner>, ...)).
    source = _doc_block("optax")
    inner_src = re.search(r"loss_scaled\((.*),\s*JaxGradScaler", source, re.S).group(1)
    reference_tx = eval(inner_src, {"optax": optax})  # noqa: S307
    x = jnp.ones((4, 3))
    params = {"w": jnp.ones(3)}
    opt_state = tx.init(params)
    ref_params, ref_state = params, reference_tx.init(params)
    for i in range(5):
        xi = x * (i + 1) if i != 2 else x.at[0, 0].set(jnp.nan)
        params, opt_state = step(params, opt_state, xi)
        if i != 2:
            grads = jax.grad(lambda p, xi=xi: ((xi @ p["w"]) ** 2).mean())(ref_params)
            updates, ref_state = reference_tx.update(grads, ref_state, ref_params)
            ref_params = optax.apply_updates(ref_params, updates)
    assert "clip_by_global_norm" in inner_src  # the page shows clipping, inside the wrapper
    np.testing.assert_allclose(np.asarray(params["w"]), np.asarray(ref_params["w"]),
                               rtol=1e-6, atol=0)


def test_flax_nnx_recipe_equals_an_unscaled_nnx_run():
    nnx = pytest.importorskip("flax.nnx")

    class Linear(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(3, 4, rngs=rngs)
            self.l2 = nnx.Linear(4, 1, rngs=rngs)

        def __call__(self, x):
            return self.l2(nnx.relu(self.l1(x)))

    def make_tx():
        # no clipping here: clipping every step to norm 1 would hide a missed unscale
        return optax.sgd(0.01)

    def run(scaled: bool):
        model = Linear(nnx.Rngs(0))
        tx = loss_scaled(make_tx(), JaxGradScaler(2.0**10, growth_interval=2)) if scaled \
            else make_tx()
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

        @nnx.jit
        def scaled_step(model, optimizer, x):
            scaler = find_scaler(optimizer.opt_state)
            grads = nnx.grad(lambda m: scaler.scale(((m(x) - 1.0) ** 2).mean()))(model)
            optimizer.update(model, grads)

        @nnx.jit
        def plain_step(model, optimizer, x):
            optimizer.update(model, nnx.grad(lambda m: ((m(x) - 1.0) ** 2).mean())(model))

        for i in range(7):
            if scaled:
                scaled_step(model, optimizer, batch(i))
            elif i not in POISON:
                plain_step(model, optimizer, batch(i))
        return nnx.state(model, nnx.Param)

    assert_same_params(run(scaled=True), run(scaled=False))


@pytest.mark.parametrize("wrapper", ["loss_scaled", "loss_scaled_accumulate"])
def test_a_skipped_update_leaves_every_parameter_bit_as_it_was(wrapper):
    """A skipped step (and an accumulating micro-step) must leave the parameters as torch's
    skipped optimizer.step does: bit for bit, a -0.0 included. Zero updates would not:
    optax.apply_updates adds them, and -0.0 + 0.0 is +0.0."""
    from unifiedamp.backends.jax import loss_scaled_accumulate

    params = {"w": jnp.array([-0.0, 0.0, -1.5, jnp.inf]), "steps": jnp.array([3], jnp.int32)}
    scaler = JaxGradScaler(8.0)
    tx = (loss_scaled(optax.sgd(0.1), scaler) if wrapper == "loss_scaled"
          else loss_scaled_accumulate(optax.sgd(0.1), scaler, every_k=2))
    state = tx.init(params)
    kept = [[jnp.inf, 1.0, 1.0, 1.0]]  # skipped (loss_scaled), or a micro-step (accumulate)
    if wrapper == "loss_scaled_accumulate":
        kept.append([1.0, 1.0, 1.0, 1.0])  # the window's step, skipped: its sum holds the inf
    for w in kept:
        grads = {"w": jnp.array(w), "steps": jnp.zeros(1, jnp.int32)}
        updates, state = tx.update(grads, state, params)
        new = optax.apply_updates(params, updates)
        for key in params:
            assert np.asarray(new[key]).tobytes() == np.asarray(params[key]).tobytes(), key
