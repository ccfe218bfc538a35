"""Catches a finite flag that the devices sharing one scale do not agree on.

With data or parameters spread over devices, each device checks its own gradients;
unless the check is agreed across the devices (``axis_name``: one scalar ``psum``), an
inf on one device makes only that device skip and back off, and the replicas' scales
and weights drift apart without an error. What JAX tells at trace time decides the
check (nothing here reads a value, so a jitted step costs the same):

- a default ``jax.shard_map`` tracks which mesh axes each value varies over: a flag
  that varies over an axis over which the scale (or the state a step selects) does
  not raises ``ValueError`` where it is used (:func:`require_agreed`); gradients
  reduced over the axis (``lax.pmean``) or of replicated parameters (JAX sums those)
  give a flag that does not vary, and nothing is said;
- ``pmap`` and ``shard_map(check_vma=False)`` track nothing: a check without
  ``axis_name``, or with one that leaves out a mesh axis in scope, warns there
  (:func:`warn_if_unagreed`); ``axis_name=()`` says the gradients already agree;
- outside ``jit`` with several processes (``jax.distributed``), gradients held by this
  process's devices only are this process's own: a check on them warns;
- ``jax.jit`` on global arrays (a ``NamedSharding`` over every device) needs no axis:
  the gradients are one array, their flag one value.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable
from typing import Any

import jax

from unifiedamp.backends.jax._compat import is_tracer, mapped_axes, varying_axes

# Frames of these packages stand between the user's line and the check.
_LIBRARIES = ("unifiedamp.backends", "jax", "jaxlib", "optax", "flax")


def _hint(axes: Iterable[Any]) -> str:
    """``axis_name='d'`` for one axis, ``axis_name=('a', 'b')`` for several."""
    axes = tuple(axes)
    return f"axis_name={axes[0]!r}" if len(axes) == 1 else f"axis_name={axes!r}"


def _fixes(hint: str) -> str:
    return (f"pass {hint} where the flag is computed: scaler.unscale(grads, {hint}), "
            f"loss_scaled(inner, scaler, {hint}), loss_scaled_accumulate(inner, scaler, k, "
            f"{hint}) or all_finite(grads, {hint})")


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame above the caller outside these libraries,
    so a warning names the user's line (also from inside a ``lax.cond`` branch)."""
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and _in_libraries(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    return level


def _in_libraries(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in _LIBRARIES)


def axis_names(axis_name: Any) -> tuple[Any, ...]:
    """``axis_name`` (one name, or a tuple or list of them) as a tuple of names."""
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def reduction_axes(finite: Any, axis_name: Any) -> tuple[Any, ...]:
    """The axes of ``axis_name`` (not ``None``) to ``psum`` the finite flag over.

    In a default ``shard_map``: the named mesh axes the flag varies over, and any named
    axis that is not a mesh axis (a ``vmap``'s). JAX types a value as invariant over a mesh
    axis only where every device of that axis holds the same value (what lets
    ``out_specs`` leave the axis out), so the OR over such an axis is the flag itself:
    leaving the axis out gives the same answer and no collective. ``lax.psum`` refuses a
    flag that varies over some of its axes and not others, the usual case on a 2-D mesh
    (parameters sharded over ``'model'`` and replicated over ``'data'``: JAX sums their
    gradients over ``'data'``); casting the flag to varying first (``lax.pcast``) would work
    too, at the cost of an all-reduce of a value known to be equal. Where JAX tracks no
    varying axes (``pmap``, ``shard_map(check_vma=False)``, outside ``shard_map``): every
    named axis."""
    names = axis_names(axis_name)
    axes, tracked = mapped_axes()
    if not tracked:
        return names
    varying = varying_axes(finite)
    return tuple(a for a in names if a in varying or a not in axes)


def warn_if_unagreed(tree: Any, axis_name: Any, caller: str) -> None:
    """Warns when ``caller`` checks ``tree`` where JAX cannot tell whether the devices
    agree and they may not: under ``pmap`` or ``shard_map(check_vma=False)`` without
    ``axis_name`` or with one that leaves out a mesh axis in scope, or outside ``jit``
    without ``axis_name`` on arrays held by this process only while several processes
    run. ``axis_name=()`` (no axis: already agreed) is left alone; a default
    ``shard_map`` is checked exactly where the flag is used (:func:`require_agreed`)."""
    if axis_name is not None and not axis_names(axis_name):
        return
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return
    if any(is_tracer(leaf) for leaf in leaves):
        axes, tracked = mapped_axes()
        if axes and not tracked and axis_name is not None:
            _warn_if_partial(axis_names(axis_name), axes, caller)
        elif axes and not tracked:
            warnings.warn(
                f"{caller} without axis_name inside pmap or shard_map(check_vma=False) over "
                f"the mesh axes {axes}: each device decides 'all finite' on its own "
                f"gradients, so an inf on one device makes only that device skip its step "
                f"and back off its scale, and the devices' scales and weights drift apart. "
                f"Fix: {_fixes(_hint(axes))} (one scalar psum, right also when the gradients "
                f"are already averaged). If they are (lax.pmean before the check), "
                f"axis_name=() says so and skips the psum. JAX does not track here which "
                f"values differ across devices; a default shard_map does, and there this "
                f"is checked exactly.", UserWarning, stacklevel=_user_stacklevel())
        return
    if (axis_name is None and all(isinstance(leaf, jax.Array) for leaf in leaves)
            and jax.process_count() > 1
            and all(leaf.is_fully_addressable for leaf in leaves)):
        warnings.warn(
            f"{caller} without axis_name on arrays held by this process's devices only, "
            f"while {jax.process_count()} processes run (jax.distributed): each process "
            f"decides 'all finite' on its own gradients, so an inf on one process makes only "
            f"it skip its step and back off its scale, and the processes' scales and weights "
            f"drift apart. Fix: compute the step on global arrays (jax.jit with the batch "
            f"on a NamedSharding over a mesh of every process's devices, e.g. "
            f"jax.make_array_from_process_local_data: the gradients are then one array and "
            f"the flag one value), or inside jax.shard_map over that mesh with axis_name= "
            f"its axis. If these gradients already agree across processes (reduced by "
            f"hand), axis_name=() says so.", UserWarning, stacklevel=_user_stacklevel())


def _warn_if_partial(names: tuple[Any, ...], axes: tuple[Any, ...], caller: str) -> None:
    """Warns when ``names`` (a non-empty ``axis_name``) leaves out some of ``axes``, the
    mesh axes in scope under ``pmap`` or ``shard_map(check_vma=False)``: whether the
    gradients differ over those is not tracked there, so this reads the names only."""
    missing = tuple(a for a in axes if a not in names)
    if not missing:
        return
    left_out = ", ".join(map(repr, missing))
    warnings.warn(
        f"{caller} with {_hint(names)} inside pmap or shard_map(check_vma=False) over the "
        f"mesh axes {axes}: the finite flag is agreed over {', '.join(map(repr, names))} "
        f"only, not over {left_out}. Where the gradients differ across {left_out} "
        f"(parameters sharded over it, or a batch split over it and not reduced), an inf "
        f"on one device makes only the devices that see it skip their step and back off "
        f"their scale, and the scales and weights drift apart across {left_out}. Fix: "
        f"{_fixes(_hint(names + missing))} (one scalar psum, right also where the gradients "
        f"already agree over {left_out}). JAX does not track here which values differ "
        f"across devices; a default shard_map does, and there this is checked exactly.",
        UserWarning, stacklevel=_user_stacklevel())


def require_agreed(finite: Any, state: Any, caller: str, what: str) -> None:
    """Raises ``ValueError`` when, inside a default ``shard_map``, ``finite`` varies over
    a mesh axis over which no leaf of ``state`` varies: each device would decide on its
    own, and ``state`` (the scale, or replicated weights), the same on every device of
    that axis until now, would differ across them. ``what`` says, for the message, that
    ``state`` does not vary and what would become of it. A trace-time check on types: no
    cost."""
    if not is_tracer(finite):
        return
    axes, tracked = mapped_axes()
    if not axes or not tracked:
        return
    flag_axes = varying_axes(finite) & frozenset(axes)
    if not flag_axes:
        return
    state_axes = frozenset().union(*(varying_axes(leaf) for leaf in jax.tree.leaves(state)
                                     if is_tracer(leaf) or isinstance(leaf, jax.Array)))
    unagreed = tuple(a for a in axes if a in flag_axes - state_axes)
    if not unagreed:
        return
    hint = _hint(unagreed)
    raise ValueError(
        f"{caller}: the finite flag varies over the shard_map mesh axis "
        f"{', '.join(map(repr, unagreed))} while {what}. The flag was decided on each "
        f"device's own gradients (not reduced over that axis): an inf on one device makes "
        f"only that device skip its step and back off. Fix: {_fixes(hint)} (where axis_name "
        f"already names other axes, add {unagreed[0]!r} to them in a tuple); or reduce the "
        f"gradients over it (lax.pmean(grads, {unagreed[0]!r})) before the check. Mesh axes "
        f"in scope: {axes}.")
