"""One training step, written once, that trains on NumPy, PyTorch, Paddle, JAX and MLX.

``train_step`` below names no framework, tests no type and catches nothing: it uses
only the protocol every unifiedamp scaler shares (``scale``, ``unscale``,
``where_finite``, ``update``) and the array operators every framework has. What
differs per framework is outside it, in ``FRAMEWORKS``: how to make arrays, how to
take a gradient (NumPy has no autodiff: the model's gradient is written by hand),
and how to compile the step (``jax.jit``, ``unifiedamp.backends.mlx.compile``).

Run it to train a small linear model with forced overflows (an inf in the batch) on
one framework, printing the scale and skip decision of every step::

    python examples/agnostic_step.py torch
    python examples/agnostic_step.py torch --device cuda
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

import unifiedamp as ua

LEARNING_RATE = 0.05
STEPS = 12
#: Steps whose batch holds an inf: their gradients overflow and the step is skipped.
OVERFLOW_AT = (3, 4, 9)


def loss_fn(params, x, y):
    """Mean squared error of a linear model: operators only, so any array type works."""
    w, b = params
    return ((x @ w + b - y) ** 2).mean()


def train_step(scaler, params, x, y, grad_fn):
    """One mixed-precision step, the same on every framework.

    ``grad_fn(scaler, params, x, y)`` returns ``(loss, gradients of scaler.scale(loss))``.
    """
    loss, grads = grad_fn(scaler, params, x, y)
    grads, finite = scaler.unscale(grads)
    stepped = [p - LEARNING_RATE * g for p, g in zip(params, grads, strict=True)]
    params = scaler.where_finite(finite, stepped, params)
    scaler = scaler.update(finite)
    return scaler, params, loss


# ---------------------------------------------------------------- per framework


def numpy_setup(device=None):
    def grad_fn(scaler, params, x, y):
        w, b = params
        with np.errstate(invalid="ignore", over="ignore"):  # the forced overflows
            residual = x @ w + b - y
            grads = [2.0 * x.T @ residual / len(x), 2.0 * residual.mean(keepdims=True)]
        return loss_fn(params, x, y), scaler.scale([g.astype(np.float32) for g in grads])

    return np.asarray, np.asarray, grad_fn, train_step


def torch_setup(device=None):
    import torch

    def grad_fn(scaler, params, x, y):
        leaves = [p.detach().requires_grad_() for p in params]
        loss = loss_fn(leaves, x, y)
        return loss.detach(), list(torch.autograd.grad(scaler.scale(loss), leaves))

    def array(a):
        return torch.as_tensor(a, device=device)

    return array, lambda t: t.cpu().numpy(), grad_fn, train_step


def paddle_setup(device=None):
    import paddle

    def grad_fn(scaler, params, x, y):
        leaves = [p.detach() for p in params]
        for leaf in leaves:
            leaf.stop_gradient = False
        loss = loss_fn(leaves, x, y)
        return loss.detach(), paddle.grad(scaler.scale(loss), leaves)

    return paddle.to_tensor, lambda t: t.numpy(), grad_fn, train_step


def jax_setup(device=None):
    import jax
    import jax.numpy as jnp

    def grad_fn(scaler, params, x, y):
        loss, grads = jax.value_and_grad(lambda p: scaler.scale(loss_fn(p, x, y)))(params)
        return loss, grads

    step = jax.jit(train_step, static_argnames="grad_fn")
    return jnp.asarray, np.asarray, grad_fn, step


def mlx_setup(device=None):
    import mlx.core as mx

    from unifiedamp.backends.mlx import compile as compile_step

    def grad_fn(scaler, params, x, y):
        return mx.value_and_grad(lambda p: scaler.scale(loss_fn(p, x, y)))(params)

    def step(scaler, params, x, y, grad_fn):
        return compiled(scaler, params, x, y)

    compiled = compile_step(lambda scaler, params, x, y: train_step(scaler, params, x, y,
                                                                     grad_fn))
    return mx.array, np.asarray, grad_fn, step


FRAMEWORKS = {"numpy": numpy_setup, "torch": torch_setup, "paddle": paddle_setup,
              "jax": jax_setup, "mlx": mlx_setup}


def train(framework: str, steps: int = STEPS, device: str | None = None) -> list[dict[str, Any]]:
    """Trains the model on ``framework`` (torch: on ``device``); one record per step: the
    scale after the update (float32, as a float), whether the step was skipped, whether
    the parameters changed; then the counters and the trained parameters."""
    array, to_numpy, grad_fn, step = FRAMEWORKS[framework](device)
    rng = np.random.default_rng(0)
    x_all = rng.normal(size=(steps, 8, 3)).astype(np.float32)
    y_all = (x_all @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3)[..., None]
    for k in OVERFLOW_AT:
        x_all[k - 1, 0, 0] = np.inf
    params = [array(np.zeros((3, 1), np.float32)), array(np.zeros((1,), np.float32))]
    scaler = ua.GradScaler(2.0**10, growth_interval=3, backend=framework)
    records: list[dict[str, Any]] = []
    for k in range(steps):
        before = [to_numpy(p).copy() for p in params]
        scaler, params, _ = step(scaler, params, array(x_all[k]), array(y_all[k]),
                                 grad_fn=grad_fn)
        changed = any(not np.array_equal(to_numpy(p), b)
                      for p, b in zip(params, before, strict=True))
        records.append({"step": k + 1, "scale": float(np.float32(scaler.get_scale())),
                        "skipped": bool(scaler.last_step_skipped), "changed": changed})
    final = [to_numpy(p).ravel().tolist() for p in params]
    records.append({"num_steps": int(scaler.num_steps),
                    "num_skipped_steps": int(scaler.num_skipped_steps), "params": final})
    return records


if __name__ == "__main__":
    assert __doc__ is not None  # the docstring above
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("frameworks", nargs="*", default=["numpy"], choices=list(FRAMEWORKS))
    parser.add_argument("--device", help="torch's device (e.g. cuda)")
    args = parser.parse_args()
    for framework in args.frameworks:
        for record in train(framework, device=args.device):
            print(json.dumps({"framework": framework, **record}))
