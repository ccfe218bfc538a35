"""The training runs of the cross-framework resume test (``unifiedamp port-state``): in each
framework a tiny linear model trains with its real optimizer and autodiff over a fixed
pattern of finite and overflowing batches, checkpoints its scaler in its own form after
``CHECKPOINT_AT`` steps, and resumes from a checkpoint of its form to finish the pattern.

torch runs torch's own GradScaler, paddle unifiedamp's paddle backend (paddle's own scaler
disables itself on CPU), keras Keras's own LossScaleOptimizer (TensorFlow backend), jax
unifiedamp's jax scaler with optax (it checkpoints the jmp fields), numpy unifiedamp's numpy
scaler with gradients written out. A framework is imported when its trainer is built.

Run as a script (``python -c`` with this folder on ``sys.path``, see :func:`main`) it does the
same in a process of its own: the keras session's test runs paddle's side there, since
paddle and TensorFlow cannot share a process.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from unifiedamp import spec
from unifiedamp.porting import load_file, port_state_file, save_file
from unifiedamp.spec import ScalerConfig, ScalerState

PATTERN = "FFIFFFFFIFFIIFFFF"  # F: finite gradients, I: an inf in the batch
CHECKPOINT_AT = 7  # after F F I F F F F: scale 1024 after a backoff and a growth, tracker 1,
# and a finite step next (an inf there would hide a tracker off by one)
INIT, INTERVAL = 1024.0, 3
PLAIN = ScalerConfig(INIT, growth_interval=INTERVAL)

# Each framework's own checkpoint (A side) and the form and file it resumes from (B side).
SAVES = {"torch": "a.pt", "paddle": "a.pdopt", "keras": "a.npz", "jax": "a.msgpack",
         "numpy": "a.json"}
RESUMES = {"torch": ("torch", "b.pt"), "paddle": ("paddle", "b.pdopt"),
           "keras": ("keras", "b.npz"), "jax": ("canonical", "b.msgpack"),
           "numpy": ("canonical", "b.json")}
#: The module each framework's run needs.
MODULES = {"torch": "torch", "paddle": "paddle", "keras": "tensorflow", "jax": "optax",
           "numpy": "numpy"}

X = (np.arange(8, dtype=np.float32).reshape(2, 4) - 3) / 8
Y = np.ones((2, 1), np.float32)
W0 = np.full((4, 1), 0.1, np.float32)


def batch(kind: str) -> np.ndarray:
    x = X.copy()
    if kind == "I":
        x[0, 0] = np.inf
    return x


class TorchRun:  # torch's own GradScaler
    def __init__(self):
        import torch

        self.torch = torch
        self.model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            self.model.weight.copy_(torch.from_numpy(W0.T))
            self.model.bias.zero_()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=INIT, growth_interval=INTERVAL)

    def step(self, kind):
        torch, scaler = self.torch, self.scaler
        self.opt.zero_grad()
        loss = ((self.model(torch.from_numpy(batch(kind))) - torch.from_numpy(Y)) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.step(self.opt)
        scaler.update()
        return scaler.get_scale(), scaler._get_growth_tracker(), 0

    def save(self, path):
        save_file({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                   "scaler": self.scaler.state_dict()}, path)

    def load(self, path):
        saved = load_file(path)
        self.scaler.load_state_dict(saved["scaler"] if "scaler" in saved else saved)


class PaddleRun:  # paddle's own scaler disables itself on CPU: unifiedamp's paddle backend
    def __init__(self):
        import paddle

        import unifiedamp as ua

        self.paddle = paddle
        self.model = paddle.nn.Linear(4, 1)
        self.model.weight.set_value(W0)
        self.model.bias.set_value(np.zeros(1, np.float32))
        self.opt = paddle.optimizer.SGD(0.01, parameters=self.model.parameters())
        self.scaler = ua.GradScaler(INIT, growth_interval=INTERVAL, backend="paddle",
                                    device="cpu")

    def step(self, kind):
        paddle, scaler = self.paddle, self.scaler
        loss = ((self.model(paddle.to_tensor(batch(kind))) - paddle.to_tensor(Y)) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.step(self.opt)
        scaler.update()
        self.opt.clear_grad()
        return tuple(scaler.state)

    def save(self, path):
        save_file({"model": self.model.state_dict(), "scaler": self.scaler.native_state_dict()},
                  path)

    def load(self, path):
        self.scaler.load_state_dict(load_file(path))


class KerasRun:  # Keras's own LossScaleOptimizer, TensorFlow backend
    def __init__(self):
        import keras
        import tensorflow as tf

        self.tf = tf
        self.model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        self.model.set_weights([W0, np.zeros(1, np.float32)])
        self.opt = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.01), initial_scale=INIT, dynamic_growth_steps=INTERVAL)
        self.opt.build(self.model.trainable_variables)

    def step(self, kind):
        tf, opt, variables = self.tf, self.opt, self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((self.model(batch(kind)) - Y) ** 2)
            scaled = opt.scale_loss(loss)
        opt.apply(tape.gradient(scaled, variables), variables)
        return float(opt.dynamic_scale.numpy()), int(opt.step_counter.numpy()), 0

    def save(self, path):
        save_file({"dynamic_scale": self.opt.dynamic_scale.numpy(),
                   "step_counter": self.opt.step_counter.numpy()}, path)

    def load(self, path):
        saved = load_file(path)
        assert int(saved["hysteresis_counter"]) == 0
        self.opt.dynamic_scale.assign(saved["dynamic_scale"])
        self.opt.step_counter.assign(int(saved["step_counter"]))


class JaxRun:  # unifiedamp's jax scaler with optax; checkpoints the jmp fields
    def __init__(self):
        import jax
        import jax.numpy as jnp
        import optax

        import unifiedamp as ua

        self.jax, self.jnp, self.optax = jax, jnp, optax
        self.params = {"w": jnp.asarray(W0), "b": jnp.zeros(1)}
        self.tx = optax.sgd(0.01)
        self.opt_state = self.tx.init(self.params)
        self.scaler = ua.GradScaler(INIT, growth_interval=INTERVAL, backend="jax")

    def step(self, kind):
        jax, jnp, scaler = self.jax, self.jnp, self.scaler

        def loss_fn(p, x):
            return jnp.mean((x @ p["w"] + p["b"] - Y) ** 2)

        x = jnp.asarray(batch(kind))
        grads = jax.grad(lambda p: scaler.scale(loss_fn(p, x)))(self.params)
        grads, finite = scaler.unscale(grads)
        self.scaler = scaler.update(finite)
        if bool(finite):
            updates, self.opt_state = self.tx.update(grads, self.opt_state)
            self.params = self.optax.apply_updates(self.params, updates)
        return tuple(self.scaler.state)

    def save(self, path):
        st = self.scaler.state
        save_file({"params": self.params, "loss_scale": np.float32(st.scale),
                   "counter": np.int32(st.growth_tracker), "period": INTERVAL, "factor": 2.0,
                   "min_loss_scale": 0.0}, path)

    def load(self, path):
        self.scaler = self.scaler.restore(load_file(path))


class NumpyRun:  # unifiedamp's numpy scaler, gradients by hand
    def __init__(self):
        import unifiedamp as ua
        from unifiedamp.backends.numpy import SGD

        self.w = W0.copy()
        self.opt = SGD([self.w], lr=0.01)
        self.scaler = ua.GradScaler(INIT, growth_interval=INTERVAL, backend="numpy")

    def step(self, kind):
        x, scaler = batch(kind), self.scaler
        with np.errstate(all="ignore"):
            loss_grad = scaler.scale(np.float32(1.0)) * 2 * (x @ self.w - Y) / len(x)
            self.opt.grads = [(x.T @ loss_grad).astype(np.float32)]
        scaler.step(self.opt)
        scaler.update()
        return tuple(scaler.state)

    def save(self, path):
        save_file({"w": self.w.tolist(), "scaler": self.scaler.state_dict()}, path)

    def load(self, path):
        self.scaler.load_state_dict(load_file(path))


RUNS = {"torch": TorchRun, "paddle": PaddleRun, "keras": KerasRun, "jax": JaxRun,
        "numpy": NumpyRun}


def states(raw) -> list[tuple[str, int, int]]:
    """(scale as float32 hex, growth tracker, hysteresis tracker) per step."""
    return [(spec.f32_hex(float(s)), int(g), int(h)) for s, g, h in raw]


def expected() -> list[tuple[str, int, int]]:
    """The spec's states over PATTERN, as :func:`states` writes them."""
    state, out = ScalerState.initial(PLAIN), []
    for kind in PATTERN:
        state = spec.update(PLAIN, state, kind == "I")
        out.append((spec.f32_hex(state.scale), state.growth_tracker, 0))
    return out


def uninterrupted(fw: str, folder: str | os.PathLike) -> list[tuple[str, int, int]]:
    """``fw``'s whole run, checkpointing in its own form (``SAVES[fw]``) after AT steps."""
    run, trajectory = RUNS[fw](), []
    for i, kind in enumerate(PATTERN):
        trajectory.append(run.step(kind))
        if i + 1 == CHECKPOINT_AT:
            run.save(os.path.join(folder, SAVES[fw]))
    return states(trajectory)


def resumed(fw: str, path: str | os.PathLike) -> list[tuple[str, int, int]]:
    """``fw`` resumed from ``path`` (its form), finishing the pattern."""
    run = RUNS[fw]()
    run.load(path)
    return states([run.step(kind) for kind in PATTERN[CHECKPOINT_AT:]])


def port(moves) -> None:
    """``port_state_file`` for each (to, src, dst)."""
    for to, src, dst in moves:
        # Keras's variables carry no config: the one its optimizer was built with.
        port_state_file(src, dst, to=to, config=PLAIN)


def first_difference(got, want) -> str | None:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            return f"step {CHECKPOINT_AT + i + 1}: resumed {a}, uninterrupted {b}"
    return None


def main(argv: list[str]) -> None:
    """Runs a JSON list of commands, ``["run", fw, folder]``, ``["port", moves]`` or
    ``["resume", fw, path]``, in order; prints a JSON list of their results."""
    out = []
    for command, *args in json.loads(argv[0]):
        out.append({"run": uninterrupted, "port": port, "resume": resumed}[command](*args))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
