"""The optax wrappers: :func:`loss_scaled` (check and skip per update) and
:func:`loss_scaled_accumulate` (torch's accumulation recipe), their states, and
:func:`find_scaler`/:func:`replace_scaler` to reach the scaler inside an optimizer state.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from unifiedamp.backends.jax._compat import cond_varying
from unifiedamp.backends.jax._scaler import JaxGradScaler, _all_finite
from unifiedamp.errors import MissingBackendError


def _no_updates(shapes: Any) -> Any:
    """Updates that leave every parameter's bits as they are: -0.0 for a float leaf
    (``p + -0.0`` is ``p``, a -0.0 included, where ``p + 0.0`` makes it +0.0), 0 otherwise."""
    def nothing(s: Any) -> jax.Array:
        floating = jnp.issubdtype(s.dtype, jnp.inexact)
        return jnp.full(s.shape, -0.0 if floating else 0, s.dtype)

    return jax.tree.map(nothing, shapes)


class LossScaledState(NamedTuple):
    """The state of :func:`loss_scaled`: the scaler (its scale scales the loss) and the
    inner transformation's state. In a Praxis or PaxML state
    (:mod:`unifiedamp.backends.jax.praxis`), ``scaler`` holds the scaler's arrays as a dict
    (``scaler.tree()``), which PaxML's checkpointer can name."""

    scaler: JaxGradScaler | dict[str, Any]
    inner_state: Any


def loss_scaled(inner: Any, scaler: JaxGradScaler, *, axis_name: Any = None) -> Any:
    """Wraps an optax transformation with dynamic loss scaling.

    ``update`` takes the gradients of the *scaled* loss, unscales them, checks
    them, and either applies ``inner`` or, if any was inf/NaN, returns updates of
    -0.0 (``optax.apply_updates`` then leaves every parameter's bits as they were, a
    -0.0 included, which adding +0.0 would flip) and keeps ``inner``'s state as it
    was; then it updates the scaler.
    Read the scaler to scale the loss with :func:`find_scaler` (works through
    ``optax.chain`` and ``optax.MultiSteps``). For gradient accumulation, wrap
    ``optax.MultiSteps`` (``loss_scaled(optax.MultiSteps(inner, k), scaler)``): each
    micro-batch is checked and an inf is dropped before it reaches the accumulator,
    which optax (0.2.8) never clears of an inf once it holds one.

    Args:
        inner: Any optax ``GradientTransformation``.
        scaler: The initial :class:`JaxGradScaler`.
        axis_name: Inside ``shard_map``/``pmap``, the axis whose devices must agree
            (``()``: the gradients already agree; see :func:`all_finite`).

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is a
        :class:`LossScaledState`. For Praxis and PaxML, which need a
        ``ShardedGradientTransformation``, use :func:`unifiedamp.backends.jax.praxis.loss_scaled`.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> tx = loss_scaled(optax.sgd(0.1), JaxGradScaler(8.0, growth_interval=1))
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> scaled = {"w": jnp.array([8.0, jnp.inf])}          # gradients of scale(loss)
        >>> updates, state = tx.update(scaled, state, params)
        >>> updates["w"], find_scaler(state).get_scale()
        (Array([-0., -0.], dtype=float32), 4.0)
    """

    optax = _import_optax("loss_scaled")

    # optax's own adapter: passes extra args to transformations that take them.
    inner_tx = optax.with_extra_args_support(inner)

    def init(params: Any) -> LossScaledState:
        return LossScaledState(scaler, inner_tx.init(params))

    def update(updates: Any, state: LossScaledState, params: Any = None,
               **extra_args: Any) -> tuple[Any, LossScaledState]:
        scaler = state.scaler
        if not isinstance(scaler, JaxGradScaler):
            raise TypeError(f"state.scaler is a {type(scaler).__name__}, not a JaxGradScaler: "
                            f"a Praxis state; update it with the transformation that made it, "
                            f"unifiedamp.backends.jax.praxis.loss_scaled")
        finite = (_all_finite(updates, axis_name, "loss_scaled") & scaler._reciprocal_finite()
                  if scaler.is_enabled() else jnp.array(True))

        def apply() -> tuple[Any, Any]:
            # Unscaling inside the branch lets XLA fuse it into the inner update. Its flag
            # is unused (the one above decided): axis_name=() adds no collective, no warning.
            grads = scaler.unscale(updates, axis_name=())[0]
            return inner_tx.update(grads, state.inner_state, params, **extra_args)

        def skip() -> tuple[Any, Any]:
            return _no_updates(jax.eval_shape(apply)[0]), state.inner_state

        new_updates, new_inner = cond_varying(finite, apply, skip)
        return new_updates, LossScaledState(scaler.update(finite), new_inner)

    return optax.GradientTransformationExtraArgs(init, update)


class LossScaledAccumulateState(NamedTuple):
    """The state of :func:`loss_scaled_accumulate`.

    Attributes:
        scaler: The scaler (read it with :func:`find_scaler` to scale each micro-batch's
            loss); updated once per window.
        mini_step: The micro-batches summed so far in this window, an int32 0-d array
            (0 to ``every_k - 1``).
        acc_grads: The running sum of this window's *scaled* gradients, the parameters'
            structure and dtypes.
        inner_state: The inner transformation's state.
    """

    scaler: JaxGradScaler
    mini_step: Any
    acc_grads: Any
    inner_state: Any


def loss_scaled_accumulate(inner: Any, scaler: JaxGradScaler, every_k: int, *,
                           axis_name: Any = None) -> Any:
    """Gradient accumulation with dynamic loss scaling, step for step as torch does it.

    torch's recipe calls ``scaler.scale(loss / k).backward()`` on every micro-batch
    (the scaled gradients add up in ``.grad``) and, once every ``k`` micro-batches,
    ``scaler.step(optimizer)`` (unscale the sum; skip the whole window if it holds an
    inf/NaN) and ``scaler.update()``. This transformation does the same: each
    ``update`` adds the gradients of the scaled loss to a running sum and returns
    updates of -0.0 (which leave every parameter's bits as they are, see
    :func:`loss_scaled`); every ``every_k``-th call unscales the sum, applies ``inner`` to it
    or, if it is not finite, returns updates of -0.0 and keeps ``inner``'s state, then
    updates the scaler exactly once and clears the sum. The scale therefore grows
    and backs off per optimizer step, as in torch, not per micro-batch as with
    ``loss_scaled(optax.MultiSteps(inner, k), scaler)``, which drops a bad micro-batch
    and steps on the others.

    The sum is a sum, as in torch: divide each micro-batch's loss by ``every_k``
    for the mean (``optax.MultiSteps`` averages instead). Checked and unscaled once
    per window with the scaler's ``unscale``, so a scale whose reciprocal overflows
    counts as inf, as the spec says. Pure and jit-safe: two ``lax.cond``, no host
    transfer; the scaler is in the state, where :func:`find_scaler` finds it.

    Args:
        inner: Any optax ``GradientTransformation``; it sees the unscaled sum.
        scaler: The initial :class:`JaxGradScaler`.
        every_k: Micro-batches per optimizer step, an int >= 1.
        axis_name: Inside ``shard_map``/``pmap``, the axis whose devices must agree
            (``()``: the gradients already agree; see :func:`all_finite`).

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is a
        :class:`LossScaledAccumulateState`.

    Raises:
        TypeError: ``every_k`` is not an int.
        ValueError: ``every_k`` is below 1.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = loss_scaled_accumulate(optax.sgd(0.1), JaxGradScaler(8.0, growth_interval=1),
        ...                             every_k=2)
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> for scaled in ([8.0, 16.0], [8.0, 0.0], [8.0, jnp.inf], [8.0, 0.0]):
        ...     updates, state = tx.update({"w": jnp.array(scaled)}, state, params)
        ...     print(updates["w"], find_scaler(state).get_scale())
        [-0. -0.] 8.0
        [-0.2 -0.2] 16.0
        [-0. -0.] 16.0
        [-0. -0.] 8.0
    """
    if not isinstance(every_k, (int, numbers.Integral)) or isinstance(every_k, bool):
        raise TypeError(f"every_k must be an int >= 1 (micro-batches per optimizer step), "
                        f"got {every_k!r} of type {type(every_k).__name__}")
    if every_k < 1:
        raise ValueError(f"every_k must be an int >= 1 (micro-batches per optimizer step), "
                         f"got {every_k}; use 1 for no accumulation")
    optax = _import_optax("loss_scaled_accumulate")

    inner_tx = optax.with_extra_args_support(inner)

    def init(params: Any) -> LossScaledAccumulateState:
        return LossScaledAccumulateState(scaler, jnp.zeros((), jnp.int32),
                                         jax.tree.map(jnp.zeros_like, params),
                                         inner_tx.init(params))

    def update(updates: Any, state: LossScaledAccumulateState, params: Any = None,
               **extra_args: Any) -> tuple[Any, LossScaledAccumulateState]:
        acc = jax.tree.map(lambda a, g: (a + g).astype(a.dtype), state.acc_grads, updates)

        def apply(grads: Any) -> tuple[Any, Any]:
            return inner_tx.update(grads, state.inner_state, params, **extra_args)

        out_shape = jax.eval_shape(apply, acc)

        def step(_: Any) -> tuple[Any, ...]:
            grads, finite = state.scaler._unscale(acc, axis_name, "loss_scaled_accumulate")
            new_updates, new_inner = cond_varying(
                finite, lambda: apply(grads), lambda: (_no_updates(out_shape[0]),
                                                       state.inner_state))
            cleared = jax.tree.map(jnp.zeros_like, acc)
            return (new_updates, new_inner, state.scaler.update(finite), cleared,
                    jnp.zeros((), jnp.int32))

        def accumulate(_: Any) -> tuple[Any, ...]:
            return (_no_updates(out_shape[0]), state.inner_state, state.scaler, acc,
                    state.mini_step + 1)

        new_updates, new_inner, new_scaler, new_acc, mini_step = cond_varying(
            state.mini_step >= every_k - 1, lambda: step(None), lambda: accumulate(None))
        return new_updates, LossScaledAccumulateState(new_scaler, mini_step, new_acc,
                                                      new_inner)

    return optax.GradientTransformationExtraArgs(init, update)


def _import_optax(caller: str) -> Any:
    # optax is the jax extra's, not jax's: the scaler works without it, these wrappers not.
    try:
        import optax
    except ImportError as exc:
        raise MissingBackendError(
            f"{caller} needs optax, which cannot be imported ({exc}); install it with: "
            "pip install 'unifiedamp[jax]'") from exc
    return optax


def find_scaler(opt_state: Any) -> JaxGradScaler:
    """The scaler inside an optimizer state (also within chain, MultiSteps, flax nnx).

    Raises:
        ValueError: There is none (the transformation was not built with :func:`loss_scaled`),
            or only a Praxis state's arrays (read those with ``tx.scaler(opt_state)``).
    """
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(
        x, JaxGradScaler)) if isinstance(x, JaxGradScaler)]
    if not found:
        states = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, LossScaledState))
        if any(isinstance(x, LossScaledState) and isinstance(x.scaler, dict) for x in states):
            raise ValueError("this optimizer state keeps the scaler's arrays as a dict (a "
                             "Praxis or PaxML one: unifiedamp.backends.jax.praxis): read the "
                             "scaler with tx.scaler(opt_state) or learner.scaler(opt_state)")
        raise ValueError("no JaxGradScaler in this optimizer state: build the optimizer with "
                         "unifiedamp.backends.jax.loss_scaled(inner, scaler) or "
                         "loss_scaled_accumulate(inner, scaler, every_k)")
    return found[0]


def replace_scaler(opt_state: Any, scaler: JaxGradScaler) -> Any:
    """The optimizer state with its scaler replaced (within chain, MultiSteps...), e.g. by
    one restored from a checkpoint: ``opt_state = replace_scaler(opt_state, restored)``.

    Raises:
        ValueError: There is no scaler to replace (see :func:`find_scaler`).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = optax.chain(optax.clip(1.0), loss_scaled(optax.sgd(0.1), JaxGradScaler()))
        >>> state = tx.init({"w": jnp.ones(2)})
        >>> restored = JaxGradScaler().restore(JaxGradScaler(8.0).state_dict())
        >>> find_scaler(replace_scaler(state, restored)).get_scale()
        8.0
    """
    find_scaler(opt_state)  # the same error when there is none
    is_scaler = lambda x: isinstance(x, JaxGradScaler)  # noqa: E731
    return jax.tree.map(lambda x: scaler if is_scaler(x) else x, opt_state, is_leaf=is_scaler)
