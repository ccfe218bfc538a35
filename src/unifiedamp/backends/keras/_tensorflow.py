"""The TensorFlow Keras backend: a finiteness test and an unscale shaped for TensorFlow graphs,
and ``apply`` under ``tf.distribute``, where every replica's check counts.

In a TensorFlow graph (``tf.function`` without XLA, how Keras compiles on CPU) each op is a
pass of its own over its tensors; the forms here read each gradient as few times as they can
(docs/backends/keras.md, Measured overhead, has the figures).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import keras
from keras import ops

from ._compat import replicas_update_themselves
from ._paths import BackendPaths, all_finite_exact, multiply

if TYPE_CHECKING:
    from ._optimizer import SpecLossScaleOptimizer


class TensorFlowPaths(BackendPaths):
    """The paths of the TensorFlow Keras backend."""

    @staticmethod
    def compile(fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a ``tf.function``: traced once per process (per dtypes), then one call
        in each graph that calls it, which TensorFlow inlines when it runs the graph."""
        import tensorflow as tf

        return tf.function(fn, autograph=False)

    @staticmethod
    def tensor(x: Any) -> Any:
        """``x`` as a ``tf.Tensor``: ``keras.ops.convert_to_tensor`` gives a Keras variable
        back as it is, which a ``tf.function`` cannot take as an argument."""
        import tensorflow as tf

        return tf.convert_to_tensor(x)

    @staticmethod
    def all_finite(grads: list[Any]) -> Any:
        """True where every element of every gradient is finite, exactly.

        ``isfinite`` then ``all`` writes a bool tensor and reads it back; a float32 ``sum(g)``
        reads the gradient once. A finite sum proves every element finite (an inf or NaN
        term makes any sum inf or NaN); a sum that overflowed although every element is
        finite is told apart by the exact test, run only then.
        """
        grads = [g for g in grads if g is not None]
        # float16 sums of scaled gradients overflow often: those take the exact test.
        wide: list[Any] = []
        narrow: list[Any] = []
        for g in grads:
            wide_dtype = keras.backend.standardize_dtype(g.dtype) in ("float32", "float64")
            (wide if wide_dtype else narrow).append(g)
        finite = all_finite_exact(narrow)
        if wide:
            sums = ops.stack([ops.cast(ops.sum(g), "float32") for g in wide])
            finite = ops.logical_and(finite, ops.cond(
                ops.all(ops.isfinite(sums)),
                lambda: ops.convert_to_tensor(True), lambda: all_finite_exact(wide)))
        return finite

    @staticmethod
    def unscale(grads: list[Any], hi: Any, lo: Any) -> list[Any]:
        """Each gradient times ``hi`` then ``lo``, in its dtype; ``None`` stays None."""
        # Each product is a pass over the gradients of its own (XLA would fuse them); the
        # second (lo != 1) is only needed where 1 / scale is subnormal (scale > 2**126).
        present = [g for g in grads if g is not None]
        if not present:
            return list(grads)
        unscaled = iter(cast("list[Any]", ops.cond(
            ops.equal(lo, 1.0),
            lambda: [multiply(g, hi, None) for g in present],
            lambda: [multiply(g, hi, lo) for g in present])))
        return [None if g is None else next(unscaled) for g in grads]

    def apply_across_replicas(self, opt: SpecLossScaleOptimizer, grads: list[Any],
                              trainable_variables: Any) -> None:
        """``apply(grads)`` where found_inf is the OR over the replicas of a ``tf.distribute``
        strategy (Keras's own class takes the first replica's flag, so an inf on another
        replica is applied). Every replica then takes the same branch; no value leaves the
        graph."""
        import tensorflow as tf

        if tf.distribute.in_cross_replica_context():
            raise ValueError("apply() must be called in a replica context.")

        def non_finite(grads: list[Any]) -> Any:
            # 1.0 where this replica's check fails: a SUM over replicas is 0 when all pass
            # (ReduceOp has no MIN; float32 counts replicas exactly).
            return ops.cast(ops.logical_not(opt.check_finite(grads)), "float32")

        def apply_fn() -> None:
            opt._apply_finite(grads, trainable_variables)

        if replicas_update_themselves():
            # No strategy, or replicas that each run the update (XLA on GPUs only).
            context = tf.distribute.get_replica_context()
            if context.num_replicas_in_sync == 1:
                self.apply(opt, grads, trainable_variables)
                return
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, non_finite(grads))
            # Each replica holds its own gradients: diagnose records the step and scale
            # but no per-gradient counts here (overflow_checked -1; see overflow_report).
            finite = ops.equal(total, 0.0)
            ops.cond(finite, apply_fn, lambda: opt._apply_skipped(None, None, None))
            opt._assign_next(finite)
            return

        def cross_replica(distribution: Any, grads: Any, trainable_variables: Any) -> None:
            per_replica = distribution.extended.call_for_each_replica(non_finite, args=(grads,))
            # Across every replica (and worker): not only experimental_local_results(...)[0].
            total = distribution.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            def apply_each() -> None:
                distribution.extended.call_for_each_replica(
                    opt._apply_finite, args=(grads, trainable_variables))

            def skip() -> None:
                # diagnose: the counts summed over this worker's replicas' gradients.
                local = [None if g is None else distribution.experimental_local_results(g)
                         for g in grads]
                n = max((len(r) for r in local if r is not None), default=1)
                replicas = [[None if r is None else r[k] for r in local] for k in range(n)]
                opt._apply_skipped(None, trainable_variables, replicas)

            # In the cross-replica context, as Keras: the inner optimizer's apply merges.
            finite = ops.equal(total, 0.0)
            ops.cond(finite, apply_each, skip)
            opt._assign_next(finite)

        tf.distribute.get_replica_context().merge_call(
            cross_replica, args=(grads, trainable_variables))
