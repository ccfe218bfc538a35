"""Praxis: dynamic loss scaling as a Praxis ``ShardedGradientTransformation``.

Praxis optimizers are ``ShardedGradientTransformation``\\ s: optax's ``init`` and
``update`` plus ``init_partition_spec``, which describes every optimizer-state leaf with
a ``WeightHParams`` (shape, dtype, sharding) so that PaxML can shard, checkpoint and
restore the state. :func:`loss_scaled` wraps one: the scaler's leaves are scalars,
described as unsharded, and the inner transformation keeps its own descriptions.

The state holds the scaler's arrays as a dict (``scaler.tree()``), not the
:class:`~unifiedamp.backends.jax.JaxGradScaler` itself: PaxML's checkpointer names
each array of the state from its dicts, NamedTuples and lists, and would see a scaler
as one leaf where its pytree has six. Read the scaler with the transformation's
``scaler(opt_state)``.

One scaler per model: Praxis's repeat-prefix vectorization (what PaxML's ``Learner``
applies to a stacked layer's variables) maps the optimizer over each layer of the stack
with ``jax.vmap``; a scaler inside it would be one scaler per layer, skipping only the
layer whose gradients overflowed. Wrap the vectorized transformation instead (as
:class:`unifiedamp.backends.jax.paxml.LossScaledLearner` does); ``init`` and ``update``
refuse to run directly under ``jax.vmap`` (for one scaler per member of a vmapped
ensemble, vmap :func:`unifiedamp.backends.jax.loss_scaled`).

Runs on Praxis 1.4.0 in its own environment (``tools/praxis_env.sh``,
``docs/backends/praxis.md``). Importing this module imports Praxis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from praxis import base_layer, optimizers

from unifiedamp.backends.jax import JaxGradScaler, LossScaledState
from unifiedamp.backends.jax import loss_scaled as _optax_loss_scaled
from unifiedamp.backends.jax._compat import is_vmapped

__all__ = ["LossScaledShardedTransformation", "loss_scaled", "scaler_weight_hparams"]


@dataclasses.dataclass(frozen=True)
class LossScaledShardedTransformation(optimizers.ShardedGradientTransformation):
    """What :func:`loss_scaled` returns: a Praxis ``ShardedGradientTransformation``
    (``init``, ``update``, ``init_partition_spec``), plus ``scaler``.

    Attributes:
        scaler: ``scaler(opt_state)``: the :class:`~unifiedamp.backends.jax.JaxGradScaler`
            held in ``opt_state`` (one of this transformation's states), e.g. to scale the
            loss: ``tx.scaler(opt_state).scale(loss)``; traceable.
    """

    scaler: Callable[[Any], JaxGradScaler]


def loss_scaled(inner: Any, scaler: JaxGradScaler, *,
                axis_name: Any = None) -> LossScaledShardedTransformation:
    """Wraps a Praxis ``ShardedGradientTransformation`` with dynamic loss scaling.

    ``update`` takes the gradients of the *scaled* loss, unscales them, checks them,
    and either applies ``inner`` or, if any was inf/NaN, returns updates of -0.0 and keeps
    ``inner``'s state as it was; then it updates the scaler (the spec's rule, as
    :func:`unifiedamp.backends.jax.loss_scaled`). The state is
    ``LossScaledState(scaler.tree(), inner_state)``: the scaler's arrays as a dict, which
    PaxML's checkpointer names; ``tx.scaler(opt_state)`` gives the scaler back.

    Args:
        inner: A Praxis ``ShardedGradientTransformation``: an optimizer's
            ``get_grad_transformation()``, ``sharded_chain(...)``, or the output of
            Praxis's repeat-prefix vectorization. Put clipping inside: it must see
            the unscaled gradients.
        scaler: The initial :class:`~unifiedamp.backends.jax.JaxGradScaler`.
        axis_name: Inside ``shard_map``/``pmap``, the axis whose devices must agree
            (``()``: the gradients already agree); under ``jax.jit`` on global arrays,
            as PaxML runs, leave it ``None``.

    Returns:
        A :class:`LossScaledShardedTransformation` whose ``init_partition_spec`` returns
        ``LossScaledState(scaler_weight_hparams(scaler), inner.init_partition_spec(...))``.

    Raises:
        TypeError: ``inner`` is not a ``ShardedGradientTransformation`` (an optax one:
            use :func:`unifiedamp.backends.jax.loss_scaled`), or ``scaler`` is not a
            ``JaxGradScaler``.
        ValueError: (from ``init`` or ``update``) called directly under ``jax.vmap``, as
            Praxis's repeat-prefix vectorization calls it: one scaler per stacked layer.

    Example:
        >>> import jax.numpy as jnp
        >>> from praxis import base_layer, optimizers, pax_fiddle, schedules
        >>> from unifiedamp.backends.jax import JaxGradScaler
        >>> sgd = pax_fiddle.build(pax_fiddle.Config(
        ...     optimizers.ShardedSgd, learning_rate=0.1,
        ...     lr_schedule=pax_fiddle.Config(schedules.Constant)))
        >>> tx = loss_scaled(sgd.get_grad_transformation(), JaxGradScaler(8.0, growth_interval=1))
        >>> params = {"w": jnp.ones(2)}
        >>> specs = tx.init_partition_spec({"w": base_layer.WeightHParams(shape=[2])})
        >>> specs.scaler["loss_scale"].shape, specs.scaler["loss_scale"].tensor_split_dims_mapping
        ([], [])
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": jnp.array([8.0, jnp.inf])}, state, params)
        >>> updates["w"], tx.scaler(state).get_scale()
        (Array([-0., -0.], dtype=float32), 4.0)
    """
    if not isinstance(inner, optimizers.ShardedGradientTransformation):
        raise TypeError(
            f"inner must be a Praxis ShardedGradientTransformation (an optimizer's "
            f"get_grad_transformation(), sharded_chain(...)), got {type(inner).__name__}; "
            f"for an optax transformation use unifiedamp.backends.jax.loss_scaled")
    if not isinstance(scaler, JaxGradScaler):
        raise TypeError(f"scaler must be a unifiedamp.backends.jax.JaxGradScaler, got "
                        f"{type(scaler).__name__}: build one with "
                        f"unifiedamp.GradScaler(..., backend='jax')")
    tx = _optax_loss_scaled(inner, scaler, axis_name=axis_name)

    def held(state: LossScaledState) -> JaxGradScaler:
        return _held_scaler(scaler, state)

    def init(params: Any) -> LossScaledState:
        _refuse_vmap(params)
        return LossScaledState(scaler.tree(), tx.init(params).inner_state)

    def update(updates: Any, state: LossScaledState, params: Any = None,
               **extra_args: Any) -> tuple[Any, LossScaledState]:
        current = held(state)
        _refuse_vmap(current)
        new_updates, new = tx.update(updates, LossScaledState(current, state.inner_state),
                                     params, **extra_args)
        return new_updates, LossScaledState(new.scaler.tree(), new.inner_state)

    def init_partition_spec(var_hparams: Any) -> LossScaledState:
        return LossScaledState(scaler_weight_hparams(scaler),
                               inner.init_partition_spec(var_hparams))

    return LossScaledShardedTransformation(init=init, update=update,
                                           init_partition_spec=init_partition_spec,
                                           scaler=held)


def _held_scaler(scaler: JaxGradScaler, state: Any) -> JaxGradScaler:
    """``scaler``'s config with the arrays ``state`` holds (a :func:`loss_scaled` state:
    ``LossScaledState(scaler.tree(), inner_state)``).

    Raises:
        TypeError: ``state`` is not such a state.
    """
    if not isinstance(state, LossScaledState) or not isinstance(state.scaler, dict):
        raise TypeError(f"expected the LossScaledState this transformation's init returns "
                        f"(a LossScaledLearner's: get_grad_tx(...).init), got "
                        f"{type(state).__name__}")
    return scaler.with_tree(state.scaler)


def scaler_weight_hparams(scaler: JaxGradScaler) -> dict[str, Any]:
    """A Praxis ``WeightHParams`` for each array of ``scaler.tree()``: a scalar of the
    array's dtype, not sharded (every device holds the one scale), no initializer (the
    value comes from ``init``).

    Example:
        >>> from unifiedamp.backends.jax import JaxGradScaler
        >>> hparams = scaler_weight_hparams(JaxGradScaler())
        >>> hparams["growth_tracker"].shape, hparams["growth_tracker"].dtype
        ([], dtype('int32'))
    """
    def describe(leaf: Any) -> base_layer.WeightHParams:
        leaf = jnp.asarray(leaf)
        return base_layer.WeightHParams(shape=list(leaf.shape), init=None, dtype=leaf.dtype,
                                        collections=None, tensor_split_dims_mapping=[])

    return {name: describe(leaf) for name, leaf in scaler.tree().items()}


def _refuse_vmap(tree: Any) -> None:
    if any(is_vmapped(leaf) for leaf in jax.tree.leaves(tree)):
        raise ValueError(
            "a loss-scaled transformation inside jax.vmap: Praxis's repeat-prefix "
            "vectorization (PaxML's Learner with vectorize_on_repeat_prefix=True, the "
            "default) maps the optimizer over each layer of a stacked layer, so there "
            "would be one scaler per layer, and an inf in one layer would skip and back "
            "off that layer only. Wrap the vectorized transformation instead: "
            "unifiedamp.backends.jax.paxml.LossScaledLearner in place of PaxML's Learner, or "
            "loss_scaled(praxis.optimizer_prefix_vectorization."
            "get_transformations_with_vectorized_repeat_prefix(tx, var_hparams), scaler)")
