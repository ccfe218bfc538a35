"""What each Keras backend does its own way, and the device ops all of them share.

Keras runs one backend per process, so the wrapper (``SpecLossScaleOptimizer``) and the
scaler pick the paths of that backend once, when they are made (``_optimizer.paths_for``).
:class:`BackendPaths` is Keras's generic path: a compiled step that checks, then steps or
skips in a ``cond``, and reports from variables that step writes. ``_tensorflow.py``,
``_jax.py`` and ``_torch.py`` each subclass it with what differs on theirs; a Keras backend
without a module of its own takes it as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
from keras import ops

from unifiedamp.backends._float32_bits import Float32Bits

if TYPE_CHECKING:
    from unifiedamp.diagnostics import OverflowReport

    from ._optimizer import SpecLossScaleOptimizer


#: Float32 arithmetic on int32 bit patterns in ``keras.ops``: the scale's update, its
#: reciprocal and its split into two normal factors, exact where a backend flushes subnormals.
F32 = Float32Bits.for_keras()


def multiply(x: Any, hi: Any, lo: Any | None) -> Any:
    """``x`` times ``hi``, then times ``lo`` unless None (a value split by
    :meth:`Float32Bits.split`), in ``x``'s dtype; a float16 or bfloat16 ``x`` is multiplied
    in float32."""
    dtype = keras.backend.standardize_dtype(x.dtype)
    wide: Any = ops.cast(x, "float32") if dtype in ("float16", "bfloat16") else x
    product = wide * ops.cast(hi, wide.dtype)
    if lo is not None:
        product = product * ops.cast(lo, wide.dtype)
    return ops.cast(product, dtype)


def every(grads: list[Any], test: Callable[[Any], Any]) -> Any:
    """True where ``test(g)`` holds for every gradient: a device flag, no host read."""
    finite = ops.convert_to_tensor(True)
    for g in grads:
        finite = ops.logical_and(finite, test(g))
    return finite


def all_finite_exact(grads: list[Any]) -> Any:
    """True where every element of every gradient is finite: ``all(isfinite(g))`` each."""
    return every(grads, lambda g: ops.all(ops.isfinite(g)))


def unscale_factors(bits: Any) -> Any:
    """``f32(1 / scale)`` as two normal float32 factors (:meth:`Float32Bits.split`), stacked,
    from the scale's int32 bits."""
    return ops.stack(F32.split(F32.reciprocal_bits(bits)))


def select(finite: Any, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old``, bit for bit (old may be a variable)."""
    old = ops.convert_to_tensor(old)
    return ops.where(finite, ops.cast(new, old.dtype), old)


def read_float(x: Any) -> float:
    """A scalar tensor or variable as a Python float (a host read)."""
    return float(np.asarray(ops.convert_to_numpy(x)))


def read_int(x: Any) -> int:
    """A scalar tensor or variable as a Python int (a host read)."""
    return int(np.asarray(ops.convert_to_numpy(x)))


#: What :meth:`BackendPaths.compiled` made, by backend and function.
_COMPILED: dict[tuple[type, Callable[..., Any]], Callable[..., Any]] = {}


class BackendPaths:
    """The paths of one Keras backend, for one wrapper: Keras's generic ones here.

    Functions of the backend alone are static (the scaler calls them without a wrapper);
    the others take the wrapper ``opt`` they serve, and an instance may keep state for it.
    """

    #: Whether ``diagnose`` counts a skipped step's gradients into device variables, in the
    #: compiled step's skipped branch (where the gradients are).
    counts_on_device = True

    #: Whether ``stateless_apply`` may compute both outcomes and select one: not where the
    #: inner optimizer's stateless step writes into the tensors it is given (Keras's torch
    #: backend), which would leave the skipped outcome the finite one's values.
    selects_outcomes = True

    @staticmethod
    def compile(fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, a function of tensors alone, as this backend runs it best from the steps
        that call it: as it is here (an eager backend runs its ops as they come)."""
        return fn

    @staticmethod
    def tensor(x: Any) -> Any:
        """``x`` as a tensor of this backend (a variable read)."""
        return ops.convert_to_tensor(x)

    @classmethod
    def compiled(cls, fn: Callable[..., Any]) -> Callable[..., Any]:
        """:meth:`compile`'s form of ``fn``, made at the first call and kept, its arguments
        made tensors (:meth:`tensor`): where a backend traces ``fn`` (TensorFlow, JAX),
        every later step that calls it, in any model, reuses the trace instead of tracing
        its few hundred ops again."""
        if (cls, fn) not in _COMPILED:
            function = cls.compile(fn)
            _COMPILED[cls, fn] = lambda *args: function(*(cls.tensor(a) for a in args))
        return _COMPILED[cls, fn]

    @staticmethod
    def all_finite(grads: list[Any]) -> Any:
        """True where every element of every gradient is finite (``None`` ones left out);
        exact at every shape and dtype."""
        return all_finite_exact([g for g in grads if g is not None])

    @staticmethod
    def unscale(grads: list[Any], hi: Any, lo: Any) -> list[Any]:
        """Each gradient times ``hi`` then ``lo`` (``f32(1 / scale)`` as two normal factors),
        in its dtype; ``None`` stays None."""
        return [None if g is None else multiply(g, hi, lo) for g in grads]

    def apply(self, opt: SpecLossScaleOptimizer, grads: list[Any],
              trainable_variables: Any) -> None:
        """``apply(grads)`` of the wrapper: checks, then steps or skips, and updates."""
        # Keras's own, with the gradients given to the skipped branch too; the state's
        # update after the branches, on the same flag.
        finite = opt.check_finite(grads)
        ops.cond(finite, lambda: opt._apply_finite(grads, trainable_variables),
                 lambda: opt._apply_skipped(grads, trainable_variables, None))
        opt._assign_next(finite)

    def apply_across_replicas(self, opt: SpecLossScaleOptimizer, grads: list[Any],
                              trainable_variables: Any) -> None:
        """``apply(grads)`` where Keras leaves the replicas of a ``tf.distribute`` strategy to
        the optimizer (TensorFlow's path: Keras takes it on no other backend)."""
        self.apply(opt, grads, trainable_variables)

    def note_loss(self, loss: Any) -> None:
        """Keeps what the overflow report needs of the loss given to ``scale_loss``: nothing
        here, where the loss stays inside the compiled step."""
        # A statement besides the docstring: AutoGraph fails to convert a body without one
        # and warns ("could not transform") at every scale_loss a tf.function traces.
        return None

    def overflow_report(self, opt: SpecLossScaleOptimizer,
                        names: dict[int, tuple[str, Any]] | None) -> OverflowReport | None:
        """The wrapper's :meth:`overflow_report`: from the variables the step writes."""
        return opt._recorded_report(names)
