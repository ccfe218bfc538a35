"""A JAX scaler that an eager update, restore or setter replaced refuses the verbs, so torch's
line ``scaler.update(finite)`` (result dropped) fails loudly instead of never backing off;
traced code (jit, lax.cond, the optax wrapper, NNX) is unaffected. MLX: tests/mlx."""

from __future__ import annotations

import pytest
from superseded_checks import FIX, SupersededContract

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax import lax  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp.backends.jax import find_scaler, loss_scaled  # noqa: E402

OVERFLOW = [jnp.array([1.0, jnp.inf])]


class TestJaxSuperseded(SupersededContract):
    backend, class_name = "jax", "JaxGradScaler"

    def loss(self):
        return jnp.float32(1.0)

    def overflow(self):
        return OVERFLOW


def test_a_disabled_scaler_returns_itself_and_stays_usable():
    s = ua.GradScaler(8.0, enabled=False, backend="jax")
    assert s.update(False) is s
    s.unscale(OVERFLOW)


def test_jit_passes_values_so_the_scaler_given_to_a_step_stays_usable():
    # jit flattens the scaler to arrays: the object passed in is never replaced, and the same
    # scaler can be passed again (e.g. to retry a step). A step's result must be kept as for
    # any jitted function (docs/backends/jax.md): a dropped one cannot be seen.
    @jax.jit
    def step(s, g):
        g, f = s.unscale(g)
        return s.update(f)

    s = ua.GradScaler(8.0, backend="jax")
    first, again = step(s, OVERFLOW), step(s, OVERFLOW)
    assert first.get_scale() == again.get_scale() == 4.0
    assert s.update(True).get_scale() == 8.0


def test_traced_branches_may_update_the_same_scaler():
    # lax.cond traces both branches over one closed-over scaler: traced calls mark nothing.
    s = ua.GradScaler(8.0, backend="jax")

    @jax.jit
    def step(f):
        return lax.cond(f, lambda: s.update(True), lambda: s.update(False))

    assert step(jnp.array(False)).get_scale() == 4.0
    # Eagerly, with a concrete flag, the branches still run traced: s is not replaced.
    assert lax.cond(jnp.array(True), lambda: s.update(True),
                    lambda: s.update(False)).get_scale() == 8.0
    assert s.update(False).get_scale() == 4.0


def test_optax_wrapper_eagerly_keeps_its_trajectory_and_refuses_a_stale_state():
    tx = loss_scaled(optax.sgd(0.1), ua.GradScaler(1024.0, backend="jax"))
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    stale = state
    for grad in ([1.0, jnp.inf], [1.0, 1.0], [jnp.nan, 1.0]):
        scaled = find_scaler(state).scale(jnp.array(grad))
        updates, state = tx.update({"w": scaled}, state, params)
        params = optax.apply_updates(params, updates)
    scaler = find_scaler(state)
    assert (scaler.get_scale(), scaler.num_skipped_steps, scaler.num_steps) == (256.0, 2, 3)
    assert params["w"].tolist() == pytest.approx([0.9, 0.9])
    with pytest.raises(RuntimeError, match=FIX):  # a state the loop already moved past
        tx.update({"w": jnp.ones(2)}, stale, params)


def test_nnx_optimizer_eagerly_and_jitted():
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, loss_scaled(optax.sgd(0.1), ua.GradScaler(
        1024.0, backend="jax")), wrt=nnx.Param)

    def step(model, optimizer, x):
        scaler = find_scaler(optimizer.opt_state)
        grads = nnx.grad(lambda m: scaler.scale(m(x).sum()))(model)
        optimizer.update(model, grads)

    inf = jnp.array([[jnp.inf, 1.0]])
    step(model, optimizer, inf)  # eager
    nnx.jit(step)(model, optimizer, inf)
    step(model, optimizer, jnp.ones((1, 2)))
    scaler = find_scaler(optimizer.opt_state)
    assert (scaler.get_scale(), scaler.num_skipped_steps, scaler.num_steps) == (256.0, 2, 3)
