"""The jitted train steps docs/backends/jax.md teaches, for an MLP of float32 parameters with
float16 compute and an optax transformation: ``tests/jax/test_compiled_program.py`` compiles
them for a small MLP and holds their kernels, ``benchmarks/bench_jax.py`` times and counts
them for a large one.

Every step takes the batch last, ``(..., x, y)``: the optax steps ``(params, opt_state,
[scaler,] x, y)``, the Flax NNX one ``(state, x, y)`` on ``nnx.split``'s state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from unifiedamp.backends.jax import find_scaler, step_if_finite, where_finite


def init_mlp(key: jax.Array, sizes: Sequence[int]) -> list[dict[str, jax.Array]]:
    """The MLP's parameters: a weight and a bias per layer, float32."""
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        params.append({"w": jax.random.normal(sub, (n_in, n_out)) / n_in**0.5,
                       "b": jnp.zeros(n_out)})
    return params


def loss_fn(params: list[dict[str, jax.Array]], x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error of the MLP (ReLU between layers) computed in float16: what loss
    scaling is for."""
    for i, layer in enumerate(params):
        x = x.astype(jnp.float16) @ layer["w"].astype(jnp.float16) + layer["b"]
        if i < len(params) - 1:
            x = jax.nn.relu(x)
    return jnp.mean((x.astype(jnp.float32) - y) ** 2)


def plain(tx: Any) -> Callable[..., Any]:
    """No scaler: ``(params, opt_state, x, y) -> (params, opt_state)``."""
    def step(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        grads = jax.grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step


def recipe(tx: Any) -> Callable[..., Any]:
    """docs/backends/jax.md, A jitted train step (step_if_finite; the product unscaled in
    the step): ``(params, opt_state, scaler, x, y) -> (params, opt_state, scaler)``."""
    def step(params: Any, opt_state: Any, scaler: Any, x: Any, y: Any) -> Any:
        grads = jax.grad(lambda p: scaler.scale(loss_fn(p, x, y)))(params)
        finite = scaler.unscale(grads)[1]

        def apply(state: Any) -> Any:
            params, opt_state = state
            updates, opt_state = tx.update(scaler.unscale(grads)[0], opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        return (*step_if_finite(finite, apply, (params, opt_state)), scaler.update(finite))

    return step


def selected(tx: Any) -> Callable[..., Any]:
    """where_finite over the parameters and the optimizer state: ``(params, opt_state,
    scaler, x, y) -> (params, opt_state, scaler)``."""
    def step(params: Any, opt_state: Any, scaler: Any, x: Any, y: Any) -> Any:
        grads = jax.grad(lambda p: scaler.scale(loss_fn(p, x, y)))(params)
        grads, finite = scaler.unscale(grads)
        updates, new_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        return (where_finite(finite, new_params, params),
                where_finite(finite, new_state, opt_state), scaler.update(finite))

    return step


def wrapped(scaled_tx: Any) -> Callable[..., Any]:
    """``loss_scaled(tx, scaler)``'s step, the scaler in the optimizer state: ``(params,
    opt_state, x, y) -> (params, opt_state)``."""
    def step(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        scaler = find_scaler(opt_state)
        grads = jax.grad(lambda p: scaler.scale(loss_fn(p, x, y)))(params)
        updates, opt_state = scaled_tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step


def nnx_step(sizes: Sequence[int], tx: Any) -> tuple[Callable[..., Any], Any, Any]:
    """The same MLP as Flax NNX modules with ``nnx.Optimizer(model, tx)`` (docs/backends/jax.md,
    Flax NNX; ``tx`` plain or ``loss_scaled``): ``(step, state, params)``, the step
    ``(state, x, y) -> state`` on ``nnx.split((model, optimizer))``'s state, through
    ``nnx.merge``, so that it is one ``jax.jit`` whose state can be donated."""
    from flax import nnx

    from unifiedamp.backends.jax import LossScaledState

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.layers = nnx.List([
                nnx.Linear(n_in, n_out, dtype=jnp.float16, param_dtype=jnp.float32, rngs=rngs)
                for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True)])

        def __call__(self, x: jax.Array) -> jax.Array:
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = nnx.relu(x)
            return x

    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    scaled = isinstance(optimizer.opt_state, LossScaledState)

    def step(state: Any, x: Any, y: Any) -> Any:
        model, optimizer = nnx.merge(graphdef, state)
        scale = find_scaler(optimizer.opt_state).scale if scaled else (lambda v: v)
        grads = nnx.grad(lambda m: scale(((m(x).astype(jnp.float32) - y) ** 2).mean()))(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer))

    return step, state, nnx.state(model, nnx.Param)
