"""The Apple MLX backend: the scaler as an immutable value over ``mlx.core`` arrays.

Same verbs as the JAX backend: ``scale(tree)``, ``unscale(grads) -> (grads,
finite)``, ``update(finite) -> scaler``. Nothing waits for the device: the
skip is a ``mx.where`` over parameters and optimizer state (:meth:`apply`).
``mx.compile`` takes trees of arrays, so a compiled step passes the scaler as
``scaler.tree()`` and rebuilds it with ``scaler.with_tree(tree)``.
MLX computes float32 subnormals on the CPU (measured with mlx 0.32 on Linux),
so the update is a plain float32 multiply.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from unifiedamp.backends._functional import FunctionalGradScaler

__all__ = ["MlxGradScaler", "all_finite", "where_finite"]


def all_finite(tree: Any) -> mx.array:
    """True (a 0-d bool array) when every element of every leaf is finite.

    Example:
        >>> import mlx.core as mx
        >>> all_finite({"a": mx.array([1.0, float("nan")])}).item()
        False
    """
    finite = mx.array(True)
    for _, leaf in tree_flatten(tree):
        finite = finite & mx.isfinite(mx.sum(leaf * 0))  # NaN as soon as one is inf/NaN
    return finite


def where_finite(finite: mx.array, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old``, leaf by leaf."""
    return tree_map(lambda n, o: mx.where(finite, n, o), new, old)


class MlxGradScaler(FunctionalGradScaler):
    """A dynamic loss scaler for MLX, as an immutable value.

    Attributes:
        loss_scale: float32 0-d array.
        growth_tracker: int32 0-d array.
        hysteresis_tracker: int32 0-d array.

    Example:
        >>> import mlx.core as mx
        >>> import unifiedamp as ua
        >>> scaler = ua.GradScaler(1024.0, growth_interval=1, backend="mlx")
        >>> grads = mx.grad(lambda w: scaler.scale((w ** 2).sum()))(mx.ones(2))
        >>> grads, finite = scaler.unscale(grads)
        >>> grads.tolist(), scaler.update(finite).get_scale()
        ([2.0, 2.0], 2048.0)
    """

    backend = "mlx"
    xp = mx

    @classmethod
    def _array(cls, value: Any, dtype: Any) -> mx.array:
        return mx.array(value, dtype=dtype)

    def _host(self, array: Any, cast: Any) -> Any:
        # MLX has no tracer type to test: inside mx.compile, reading a value raises
        # ValueError ("Attempting to eval an array during function transformations").
        try:
            return cast(array.item())
        except ValueError:
            return array

    def __repr__(self) -> str:
        # Python numbers (it reads the device), as this backend has always printed itself.
        return f"{type(self).__name__}({self.state}, {self._config})"

    # ------------------------------------------------------------ the verbs

    def scale(self, tree: Any) -> Any:
        """Multiplies every leaf by the scale; each keeps its dtype."""
        if not self._config.enabled:
            return tree
        return tree_map(lambda x: (x * self.loss_scale).astype(x.dtype), tree)

    def unscale(self, grads: Any) -> tuple[Any, mx.array]:
        """``(grads / scale, all finite)``; finiteness is decided on the scaled gradients,
        and is false at a scale whose reciprocal overflows (``spec.unscale_overflows``)."""
        if not self._config.enabled:
            return grads, mx.array(True)
        inv = mx.array(1.0, dtype=mx.float32) / self.loss_scale
        finite = all_finite(grads) & mx.isfinite(inv)
        return tree_map(lambda g: (g * inv).astype(g.dtype), grads), finite

    def apply(self, optimizer: Any, model: Any, grads: Any, finite: mx.array) -> None:
        """``optimizer.update(model, grads)``, undone where not ``finite``: parameters and
        optimizer state (moments, step) stay as they were, with no host sync."""
        if not getattr(optimizer, "_initialized", True):
            optimizer.init(model.trainable_parameters())
        # A copy of the containers (arrays are immutable): update() mutates the dict.
        old_params, old_state = model.trainable_parameters(), tree_map(lambda x: x,
                                                                       optimizer.state)
        optimizer.update(model, grads)
        model.update(where_finite(finite, model.trainable_parameters(), old_params))
        # In place: mx.compile tracks the optimizer's own state dict.
        optimizer.state.update(where_finite(finite, optimizer.state, old_state))

    # ------------------------------------------------------------ tooling

    @classmethod
    def devices(cls) -> list[str]:
        return [str(mx.default_device())]
