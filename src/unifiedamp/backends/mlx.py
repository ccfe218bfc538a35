"""The Apple MLX backend: the scaler as an immutable value over ``mlx.core`` arrays.

Same verbs as the JAX backend: ``scale(tree)``, ``unscale(grads) -> (grads,
finite)``, ``update(finite) -> scaler``. Nothing waits for the device: the
skip is a ``mx.where`` over parameters and optimizer state (:meth:`apply`).
``mx.compile`` takes trees of arrays, so a compiled step passes the scaler as
``scaler.tree()`` and rebuilds it with ``scaler.with_tree(tree)``; :func:`compile`
does that for a function that takes and returns scalers.
MLX computes float32 subnormals (``docs/backends/mlx.md``), so the update is a plain
float32 multiply.

The diagnostics' report, history ring and collapse check are the shared ones
(:mod:`unifiedamp.backends._functional_diagnostics`), bound here to MLX's trees.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map

from unifiedamp._tree import refuse_foreign
from unifiedamp.backends._functional import FunctionalGradScaler
from unifiedamp.backends._functional_diagnostics import (
    LeafCounts,
    Words,
    leaf_counts,
    public_functions,
)

__all__ = ["LeafCounts", "MlxGradScaler", "all_finite", "check_collapse", "collapse_message",
           "compile",
           "history_init", "history_record", "overflow_counts", "overflow_report",
           "scale_history", "where_finite"]


def all_finite(tree: Any) -> mx.array:
    """True (a 0-d bool array) when every element of every leaf is finite.

    Example:
        >>> import mlx.core as mx
        >>> all_finite({"a": mx.array([1.0, float("nan")])}).item()
        False
    """
    finite = mx.array(True)
    for _, leaf in cast("list[tuple[str, Any]]", tree_flatten(tree)):  # no destination=
        finite = finite & mx.isfinite(mx.sum(leaf * 0))  # NaN as soon as one is inf/NaN
    return finite


def _not_arrays(tree: Any, verb: str) -> TypeError | None:
    """The error naming ``tree``'s first leaf that is not an ``mx.array`` (a Python float has
    no dtype to keep, and MLX's own error names ``sum()``); None when every leaf is one.
    Looked for only after a verb has failed: the good path pays nothing."""
    for path, leaf in tree_flatten(tree) if not isinstance(tree, mx.array) else ():
        if not isinstance(leaf, mx.array):
            where = f"leaf {path!r}" if path else "the value"
            return TypeError(f"{verb}() takes mx.array values (a tree of them), but {where} "
                             f"is a {type(leaf).__name__} {leaf!r:.40}: pass "
                             f"mx.array({leaf!r:.20})")
    return None


def _refuse_foreign(tree: Any, what: str) -> None:
    # A NumPy array or another framework's tensor would be converted behind the step's back
    # (NumPy's own operators take an mx.array and return NumPy).
    refuse_foreign(tree, what=what, own=("mlx",), expected="mx.array values",
                   convert="mx.array")


def where_finite(finite: mx.array, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old``, leaf by leaf."""
    return tree_map(lambda n, o: mx.where(finite, n, o), new, old)


def compile(fn: Any, **options: Any) -> Any:
    """``mx.compile(fn)`` for a function whose arguments and results may be scalers.

    ``mx.compile`` takes and returns trees of arrays only: each :class:`MlxGradScaler`
    among the positional arguments goes in as its :meth:`~MlxGradScaler.tree`, and
    each among the results (the result itself, or an item of a returned tuple) comes
    back as a scaler. A scaler's config is static: one compiled function per config.
    ``options`` go to ``mx.compile`` (``inputs``, ``outputs``, ``shapeless``).

    Example:
        >>> import mlx.core as mx
        >>> import unifiedamp as ua
        >>> @compile
        ... def step(scaler, w):
        ...     grads, finite = scaler.unscale(scaler.scale(w))
        ...     return scaler.update(finite), grads
        >>> scaler, grads = step(ua.GradScaler(8.0, growth_interval=1, backend="mlx"),
        ...                      mx.ones(2))
        >>> scaler.get_scale(), grads.tolist()
        (16.0, [1.0, 1.0])
    """
    compiled: dict[Any, tuple[Any, list[Any]]] = {}

    def run(*args: Any) -> Any:
        templates = tuple(a if isinstance(a, MlxGradScaler) else None for a in args)
        key = tuple(None if t is None else (type(t), t._config) for t in templates)
        if key not in compiled:
            returned: list[Any] = []  # the scalers' templates among the results, once traced

            def on_trees(*trees: Any) -> Any:
                inner = [t if template is None else template.with_tree(t)
                         for t, template in zip(trees, templates, strict=True)]
                out = fn(*inner)
                items = out if isinstance(out, tuple) else (out,)
                returned[:] = [o if isinstance(o, MlxGradScaler) else None for o in items]
                flat = tuple(o.tree() if isinstance(o, MlxGradScaler) else o for o in items)
                return flat if isinstance(out, tuple) else flat[0]

            compiled[key] = (mx.compile(on_trees, **options), returned)
        function, returned = compiled[key]
        out = function(*(a.tree() if isinstance(a, MlxGradScaler) else a for a in args))
        items = out if isinstance(out, tuple) else (out,)
        rebuilt = tuple(o if template is None else template.with_tree(o)
                        for o, template in zip(items, returned, strict=True))
        return rebuilt if isinstance(out, tuple) else rebuilt[0]

    return run


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
    xp: ClassVar[Any] = mx

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

    def scale(self, outputs: Any) -> Any:
        """Multiplies every leaf by the scale; each keeps its dtype."""
        self._check_current("scale")
        _refuse_foreign(outputs, "scale()")
        if not self._config.enabled:
            return outputs
        try:
            return tree_map(lambda x: (x * self.loss_scale).astype(x.dtype), outputs)
        except (AttributeError, TypeError, ValueError):
            error = _not_arrays(outputs, "scale")
            if error is None:
                raise
            raise error from None

    def unscale(self, grads: Any) -> tuple[Any, mx.array]:
        """``(grads / scale, all finite)``; finiteness is decided on the scaled gradients,
        and is false at a scale whose reciprocal overflows (``spec.unscale_overflows``)."""
        self._check_current("unscale")
        _refuse_foreign(grads, "unscale()")
        if not self._config.enabled:
            return grads, mx.array(True)
        inv = mx.array(1.0, dtype=mx.float32) / self.loss_scale
        try:
            finite = all_finite(grads) & mx.isfinite(inv)
            return tree_map(lambda g: (g * inv).astype(g.dtype), grads), finite
        except (AttributeError, TypeError, ValueError):
            error = _not_arrays(grads, "unscale")
            if error is None:
                raise
            raise error from None

    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` where ``finite``, else ``old``: trees of the same structure, selected
        leaf by leaf (module-level :func:`where_finite`; no host sync, works in
        ``mx.compile``).

        Example:
            >>> import mlx.core as mx
            >>> s = MlxGradScaler()
            >>> s.where_finite(mx.array(False), [mx.ones(2)], [mx.zeros(2)])[0].tolist()
            [0.0, 0.0]
        """
        _refuse_foreign((new, old), "where_finite()")
        return where_finite(finite, new, old)

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


# ---------------------------------------------------------------- diagnostics


def overflow_counts(grads: Any) -> Any:
    """Per-gradient inf/NaN counts, traceable (eagerly and inside ``mx.compile``): the
    gradients' tree with a :class:`LeafCounts` ``(inf, nan, max_finite, shape)`` of arrays
    where each gradient was.

    ``inf`` and ``nan`` are int32 0-d counts (exact up to 2**31 - 1 elements a leaf),
    ``max_finite`` the float32 largest finite magnitude, ``shape`` the gradient's shape as
    an int32 array. Read the tree with :func:`overflow_report`, which names the leaves by
    ``mlx.utils.tree_flatten``'s dotted paths.

    Cost: three reductions over each gradient, computed whenever the result is evaluated:
    MLX has no ``cond``, so inside a compiled step they run on every step (about twice
    :func:`all_finite`; figures in ``docs/diagnostics.md``). To pay only on skipped
    steps, return the gradients from the step and count them outside it when
    ``scaler.last_step_skipped`` (a host read, after the ``mx.eval`` of the step).

    Example:
        >>> import mlx.core as mx
        >>> import mlx.nn as nn
        >>> from unifiedamp.backends.mlx import MlxGradScaler, overflow_counts, overflow_report
        >>> model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
        >>> scaler = MlxGradScaler(2.0**15)
        >>> x = mx.array([[1.0, float("inf")]])
        >>> loss, grads = nn.value_and_grad(model, lambda m: scaler.scale(m(x).sum()))(model)
        >>> grads, finite = scaler.unscale(grads)
        >>> report = overflow_report(overflow_counts(grads), step=1, scale=scaler.loss_scale,
        ...                          loss=loss / scaler.loss_scale)
        >>> report.names, report.loss_finite
        (['layers.0.weight', 'layers.1.weight'], False)
    """
    return tree_map(lambda g: leaf_counts(
        MlxGradScaler, g if isinstance(g, mx.array) else mx.array(g)), grads)


def _host(tree: Any) -> Any:
    """A tree of MLX arrays as NumPy arrays, evaluated in one ``mx.eval``."""
    mx.eval(tree)
    return tree_map(lambda a: np.array(a) if isinstance(a, mx.array) else a, tree)


def _named_counts(counts: Any) -> list[tuple[str, Any]]:
    pairs = tree_flatten(counts, is_leaf=lambda x: isinstance(x, LeafCounts))
    return [(path or "grads", record) for path, record in pairs]


def _set_slot(ring: mx.array, slot: mx.array, value: mx.array) -> mx.array:
    return mx.slice_update(ring, value.astype(ring.dtype).reshape(1), slot.reshape(1), axes=(0,))


(overflow_report, history_init, history_record, scale_history, collapse_message,
 check_collapse) = public_functions(
    MlxGradScaler, module=__name__, host=_host, named_counts=_named_counts,
    asarray=lambda x: x if isinstance(x, mx.array) else mx.array(x), set_slot=_set_slot,
    words=Words(
        outside="outside ``mx.compile``",
        naming="Gradients are named by ``mlx.utils.tree_flatten``'s dotted paths "
               "(``layers.0.weight``, the names of ``model.parameters()``), in tree order;",
        keep="pass through the compiled step",
        traced="eagerly or inside ``mx.compile`` (no host read)",
        module="mlx.core", alias="mx", int32="'mlx.core.int32'",
        float32="'mlx.core.float32'", bool_="'mlx.core.bool'"))
