"""The JAX internals this package relies on, in one place.

Supported: jax 0.7 and later (``pyproject.toml``), tested with the version in
``constraints.txt``. Four things here are not JAX's stable public API:

- ``jax.core.Tracer``, to tell a traced array (inside ``jit``, ``scan``, ``shard_map``)
  from a concrete one: :func:`is_tracer`.
- The manual mesh axes an array varies over inside a ``shard_map``, read from its abstract
  value: ``manual_axis_type.varying`` since jax 0.10, ``vma`` before (:func:`varying_axes`).
- The cast that makes an array varying over more axes: ``lax.pcast(x, axes,
  to="varying")`` since jax 0.9, ``lax.pvary(x, axes)`` before (:func:`cast_varying`).
- Whether the enclosing trace tracks varying axes at all: the ``check_vma`` config state
  that ``shard_map(check_vma=...)`` sets; ``pmap`` runs as a ``shard_map`` with
  ``check_vma=False`` since jax 0.8 (:func:`mapped_axes`).

No other module of the package uses them: a JAX release that changes one changes this file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax import lax


def is_tracer(array: Any) -> bool:
    """Whether ``array`` is a placeholder of a traced function, with no value to read."""
    return isinstance(array, jax.core.Tracer)


def varying_axes(x: Any) -> frozenset[Any]:
    """The manual mesh axes ``x`` (an array or ShapeDtypeStruct) varies over inside a
    ``shard_map``; empty elsewhere."""
    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()) or ())


def mapped_axes() -> tuple[tuple[Any, ...], bool]:
    """The mesh axes the enclosing ``shard_map`` or ``pmap`` maps over (``()`` outside
    one), and whether that trace tracks which of them each value varies over (a default
    ``shard_map``: :func:`varying_axes` is exact there; ``pmap`` and
    ``shard_map(check_vma=False)``: it reads ``()`` for every value)."""
    manual = tuple(getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()) or ())
    if not manual:
        return (), False
    from jax._src import config

    state = getattr(config, "_check_vma", getattr(config, "_check_rep", None))
    return manual, bool(state.value) if state is not None else False


def cast_varying(x: Any, axes: frozenset[Any]) -> Any:
    """``x`` typed as varying over ``axes`` (a type cast, no data moves)."""
    missing = tuple(a for a in axes if a not in varying_axes(x))
    if not missing:
        return x
    if hasattr(lax, "pcast"):
        return lax.pcast(x, missing, to="varying")
    return lax.pvary(x, missing)  # type: ignore[attr-defined]  # pragma: no cover


def cond_varying(pred: jax.Array, true_fn: Callable[[], Any],
                 false_fn: Callable[[], Any]) -> Any:
    """``lax.cond(pred, true_fn, false_fn)`` whose branches may vary over different
    manual axes inside a ``shard_map``: both are typed as varying over their union
    (a no-op outside ``shard_map``).

    A default ``shard_map`` checks varying manual axes: gradients that vary over an
    axis make the step's outputs vary, while a skip branch's zeros and the incoming
    state may not, and ``lax.cond`` needs equal types in both branches."""
    varying = jax.tree.map(lambda a, b: varying_axes(a) | varying_axes(b),
                           jax.eval_shape(true_fn), jax.eval_shape(false_fn))

    def cast(branch: Callable[[], Any]) -> Callable[[Any], Any]:
        return lambda _: jax.tree.map(cast_varying, branch(), varying)

    return lax.cond(pred, cast(true_fn), cast(false_fn), None)
