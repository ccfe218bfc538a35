"""How the conformance suite drives the Paddle backend: real layers, optimizers and autograd."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from unifiedamp.conformance.adapters import STEP_KINDS, ImperativeAdapter, Problem

__all__ = ["PaddleAdapter", "make_problem"]

OPTIMIZERS = {
    "adam": lambda params: paddle.optimizer.Adam(learning_rate=1e-3, parameters=params),
    "adamw": lambda params: paddle.optimizer.AdamW(learning_rate=1e-3, parameters=params),
    "sgd": lambda params: paddle.optimizer.SGD(learning_rate=1e-2, parameters=params),
    "momentum": lambda params: paddle.optimizer.Momentum(learning_rate=1e-2, momentum=0.9,
                                                         parameters=params),
}


def make_problem(optimizer: str = "adam") -> tuple[Problem, paddle.nn.Layer]:
    """A ``paddle.nn.Linear(4, 1)`` and an optimizer; gradients from ``scale(loss).backward()``."""
    model = paddle.nn.Linear(4, 1)
    for param in model.parameters():
        param.set_value(paddle.full(param.shape, 0.1, dtype=param.dtype))
    opt = OPTIMIZERS[optimizer](model.parameters())

    def set_grads(kind: str, scaler: Any) -> None:
        opt.clear_grad(set_to_zero=False)
        x = np.full((2, 4), 0.5, np.float32)
        x[0, 1] = STEP_KINDS[kind]
        # |loss| < 1 and d(loss)/d(weight) = x.sum(0) / 16 do not depend on the
        # parameters, so a finite step stays finite at every float32 scale.
        loss = model(paddle.to_tensor(x)).sum() * 2.0**-4
        scaler.scale(loss).backward()

    def snapshot() -> list[np.ndarray]:
        # Parameters, then every optimizer tensor a step changes (moments, beta powers).
        out = [p.numpy().copy() for p in model.parameters()]
        state = opt.state_dict()
        out += [state[k].numpy().copy() for k in sorted(state)
                if isinstance(state[k], paddle.Tensor)]
        return out

    return Problem(opt, set_grads, snapshot), model


class PaddleAdapter(ImperativeAdapter):
    """Real ``paddle.nn.Linear`` + optimizer per problem; ``scale(loss).backward()`` each step.

    Args:
        scaler_cls: The Paddle backend's scaler class, or a subclass.
        optimizer: ``"adam"`` (default), ``"adamw"``, ``"sgd"`` or ``"momentum"``.
        device: ``"cpu"`` (default) or a GPU such as ``"gpu:0"``.

    Example:
        >>> from unifiedamp.backends.paddle import PaddleGradScaler
        >>> PaddleAdapter(PaddleGradScaler).name
        'paddle[adam,cpu]'
    """

    def __init__(self, scaler_cls: Any, optimizer: str = "adam", device: str = "cpu"):
        self.optimizer, self.device = optimizer, device
        capabilities = {"multi_optimizer", "inplace_unscale", "functional_unscale", "scale_tree",
                        "set_config", "disable", "state_dict"}

        def new_scaler(**config: Any) -> Any:
            paddle.set_device(device)
            return scaler_cls(**config, device=device)

        super().__init__(
            new_scaler,
            lambda: make_problem(optimizer)[0],
            name=f"paddle[{optimizer},{device}]",
            to_native=lambda a: paddle.to_tensor(a.copy()),
            to_numpy=lambda t: t.numpy(),
            capabilities=frozenset(capabilities),
            info={"framework": "paddle", "version": paddle.__version__, "device": device},
        )
        self.scaler_type = scaler_cls

    def unscale_tree(self, handle: Any, tree: Any) -> tuple[Any, bool]:
        out, finite = super().unscale_tree(handle, tree)
        return out, bool(finite)
