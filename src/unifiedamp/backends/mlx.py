"""The Apple MLX backend: the scaler as an immutable value over ``mlx.core`` arrays.

Same verbs as the JAX backend: ``scale(tree)``, ``unscale(grads) -> (grads,
finite)``, ``update(finite) -> scaler``. Nothing waits for the device: the
skip is a ``mx.where`` over parameters and optimizer state (:meth:`apply`).
``mx.compile`` takes trees of arrays, so a compiled step passes the scaler as
``scaler.tree()`` and rebuilds it with ``scaler.with_tree(tree)``; :func:`compile`
does that for a function that takes and returns scalers.
MLX computes float32 subnormals on the CPU (measured with mlx 0.32 on Linux),
so the update is a plain float32 multiply.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map

from unifiedamp import diagnostics
from unifiedamp.backends import _functional
from unifiedamp.backends._functional import FunctionalGradScaler, LeafCounts

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
    for _, leaf in tree_flatten(tree):
        finite = finite & mx.isfinite(mx.sum(leaf * 0))  # NaN as soon as one is inf/NaN
    return finite


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
        if not self._config.enabled:
            return outputs
        return tree_map(lambda x: (x * self.loss_scale).astype(x.dtype), outputs)

    def unscale(self, grads: Any) -> tuple[Any, mx.array]:
        """``(grads / scale, all finite)``; finiteness is decided on the scaled gradients,
        and is false at a scale whose reciprocal overflows (``spec.unscale_overflows``)."""
        if not self._config.enabled:
            return grads, mx.array(True)
        inv = mx.array(1.0, dtype=mx.float32) / self.loss_scale
        finite = all_finite(grads) & mx.isfinite(inv)
        return tree_map(lambda g: (g * inv).astype(g.dtype), grads), finite

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
    MLX has no ``cond``, so inside a compiled step they run on every step (measured 34 ms
    on 9.4M float32 in 4 leaves inside ``mx.compile``, 70 ms eagerly, where
    :func:`all_finite` took 16 ms; shared 2-core CPU, mlx 0.32.4). To pay only on skipped
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
    return tree_map(lambda g: _functional.leaf_counts(
        MlxGradScaler, g if isinstance(g, mx.array) else mx.array(g)), grads)


def _host(tree: Any) -> Any:
    """A tree of MLX arrays as NumPy arrays, evaluated in one ``mx.eval``."""
    mx.eval(tree)
    return tree_map(lambda a: np.array(a) if isinstance(a, mx.array) else a, tree)


def overflow_report(counts: Any, *, step: Any = None, scale: Any = None, loss: Any = None,
                    history: Any = None) -> diagnostics.OverflowReport | None:
    """The :class:`~unifiedamp.diagnostics.OverflowReport` of :func:`overflow_counts`'s tree,
    outside ``mx.compile`` (it evaluates the counts); None when no gradient held inf/NaN.

    Gradients are named by ``mlx.utils.tree_flatten``'s dotted paths (``layers.0.weight``,
    the names of ``model.parameters()``), in tree order; ``checked`` is the number of leaves.

    Args:
        counts: What :func:`overflow_counts` returned.
        step: The update's number (from 1). Default: the last record of ``history``, else 0
            (unknown).
        scale: The scale the loss was multiplied by (the scaler's before ``update``).
            Default: the last record of ``history``, else NaN (unknown).
        loss: The unscaled loss (an array or a number), or a bool: sets ``loss_finite``;
            None leaves it unknown.
        history: A :func:`history_init` ring that recorded this step last.

    Example:
        >>> import mlx.core as mx
        >>> grads = {"b": mx.zeros(2), "w": mx.array([[1.0, -float("inf")], [float("nan"), -4.0]])}
        >>> report = overflow_report(overflow_counts(grads), step=3, scale=1024.0, loss=2.5)
        >>> report.names, report.overflows[0], report.checked, report.loss_finite
        (['w'], GradientOverflow('w', shape=(2, 2), inf=1, nan=1, max_finite=4.0), 2, True)
        >>> overflow_report(overflow_counts({"w": mx.ones(3)})) is None
        True
    """
    pairs = tree_flatten(counts, is_leaf=lambda x: isinstance(x, LeafCounts))
    named = [(path or "grads", record) for path, record in pairs]
    if loss is not None and not isinstance(loss, (bool, mx.array)):
        loss = mx.array(loss)
    return _functional.build_report(named, _host, step=step, scale=scale,
                                    loss_finite=_functional.loss_is_finite(mx, loss),
                                    history=history)


def history_init(size: int) -> dict[str, mx.array]:
    """An empty ring of the last ``size`` updates, to pass through the compiled step: a dict
    of ``iteration`` (int32), ``scale`` (float32), ``skipped`` (bool), each ``(size,)``, and
    ``count`` (int32 0-d, records written).

    Raises:
        TypeError: ``size`` is not an int (a bool neither).
        ValueError: ``size`` is below 1.

    Example:
        >>> sorted((k, v.shape, str(v.dtype)) for k, v in history_init(4).items())
        [('count', (), 'mlx.core.int32'), ('iteration', (4,), 'mlx.core.int32'),
         ('scale', (4,), 'mlx.core.float32'), ('skipped', (4,), 'mlx.core.bool')]
    """
    return _functional.history_init(MlxGradScaler, size)


def _set_slot(ring: mx.array, slot: mx.array, value: mx.array) -> mx.array:
    return mx.slice_update(ring, value.astype(ring.dtype).reshape(1), slot.reshape(1), axes=(0,))


def history_record(history: dict[str, mx.array], scaler: MlxGradScaler,
                   finite: Any) -> dict[str, mx.array]:
    """``history`` with this update recorded, eagerly or inside ``mx.compile`` (no host
    read): iteration ``count + 1``, the scale of ``scaler`` *before*
    ``scaler.update(finite)`` (1.0 when disabled) and whether the step was skipped
    (``not finite``), in slot ``count % size``.

    Example:
        >>> import unifiedamp as ua
        >>> scaler, history = ua.GradScaler(8.0, growth_interval=1, backend="mlx"), history_init(2)
        >>> for finite in [True, False, True]:
        ...     history = history_record(history, scaler, finite)
        ...     scaler = scaler.update(finite)
        >>> scale_history(history).as_list()     # the last 2 of 3: iterations 2 and 3
        [(2, 16.0, True), (3, 8.0, False)]
    """
    return _functional.history_record(MlxGradScaler, _set_slot, history, scaler, finite)


def scale_history(history: dict[str, mx.array]) -> diagnostics.ScaleHistory:
    """The ring as a :class:`~unifiedamp.diagnostics.ScaleHistory`, oldest record first
    (evaluates it: call it outside ``mx.compile``, when you log or plot).

    Example:
        >>> scale_history(history_init(3)).as_list()
        []
    """
    return _functional.scale_history(_host, history)


def collapse_message(scaler: MlxGradScaler, report: diagnostics.OverflowReport | None = None,
                     *, step: Any = None, max_consecutive_skips: int | None = 100) -> str | None:
    """The collapse warning's text for this scaler, or None: the imperative backends'
    message (same rule, same words), read from ``consecutive_skips`` and the scale.

    A collapse is ``max_consecutive_skips`` skipped steps in a row (None: not checked) or a
    scale below float32's smallest normal number. ``report`` (:func:`overflow_report` of
    the last skipped step) ends the message with ``"Last overflow: "``, its summary and
    whether the loss itself was inf/NaN. ``step`` names the step (default ``report.step``).
    Reads the device: call it outside ``mx.compile``. :func:`check_collapse` warns with it.

    Example:
        >>> scaler = MlxGradScaler(8.0).update(False).update(False)
        >>> print(collapse_message(scaler, step=2, max_consecutive_skips=2))
        Loss scale collapsed at step 2: scale 2.0 (0x40000000); the gradients were inf/NaN at
        each of the last 2 steps, ...
    """
    return _functional.collapse_message(MlxGradScaler, scaler, report, step=step,
                                        max_consecutive_skips=max_consecutive_skips)


def check_collapse(scaler: MlxGradScaler, report: diagnostics.OverflowReport | None = None,
                   *, step: Any = None, max_consecutive_skips: int | None = 100,
                   on_collapse: str = "warn") -> str | None:
    """Warns :class:`unifiedamp.ScaleCollapseWarning` (or raises
    :class:`unifiedamp.ScaleCollapseError` with ``on_collapse="raise"``) with
    :func:`collapse_message` when the scale collapsed; returns the message, or None.

    Stateless: it warns at every call that finds a collapse, so call it where you log.

    Example:
        >>> import unifiedamp as ua
        >>> scaler = MlxGradScaler(8.0).update(False)
        >>> check_collapse(scaler, max_consecutive_skips=1, on_collapse="raise")
        Traceback (most recent call last):
        ...
        unifiedamp._monitor.ScaleCollapseError: Loss scale collapsed: scale 4.0 ...
    """
    return _functional.check_collapse(MlxGradScaler, scaler, report, step=step,
                                      max_consecutive_skips=max_consecutive_skips,
                                      on_collapse=on_collapse, stacklevel=3)
