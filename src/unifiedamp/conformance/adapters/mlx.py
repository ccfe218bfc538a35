"""How the conformance suite drives the MLX backend: nn.value_and_grad, mlx Adam."""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from unifiedamp.conformance.interface import STEP_KINDS, FunctionalAdapter
from unifiedamp.spec import ScalerConfig


def make_model() -> nn.Linear:
    model = nn.Linear(4, 1)
    model.update({"weight": mx.full((1, 4), 0.1), "bias": mx.full((1,), 0.1)})
    return model


def inputs(kind: str) -> mx.array:
    x = np.full((2, 4), 0.5, np.float32)
    x[0, 1] = STEP_KINDS[kind]
    return mx.array(x)


def train_step(scaler: Any, groups: list[Any], xs: list[mx.array]) -> Any:
    """Each (model, optimizer) skips on its own gradients; the scale sees any inf."""
    finites = []
    for (model, optimizer), x in zip(groups, xs, strict=True):
        # |loss| < 1 and its gradient do not depend on the parameters: a finite
        # step stays finite at every float32 scale.
        grad_fn = nn.value_and_grad(model, lambda m, x: scaler.scale(m(x).sum() * 2.0**-4))
        _, grads = grad_fn(model, x)
        grads, finite = scaler.unscale(grads)
        scaler.apply(optimizer, model, grads, finite)
        finites.append(finite)
    return scaler.update(mx.all(mx.stack(finites)))


class MlxAdapter(FunctionalAdapter):
    """Handles are ``(scaler, [(model, optimizer), ...])``; models and optimizers are
    updated in place, the scaler is new at every step."""

    capabilities = frozenset({"multi_optimizer", "functional_unscale", "scale_tree",
                              "set_config", "disable", "state_dict", "jit"})
    dtypes = ("float16", "float32")  # MLX has no float64 on the GPU path

    def __init__(self, scaler_cls: Any):
        self.scaler_cls, self.name = scaler_cls, "mlx"

    def info(self) -> dict[str, Any]:
        # mlx.core's stubs leave out __version__.
        return {"framework": "mlx", "version": mx.__version__,  # type: ignore[attr-defined]
                "device": str(mx.default_device())}

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        groups = [(make_model(), optim.Adam(1e-3)) for _ in range(optimizers)]
        for model, optimizer in groups:
            # MLX builds optimizer state on the first update, skipped or not: built here,
            # a skipped first step shows as one that changed nothing.
            optimizer.init(model.trainable_parameters())
        return self.scaler_cls(**config.to_dict()), groups

    def iterate(self, handle: Any, kinds: str) -> Any:
        scaler, groups = handle
        scaler = train_step(scaler, groups, [inputs(k) for k in kinds])
        mx.eval(scaler.tree())
        return scaler, groups

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        """The whole step, every group, under ``mx.compile`` with the model and optimizer
        state as implicit inputs and outputs."""
        scaler, groups = handle
        for model, optimizer in groups:
            optimizer.init(model.trainable_parameters())
        state = [[m.state, o.state] for m, o in groups]

        def step(tree: Any, *xs: mx.array) -> Any:
            return train_step(scaler.with_tree(tree), groups, list(xs)).tree()

        compiled = mx.compile(step, inputs=state, outputs=state)
        tree = compiled(scaler.tree(), *[inputs(k) for k in kinds])
        mx.eval(tree, state)
        return scaler.with_tree(tree), groups

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        out = []
        for model, optimizer in handle[1]:
            pairs = cast("list[tuple[str, Any]]", tree_flatten(model.trainable_parameters()))
            for _, v in pairs + cast("list[tuple[str, Any]]", tree_flatten(optimizer.state)):
                out.append(np.array(v))
        return out

    def scale_tree(self, handle: Any, tree: Any) -> Any:
        return tree_map(np.array, handle[0].scale(tree_map(mx.array, tree)))

    def unscale_tree(self, handle: Any, tree: Any) -> tuple[Any, bool]:
        out, finite = handle[0].unscale(tree_map(mx.array, tree))
        return tree_map(np.array, out), bool(finite.item())
