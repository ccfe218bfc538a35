"""The process of ``unifiedamp demo`` that trains the demo's model in one framework.

``python -m unifiedamp.cli._demo_train NAME STEPS`` trains in framework NAME (one trainer
per framework, ``_train_<name>``) with :data:`unifiedamp.cli.demo.CONFIG` and its forced
overflows, and prints one JSON line per step (:class:`_Emitter`). Every framework gets the
same initial parameters and batches (:func:`_data`). The parent,
:mod:`unifiedamp.cli.demo`, runs one such process per framework: some frameworks cannot
share a process (tensorflow then paddle segfaults).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, Literal

from unifiedamp import spec
from unifiedamp.cli.demo import CONFIG, forced_overflow

_LR = 0.05
_BATCH, _INPUTS, _HIDDEN = 16, 8, 24  # 8*24 + 24 + 24 + 1 = 241 parameters


def _data(steps: int) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """Initial parameters (float32) and one batch per step, the same in every framework."""
    import numpy as np

    rng = np.random.default_rng(0)
    params = [(rng.normal(size=(_INPUTS, _HIDDEN)) * 0.3).astype(np.float32),
              np.zeros(_HIDDEN, np.float32),
              (rng.normal(size=(_HIDDEN, 1)) * 0.3).astype(np.float32),
              np.zeros(1, np.float32)]
    target = rng.normal(size=(_INPUTS, 1)).astype(np.float32)
    batches = []
    for step in range(1, steps + 1):
        x = rng.normal(size=(_BATCH, _INPUTS)).astype(np.float32)
        y = np.tanh(x @ target)
        if forced_overflow(step):
            x[0] = np.inf  # one bad sample: its NaN reaches the loss and every gradient
        batches.append((x, y))
    return params, batches


#: The dtype the demo's models compute in.
Dtype = Literal["float16", "float32"]


def _float16_or_32(forward: Callable[[Dtype], Any]) -> Dtype:
    """``"float16"`` when the framework computes ``forward`` in float16 on this device,
    else ``"float32"`` (a CPU build may lack half-precision kernels)."""
    try:
        forward("float16")
        return "float16"
    except Exception:  # noqa: BLE001 - whatever the framework raises for a missing kernel
        return "float32"


def _changed(before: list[Any], after: list[Any]) -> bool:
    import numpy as np

    return any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def _train_numpy(steps: int, emit: _Emitter) -> None:
    import numpy as np

    import unifiedamp as ua
    from unifiedamp.backends.numpy import SGD

    init, batches = _data(steps)
    params = [p.copy() for p in init]
    opt = SGD(params, lr=_LR)
    scaler = ua.GradScaler(**CONFIG, backend="numpy", history=steps)
    emit.header("cpu", "float16")
    for x, y in batches:
        w1, b1, w2, b2 = (p.astype(np.float16) for p in params)
        # NumPy has no autodiff: the MLP's backward pass by hand, in float16, of the
        # scaled loss (the upstream gradient carries the scale, as autodiff's would).
        with np.errstate(all="ignore"):
            h = np.tanh(x.astype(np.float16) @ w1 + b1)
            out = (h @ w2 + b2).astype(np.float32)
            loss = float(np.mean((out - y) ** 2))
            d_out = (2 * (out - y) / len(y) * scaler.get_scale()).astype(np.float16)
            d_h = (d_out @ w2.T) * (1 - h * h)
            opt.grads = [x.astype(np.float16).T @ d_h, d_h.sum(0), h.T @ d_out, d_out.sum(0)]
        before = [p.copy() for p in params]
        scaler.step(opt)
        scaler.update()
        emit(scaler.state, not _changed(before, params), loss)
    emit.history(scaler.history())


def _train_torch(steps: int, emit: _Emitter) -> None:
    import torch

    import unifiedamp as ua

    device = "cuda" if torch.cuda.is_available() else "cpu"
    init, batches = _data(steps)
    params = [torch.nn.Parameter(torch.tensor(p, device=device)) for p in init]
    opt = torch.optim.SGD(params, lr=_LR)
    scaler = ua.GradScaler(**CONFIG, device=device, backend="torch", history=steps)

    def forward(dtype: Dtype, x: Any) -> Any:
        dt = getattr(torch, dtype)
        w1, b1, w2, b2 = (p.to(dt) for p in params)  # float32 parameters, cast for compute
        return (torch.tanh(x.to(dt) @ w1 + b1) @ w2 + b2).float()

    x0 = torch.tensor(batches[0][0], device=device)
    dtype = _float16_or_32(lambda dt: forward(dt, x0))
    emit.header(device, dtype)
    for x, y in batches:
        x, y = torch.tensor(x, device=device), torch.tensor(y, device=device)
        loss = ((forward(dtype, x) - y) ** 2).mean()
        scaler.scale(loss).backward()
        before = [p.detach().cpu().numpy().copy() for p in params]
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        emit(scaler.state, not _changed(before, [p.detach().cpu().numpy() for p in params]),
             loss.item())
    emit.history(scaler.history())


def _train_paddle(steps: int, emit: _Emitter) -> None:
    import paddle

    import unifiedamp as ua

    gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    paddle.set_device("gpu" if gpu else "cpu")
    init, batches = _data(steps)
    params = [paddle.create_parameter(list(p.shape), "float32",
                                      default_initializer=paddle.nn.initializer.Assign(p))
              for p in init]
    opt = paddle.optimizer.SGD(learning_rate=_LR, parameters=params)
    scaler = ua.GradScaler(**CONFIG, backend="paddle", history=steps)

    def forward(dtype: Dtype, x: Any) -> Any:
        w1, b1, w2, b2 = (p.astype(dtype) for p in params)
        return (paddle.tanh(x.astype(dtype) @ w1 + b1) @ w2 + b2).astype("float32")

    dtype = _float16_or_32(lambda dt: forward(dt, paddle.to_tensor(batches[0][0])).numpy())
    emit.header("gpu" if gpu else "cpu", dtype)
    for x, y in batches:
        loss = ((forward(dtype, paddle.to_tensor(x)) - paddle.to_tensor(y)) ** 2).mean()
        scaler.scale(loss).backward()
        before = [p.numpy().copy() for p in params]
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        emit(scaler.state, not _changed(before, [p.numpy() for p in params]), float(loss))
    emit.history(scaler.history())


def _train_keras(steps: int, emit: _Emitter) -> None:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
    import tensorflow as tf

    import unifiedamp as ua

    init, batches = _data(steps)
    # Keras's mixed policy: float32 variables, float16 compute.
    model = keras.Sequential([keras.Input((_INPUTS,)),
                              keras.layers.Dense(_HIDDEN, "tanh", dtype="mixed_float16"),
                              keras.layers.Dense(1, dtype="mixed_float16")])
    model.set_weights(init)
    scaler = ua.GradScaler(**CONFIG, backend="keras", history=steps)
    opt = scaler.wrap(keras.optimizers.SGD(_LR))
    opt.build(model.trainable_variables)

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((keras.ops.cast(model(x), "float32") - y) ** 2)
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)  # unscales, skips on inf/NaN, updates
        return loss

    emit.header("gpu" if tf.config.list_physical_devices("GPU") else "cpu",
                "float16")
    for x, y in batches:
        before = model.get_weights()
        loss = train_step(x, y)
        emit(scaler.state, not _changed(before, model.get_weights()), float(loss))
    emit.history(scaler.history())


def _train_jax(steps: int, emit: _Emitter) -> None:
    import jax
    import jax.numpy as jnp
    import optax

    import unifiedamp as ua
    from unifiedamp.backends.jax import history_init, history_record, scale_history, step_if_finite

    init, batches = _data(steps)
    params = [jnp.asarray(p) for p in init]  # on jax's default device: the GPU when there is one
    tx = optax.sgd(_LR)
    opt_state = tx.init(params)
    scaler = ua.GradScaler(**CONFIG, backend="jax")

    def loss_fn(params: list[Any], x: Any, y: Any) -> Any:
        w1, b1, w2, b2 = (p.astype(jnp.float16) for p in params)
        out = (jnp.tanh(x.astype(jnp.float16) @ w1 + b1) @ w2 + b2).astype(jnp.float32)
        return jnp.mean((out - y) ** 2)

    @jax.jit
    def step(params: Any, opt_state: Any, scaler: Any, history: Any, x: Any, y: Any) -> Any:
        grads, loss = jax.grad(lambda p: (scaler.scale(loss_fn(p, x, y)), loss_fn(p, x, y)),
                               has_aux=True)(params)
        grads, finite = scaler.unscale(grads)

        def apply(state: Any) -> Any:
            params, opt_state = state
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        params, opt_state = step_if_finite(finite, apply, (params, opt_state))
        history = history_record(history, scaler, finite)  # the ring stays on the device
        return params, opt_state, scaler.update(finite), history, loss

    emit.header(jax.devices()[0].platform, "float16")
    history = history_init(steps)
    for x, y in batches:
        before = params
        params, opt_state, scaler, history, loss = step(params, opt_state, scaler, history, x, y)
        emit(scaler.state, not _changed(before, params), float(loss))
    emit.history(scale_history(history))


def _train_mlx(steps: int, emit: _Emitter) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    import unifiedamp as ua
    from unifiedamp.backends.mlx import history_init, history_record, scale_history

    init, batches = _data(steps)

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1, self.b1, self.w2, self.b2 = (mx.array(p) for p in init)

        def __call__(self, x: Any) -> Any:
            w1, b1, w2, b2 = (p.astype(mx.float16) for p in (self.w1, self.b1, self.w2, self.b2))
            return (mx.tanh(x.astype(mx.float16) @ w1 + b1) @ w2 + b2).astype(mx.float32)

    model = MLP()
    opt = optim.SGD(learning_rate=_LR)
    opt.init(model.trainable_parameters())
    scaler = ua.GradScaler(**CONFIG, backend="mlx")
    emit.header(str(mx.default_device()).split("(")[-1].split(",")[0].lower(),
                "float16")

    def scaled_loss(model: MLP, x: Any, y: Any, scaler: Any) -> Any:
        return scaler.scale(mx.mean((model(x) - y) ** 2))

    loss_and_grad = nn.value_and_grad(model, scaled_loss)
    history = history_init(steps)
    for x, y in batches:
        scaled, grads = loss_and_grad(model, mx.array(x), mx.array(y), scaler)
        grads, finite = scaler.unscale(grads)
        before = [mx.array(p) for p in (model.w1, model.b1, model.w2, model.b2)]
        scaler.apply(opt, model, grads, finite)
        loss = scaled / scaler.get_scale()
        history = history_record(history, scaler, finite)
        scaler = scaler.update(finite)
        after = [model.w1, model.b1, model.w2, model.b2]
        mx.eval(after, opt.state, loss, history)
        emit(scaler.state, not _changed(before, after), loss.item())
    emit.history(scale_history(history))


_TRAINERS = {"numpy": _train_numpy, "torch": _train_torch, "paddle": _train_paddle,
             "keras": _train_keras, "jax": _train_jax, "mlx": _train_mlx}


class _Emitter:
    """Prints the child's JSON lines: a header, then one line per step (its number from 1,
    the state its update left), flushed at once so that the parent's progress moves."""

    def __init__(self) -> None:
        self.step = 1

    def _print(self, obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    def header(self, device: str, dtype: str) -> None:
        self._print({"device": device, "dtype": dtype})

    def history(self, history: Any) -> None:
        """The scaler's own history ring (``history()``): checked against the records."""
        self._print({"history": history.as_list()})

    def __call__(self, state: spec.ScalerState, skipped: bool, loss: float) -> None:
        self._print({"step": self.step, "scale": state.scale,
                     "scale_hex": spec.f32_hex(state.scale),
                     "growth_tracker": int(state.growth_tracker),
                     "hysteresis_tracker": int(state.hysteresis_tracker),
                     "skipped": bool(skipped), "loss": loss if math.isfinite(loss) else None})
        self.step += 1


def _child(name: str, steps: int) -> None:
    _TRAINERS[name](steps, _Emitter())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("python -m unifiedamp.cli._demo_train is the demo's child process; "
                 "run: unifiedamp demo")
    _child(sys.argv[1], int(sys.argv[2]))
