"""The JAX internals this package relies on, in one place.

Supported: jax 0.7 and later (``pyproject.toml``), tested with the version in
``constraints.txt``; also runs on jax 0.4.26 (Praxis's stack, ``constraints-praxis.txt``),
with the limits below. Five things here are not JAX's stable public API:

- ``jax.core.Tracer``, to tell a traced array (inside ``jit``, ``scan``, ``shard_map``)
  from a concrete one: :func:`is_tracer`.
- ``BatchTracer``, public in ``jax.interpreters.batching`` on older jax (0.4.26), in
  ``jax._src.interpreters.batching`` only on newer, to tell an array mapped by
  ``jax.vmap``: :func:`is_vmapped`.
- The manual mesh axes an array varies over inside a ``shard_map``, read from its abstract
  value (``jax.typeof``): ``manual_axis_type.varying`` since jax 0.10, ``vma`` before
  (:func:`varying_axes`).
- The cast that makes an array varying over more axes: ``lax.pcast(x, axes,
  to="varying")`` since jax 0.9, ``lax.pvary(x, axes)`` before (:func:`cast_varying`;
  ``x`` itself where neither exists).
- Whether the enclosing trace tracks varying axes at all: the ``check_vma`` config state
  that ``shard_map(check_vma=...)`` sets; ``pmap`` runs as a ``shard_map`` with
  ``check_vma=False`` since jax 0.8 (:func:`mapped_axes`).

On a jax older than 0.7, without ``jax.sharding.get_abstract_mesh``, ``jax.typeof`` and
varying types: :func:`mapped_axes` reads ``((), False)``, :func:`varying_axes`
``frozenset()`` and :func:`cast_varying` returns its argument; without
``lax.optimization_barrier`` (jax 0.4.26 has none public) :func:`optimization_barrier` returns its
argument too (the barrier keeps XLA from recomputing the scale's factors in every kernel
that reads them: it changes the compiled program's size, never a value). So on jax 0.4.26 (Praxis's
stack) the trace-time axis check is off: a flag that the devices may not agree on (a
missing ``axis_name``, or one that leaves out an axis) raises no ``ValueError`` in a
``shard_map`` and warns nothing under ``pmap``. That check is a diagnostic only: scaling,
unscaling and the updates are the same, and ``axis_name``'s ``psum`` runs over every named
axis, as under ``pmap``.

No other module of the package uses them: a JAX release that changes one changes this file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.core
from jax import lax


def optimization_barrier(x: Any) -> Any:
    """``lax.optimization_barrier(x)``, or ``x`` on a jax without it (0.4.26)."""
    barrier = getattr(lax, "optimization_barrier", None)
    return x if barrier is None else barrier(x)


def is_tracer(array: Any) -> bool:
    """Whether ``array`` is a placeholder of a traced function, with no value to read."""
    return isinstance(array, jax.core.Tracer)


@functools.cache
def _batch_tracer() -> type | None:
    """``vmap``'s tracer class: public in ``jax.interpreters.batching`` on older jax
    (0.4.26), internal only on newer (0.10); ``None`` if neither has it."""
    from jax.interpreters import batching

    found = getattr(batching, "BatchTracer", None)
    if found is None:
        try:
            from jax._src.interpreters import batching as internal
        except ImportError:  # pragma: no cover
            return None
        found = getattr(internal, "BatchTracer", None)
    return found if isinstance(found, type) else None


def is_vmapped(x: Any) -> bool:
    """Whether ``x`` is traced by ``jax.vmap`` itself (a ``BatchTracer``, not an inner jit's)."""
    tracer = _batch_tracer()
    return tracer is not None and isinstance(x, tracer)


def varying_axes(x: Any) -> frozenset[Any]:
    """The manual mesh axes ``x`` (an array or ShapeDtypeStruct) varies over inside a
    ``shard_map``; empty elsewhere."""
    if isinstance(x, jax.ShapeDtypeStruct):
        aval = x
    else:
        typeof = getattr(jax, "typeof", None)
        if typeof is None:  # jax < 0.7 (0.4.26): no varying types
            return frozenset()  # pragma: no cover
        aval = typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()) or ())


def mapped_axes() -> tuple[tuple[Any, ...], bool]:
    """The mesh axes the enclosing ``shard_map`` or ``pmap`` maps over (``()`` outside
    one), and whether that trace tracks which of them each value varies over (a default
    ``shard_map``: :func:`varying_axes` is exact there; ``pmap`` and
    ``shard_map(check_vma=False)``: it reads ``()`` for every value)."""
    get_abstract_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
    if get_abstract_mesh is None:  # jax < 0.7 (0.4.26): no axis check there
        return (), False  # pragma: no cover
    manual = tuple(getattr(get_abstract_mesh(), "manual_axes", ()) or ())
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
    if hasattr(lax, "pvary"):  # pragma: no cover
        return lax.pvary(x, missing)  # pyright: ignore[reportAttributeAccessIssue]  # older jax
    return x  # pragma: no cover  # jax < 0.7 (0.4.26): no varying types, nothing to cast


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
