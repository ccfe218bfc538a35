"""What the ``tests/paddle/test_paddle_*.py`` files share: a small MLP and its batches, the
optimizers, snapshots of parameters and optimizer state, one training iteration, and the
native ``paddle.amp.GradScaler`` driven the one way it stays enabled on a CPU.

Imported only by the paddle session (it imports paddle).
"""

from __future__ import annotations

import warnings

import numpy as np
import paddle

import unifiedamp as ua

INF, NAN = float("inf"), float("nan")
F32_MAX = float(np.finfo(np.float32).max)


def scaler_of(*args, **kwargs):
    return ua.GradScaler(*args, backend="paddle", **kwargs)


def mlp(seed=0):
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(),
                                paddle.nn.Linear(16, 4))


def batch(seed=1, poison=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    y = rng.standard_normal((6, 4)).astype(np.float32)
    if poison is not None:
        x[0, 0] = poison
    return paddle.to_tensor(x), paddle.to_tensor(y)


def loss_of(model, x, y):
    return paddle.nn.functional.mse_loss(model(x), y)


def make_opt(name, params, grad_clip=None):
    o = paddle.optimizer
    return {
        "sgd": lambda: o.SGD(learning_rate=0.05, parameters=params, grad_clip=grad_clip),
        "momentum": lambda: o.Momentum(learning_rate=0.05, momentum=0.9, parameters=params,
                                       grad_clip=grad_clip),
        "adam": lambda: o.Adam(learning_rate=1e-2, parameters=params, grad_clip=grad_clip),
        "adamw": lambda: o.AdamW(learning_rate=1e-2, parameters=params, grad_clip=grad_clip),
    }[name]()


def snapshot(model, opt):
    """Parameters, then every tensor of the optimizer's state (moments, beta powers...)."""
    state = opt.state_dict()
    return ([p.numpy().copy() for p in model.parameters()]
            + [state[k].numpy().copy() for k in sorted(state)
               if isinstance(state[k], paddle.Tensor)])


def assert_same(a, b, what=""):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert np.array_equal(x, y), f"{what} tensor {i}"


def one_step(scaler, model, opt, seed=1, poison=None):
    scaler.scale(loss_of(model, *batch(seed, poison))).backward()
    retval = scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    return retval


def f32(x):
    return np.float32(x)


def paddle_scalar(value, dtype="float32"):
    return paddle.to_tensor(value, dtype=dtype)


def run_pattern(scaler, pattern, model=None, opt=None, start=0, check_scaled=True):
    """One iteration per letter (F finite, I inf, N nan); the scaler's state after each."""
    model = model or mlp()
    opt = opt or make_opt("sgd", model.parameters())
    states = []
    for i, kind in enumerate(pattern, start):
        poison = {"F": None, "I": INF, "N": NAN}[kind]
        loss = loss_of(model, *batch(seed=i))
        if poison is not None:
            loss = loss * poison
        scale_before = scaler.get_scale()
        scaled = scaler.scale(loss)
        if check_scaled and kind == "F":
            # the loss is multiplied by the current scale, as a float32 product
            assert scaled.numpy() == f32(loss.numpy()) * f32(scale_before), i
        scaled.backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        states.append(scaler.state)
    return states


def native_scale(native, loss):
    """The native scaler's ``scale()`` under ``auto_cast(float16)``, the one setting in which
    it stays enabled (auto_cast itself is a no-op on CPU that warns). Build the native
    scaler with the ``native_scaler`` fixture (tests/paddle/conftest.py)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="amp_guard can only be enabled")
        with paddle.amp.auto_cast(dtype="float16"):
            return native.scale(loss)
