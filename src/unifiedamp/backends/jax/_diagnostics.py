"""The JAX backend's diagnostics: :func:`overflow_counts` inside the jitted step, and the
shared report, history ring and collapse check
(:mod:`unifiedamp.backends._functional_diagnostics`) bound to JAX's trees.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from unifiedamp.backends._functional_diagnostics import (
    LeafCounts,
    Words,
    leaf_counts,
    public_functions,
)
from unifiedamp.backends.jax._compat import cond_varying
from unifiedamp.backends.jax._scaler import JaxGradScaler

#: The public module these functions belong to.
PUBLIC = "unifiedamp.backends.jax"


def overflow_counts(grads: Any, when: Any = None) -> Any:
    """Per-gradient inf/NaN counts, traceable: the gradients' tree with a :class:`LeafCounts`
    ``(inf, nan, max_finite, shape)`` of arrays where each gradient was.

    ``inf`` and ``nan`` are int32 0-d counts (exact up to 2**31 - 1 elements a leaf),
    ``max_finite`` the float32 largest finite magnitude, ``shape`` the gradient's shape as
    an int32 array (a constant). Return the tree from the jitted step and read it outside
    with :func:`overflow_report`, which names the leaves by key path.

    Cost: one pass over each gradient (a variadic reduce XLA fuses with its inputs;
    leaves that are not floats count nothing), less than :func:`all_finite` on XLA's CPU
    (figures in ``docs/diagnostics.md``). To pay it only on skipped steps, pass
    ``when=~finite``: the counts are then computed under a ``lax.cond`` (zeros, with the
    shapes, where ``when`` is false), i.e. ``lax.cond(~finite, lambda:
    overflow_counts(grads), lambda: <zeros>)``. On a GPU, XLA may read a ``lax.cond``'s
    predicate on the host (see ``docs/backends/jax.md``): there counting on every step may
    be the cheaper form.

    Args:
        grads: A tree of gradient arrays (dicts, lists, Flax NNX state, optax trees...).
        when: None (always count), or a Python bool / 0-d bool array: count where true.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from unifiedamp.backends.jax import JaxGradScaler, overflow_counts, overflow_report
        >>> def loss_fn(p, x):                 # float16 compute, float32 parameters
        ...     h = x.astype(jnp.float16) @ p["dense1"]["kernel"].astype(jnp.float16)
        ...     return jnp.sum(h @ p["dense2"]["kernel"].astype(jnp.float16)).astype(jnp.float32)
        >>> @jax.jit
        ... def step(params, scaler, x):
        ...     def scaled(p):                 # the unscaled loss as aux, for the report
        ...         loss = loss_fn(p, x)
        ...         return scaler.scale(loss), loss
        ...     (_, loss), grads = jax.value_and_grad(scaled, has_aux=True)(params)
        ...     grads, finite = scaler.unscale(grads)
        ...     counts = overflow_counts(grads, when=~finite)    # a lax.cond: free when finite
        ...     return scaler.update(finite), counts, loss, scaler.loss_scale
        >>> params = {"dense1": {"kernel": jnp.ones((2, 3))}, "dense2": {"kernel": jnp.ones(3)}}
        >>> scaler = JaxGradScaler(2.0**15)
        >>> scaler, counts, loss, scale = step(params, scaler, jnp.array([[1.0, 2.0]]))
        >>> print(overflow_report(counts, step=1, scale=scale, loss=loss))
        Step 1 was skipped at scale 32768: 2 of 2 gradients held inf/NaN.
          dense1.kernel (2, 3): 3 inf, 0 NaN, largest finite |g| 1
          dense2.kernel (3,): 3 inf, 0 NaN, largest finite |g| 0
        The loss was finite before scaling: the scaled gradients overflowed float16 and
        the scaler backs off, as designed.
    """
    def count() -> Any:
        return jax.tree.map(lambda g: leaf_counts(JaxGradScaler, jnp.asarray(g)), grads)

    if when is None:
        return count()

    def zeros() -> Any:
        return jax.tree.map(lambda g: LeafCounts(
            jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32),
            jnp.asarray(jnp.shape(g), jnp.int32)), grads)

    if isinstance(when, bool):
        return count() if when else zeros()
    dtype = getattr(when, "dtype", None)
    if dtype is None or jnp.dtype(dtype) != jnp.bool_ or jnp.shape(when) != ():
        raise TypeError(f"overflow_counts(grads, when=...) takes None, a bool or a 0-d bool "
                        f"array (e.g. ~finite), got {when!r}")
    return cond_varying(when, count, zeros)


def _path_name(path: Any) -> str:
    """A key path as a dotted name: ``params.dense1.kernel``, ``layers.0.bias``. A Flax NNX
    Variable's ``.value`` at the end is left out (``dense1.kernel``, not
    ``dense1.kernel.value``)."""
    keys = list(path)
    if keys and isinstance(keys[-1], jax.tree_util.GetAttrKey) and keys[-1].name == "value":
        keys.pop()
    parts = []
    for key in keys:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            parts.append(str(key.key))
        else:
            parts.append(str(key))
    return ".".join(parts) or "grads"


def _named_counts(counts: Any) -> list[tuple[str, Any]]:
    pairs = jax.tree_util.tree_flatten_with_path(
        counts, is_leaf=lambda x: isinstance(x, LeafCounts))[0]
    return [(_path_name(path), record) for path, record in pairs]


def _set_slot(ring: jax.Array, slot: jax.Array, value: jax.Array) -> jax.Array:
    return lax.dynamic_update_index_in_dim(ring, jnp.asarray(value, ring.dtype), slot, 0)


(overflow_report, history_init, history_record, scale_history, collapse_message,
 check_collapse) = public_functions(
    JaxGradScaler, module=PUBLIC, host=jax.device_get, named_counts=_named_counts,
    asarray=jnp.asarray, set_slot=_set_slot,
    words=Words(
        outside="outside ``jit``",
        naming="Gradients are named by key path, dotted (``params.dense1.kernel``, "
               "``layers.0.bias``; a Flax NNX state's ``.value`` left out), in tree order;",
        keep="keep in the train state (a pytree of its own buffers: donate it)",
        traced="traceable (a ``dynamic_update_slice`` per array, no host transfer)",
        module="jax.numpy", alias="jnp", int32="'int32'", float32="'float32'",
        bool_="'bool'"))
