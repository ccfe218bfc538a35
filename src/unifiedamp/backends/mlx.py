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
from mlx.utils import tree_map

from unifiedamp import spec
from unifiedamp._scaler import GradScaler
from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["MlxGradScaler", "all_finite", "where_finite"]


def all_finite(tree: Any) -> mx.array:
    """True (a 0-d bool array) when every element of every leaf is finite.

    Example:
        >>> import mlx.core as mx
        >>> all_finite({"a": mx.array([1.0, float("nan")])}).item()
        False
    """
    finite = mx.array(True)
    for leaf in _leaves(tree):
        finite = finite & mx.isfinite(mx.sum(leaf * 0))  # NaN as soon as one is inf/NaN
    return finite


def where_finite(finite: mx.array, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old``, leaf by leaf."""
    return tree_map(lambda n, o: mx.where(finite, n, o), new, old)


def _leaves(tree: Any) -> list[mx.array]:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


class MlxGradScaler(GradScaler):
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

    def __init__(self, *args: Any, **kwargs: Any):
        config = spec.config_from_args(args, kwargs, extra_names=("backend",))
        self._set(config, mx.array(ScalerState.initial(config).scale, dtype=mx.float32),
                  mx.array(0, dtype=mx.int32), mx.array(0, dtype=mx.int32))

    def _set(self, config: ScalerConfig, scale: Any, growth: Any, hyst: Any) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "loss_scale", scale)
        object.__setattr__(self, "growth_tracker", growth)
        object.__setattr__(self, "hysteresis_tracker", hyst)

    def _make(self, config: ScalerConfig, scale: Any, growth: Any, hyst: Any) -> MlxGradScaler:
        new = object.__new__(type(self))
        new._set(config, scale, growth, hyst)
        return new

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: update() and with_config() "
                             "return a new scaler")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.state}, {self._config})"

    def tree(self) -> dict[str, mx.array]:
        """The arrays, as a dict ``mx.compile`` takes."""
        return {"loss_scale": self.loss_scale, "growth_tracker": self.growth_tracker,
                "hysteresis_tracker": self.hysteresis_tracker}

    def with_tree(self, tree: dict[str, mx.array]) -> MlxGradScaler:
        """This scaler's config with the arrays of ``tree`` (from :meth:`tree`)."""
        return self._make(self._config, tree["loss_scale"], tree["growth_tracker"],
                          tree["hysteresis_tracker"])

    # ------------------------------------------------------------ config and state

    @property
    def config(self) -> ScalerConfig:
        return self._config

    @property
    def state(self) -> ScalerState:
        return ScalerState(float(self.loss_scale.item()), int(self.growth_tracker.item()),
                           int(self.hysteresis_tracker.item()))

    def is_enabled(self) -> bool:
        return self._config.enabled

    def get_scale(self) -> float:
        return float(self.loss_scale.item()) if self._config.enabled else 1.0

    def with_config(self, **changes: Any) -> MlxGradScaler:
        """Same state, some parameters changed (validated)."""
        return self._make(self._config.replace(**changes), self.loss_scale,
                          self.growth_tracker, self.hysteresis_tracker)

    def state_dict(self) -> dict[str, Any]:
        return spec.to_state_dict(self._config, self.state, self.backend)

    def load_state_dict(self, state_dict: dict[str, Any]) -> MlxGradScaler:
        """A new scaler from a canonical dict of any backend or a native torch/paddle dict
        (``enabled`` as ``self``); ``self`` is unchanged."""
        config, state = spec.parse_state_dict(state_dict, base=self._config)
        return self._make(config.replace(enabled=self._config.enabled),
                          mx.array(state.scale, dtype=mx.float32),
                          mx.array(state.growth_tracker, dtype=mx.int32),
                          mx.array(state.hysteresis_tracker, dtype=mx.int32))

    # ------------------------------------------------------------ the verbs

    def scale(self, tree: Any) -> Any:
        """Multiplies every leaf by the scale; each keeps its dtype."""
        if not self._config.enabled:
            return tree
        return tree_map(lambda x: (x * self.loss_scale).astype(x.dtype), tree)

    def unscale(self, grads: Any) -> tuple[Any, mx.array]:
        """``(grads / scale, all finite)``; finiteness is decided on the scaled gradients."""
        if not self._config.enabled:
            return grads, mx.array(True)
        inv = mx.array(1.0, dtype=mx.float32) / self.loss_scale
        return tree_map(lambda g: (g * inv).astype(g.dtype), grads), all_finite(grads)

    def update(self, finite: Any) -> MlxGradScaler:
        """The scaler after one iteration whose gradients were all ``finite`` (or not)."""
        config = self._config
        if not config.enabled:
            return self
        if not config.dynamic:
            zero = mx.zeros_like(self.growth_tracker)
            return self._make(config, self.loss_scale, zero, zero)
        inf = mx.logical_not(mx.array(finite).astype(mx.bool_))
        hyst = mx.where(inf, self.hysteresis_tracker + 1, 0).astype(mx.int32)
        growth = mx.where(inf, 0, self.growth_tracker + 1).astype(mx.int32)
        back_off = inf & (hyst >= config.hysteresis)
        grow = mx.logical_not(inf) & (growth >= config.growth_interval)
        scale = self.loss_scale
        backed = scale * mx.array(spec.f32(config.backoff_factor), dtype=mx.float32)
        if config.min_scale is not None:
            backed = mx.maximum(backed, mx.array(spec.f32(config.min_scale), dtype=mx.float32))
        grown = scale * mx.array(spec.f32(config.growth_factor), dtype=mx.float32)
        if config.max_scale is not None:
            grown = mx.minimum(grown, mx.array(spec.f32(config.max_scale), dtype=mx.float32))
        grown = mx.where(mx.isfinite(grown), grown, scale)
        return self._make(config, mx.where(back_off, backed, mx.where(grow, grown, scale)),
                          mx.where(grow, 0, growth).astype(mx.int32),
                          mx.where(back_off, 0, hyst).astype(mx.int32))

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

    @classmethod
    def conformance_adapter(cls) -> Any:
        """Drives this backend with real ``nn.value_and_grad`` and ``mlx.optimizers.Adam``."""
        from unifiedamp.backends._mlx_conformance import MlxAdapter

        return MlxAdapter(cls)
