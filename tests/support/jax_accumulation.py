"""The micro-batches, model and training loop that tests/jax/test_jax_accumulation.py and
tests/cross/test_jax_accumulation.py (its comparison with torch) both run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from unifiedamp.backends.jax import find_scaler

K, MICRO = 4, 16  # 16 micro-batches, an optimizer step every 4
BAD = 5  # the micro-batch (0-based) whose data holds an inf: window 1 is skipped


def batch(i, bad=BAD):
    x = np.arange(24, dtype=np.float32).reshape(8, 3) / 24.0 + i / 16.0
    if i == bad:
        x[0, 0] = np.inf
    return x


def loss(params, x):
    return ((x @ params["w"] + params["b"] - 1.0) ** 2).mean()


def init_params():
    return {"w": jnp.full(3, 0.5), "b": jnp.zeros(())}


def train(tx, divide, micro=MICRO, bad=BAD):
    """Runs ``tx`` on the micro-batches, each loss divided by ``divide`` and scaled by the
    scaler in the state; returns the parameters, the state and the scale after each call."""
    params = init_params()
    state = tx.init(params)

    @jax.jit
    def step(params, state, x):
        scaler = find_scaler(state)
        grads = jax.grad(lambda p: scaler.scale(loss(p, x) / divide))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    scales = []
    for i in range(micro):
        params, state = step(params, state, jnp.asarray(batch(i, bad)))
        scales.append(find_scaler(state).get_scale())
    return params, state, scales


def bits(values):
    return [int(np.float32(v).view(np.uint32)) for v in values]
