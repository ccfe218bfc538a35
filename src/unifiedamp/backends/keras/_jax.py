"""The JAX Keras backend: a finiteness test shaped for XLA, and a stateful ``apply`` that runs
the stateless update under ``jax.jit``.

``model.fit`` on JAX calls the wrapper's ``stateless_apply`` (the shared wrapper's); what
differs is the test of the gradients and ``apply`` called outside ``fit``, e.g. in an eager
custom loop (docs/backends/keras.md, Measured overhead, has the figures behind the choices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keras import ops

from ._paths import BackendPaths, every

if TYPE_CHECKING:
    from ._optimizer import SpecLossScaleOptimizer


class JaxPaths(BackendPaths):
    """The paths of the JAX Keras backend, for one wrapper."""

    @staticmethod
    def compile(fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` under ``jax.jit``: inside another jitted step its traced form is reused
        (and inlined), outside one it runs as one compiled call."""
        import jax

        return jax.jit(fn)

    def __init__(self) -> None:
        #: The wrapper's ``stateless_apply`` under ``jax.jit``, compiled at the first apply.
        self.jitted_apply: Any = None

    @staticmethod
    def all_finite(grads: list[Any]) -> Any:
        """True where every element of every gradient is finite, exactly:
        ``min(int8(isfinite(g))) > 0`` per gradient.

        XLA's CPU lowers ``all(isfinite(g))`` as a bool array reduced through a tree of
        reduce-windows, and an int8 minimum is one vectorised reduce. Float reductions are
        not exact there (a large array's ``max`` drops a NaN) or fuse badly into the step (a
        ``sum`` pulls the mixed_float16 gradient's transposed copy into it).
        """
        grads = [g for g in grads if g is not None]
        # An empty gradient is finite (and the min of nothing fails).
        return every([g for g in grads if math.prod(g.shape)],
                     lambda g: ops.greater(ops.min(ops.cast(ops.isfinite(g), "int8")), 0))

    def apply(self, opt: SpecLossScaleOptimizer, grads: list[Any],
              trainable_variables: Any) -> None:
        """``apply(grads)``: the stateless update, jitted once, its results written back."""
        # Keras's stateful cond leaks tracers under JAX; outside jit the stateless update's
        # lax.cond would compile at every call.
        import jax

        tvs = trainable_variables or opt._optimized_variables
        if self.jitted_apply is None:
            self.jitted_apply = jax.jit(opt.stateless_apply)
        new_tvs, new_ovs = self.jitted_apply(
            [v.value for v in opt.variables], grads, [v.value for v in tvs])
        for var, value in zip(tvs, new_tvs, strict=True):
            var.assign(value)
        for var, value in zip(opt.variables, new_ovs, strict=True):
            var.assign(value)
