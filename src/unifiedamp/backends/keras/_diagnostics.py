"""What ``diagnose`` and ``history`` add to the wrapper: their variables, the record each update
writes with device ops (no host read), and ``overflow_report()``/``history()`` read from it.

The per-gradient counts of a skipped step are taken inside the compiled step's skipped branch
on TensorFlow and JAX (a step that does not skip costs nothing more); torch decides on the
host and its report is counted there (``_torch.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
from keras import ops

from unifiedamp.backends._imperative import scale_before_skip
from unifiedamp.diagnostics import GradientOverflow, OverflowReport, ScaleHistory
from unifiedamp.spec import ScalerConfig

from ._compat import LossScaleOptimizerHooks
from ._paths import F32, read_int

_NO_DIAGNOSE = ("The gradients stay inside the compiled train step on the TensorFlow and JAX "
                "Keras backends: build the scaler with diagnose=True "
                "(KerasGradScaler(..., diagnose=True)) to record which of them held inf/NaN "
                "at each skipped step.")


def _gradient_stats(g: Any) -> tuple[Any, Any, Any]:
    """(inf count, NaN count, largest finite |g|) of one gradient: int32, int32, float32."""
    g = ops.convert_to_tensor(g)
    if keras.backend.standardize_dtype(g.dtype) in ("float16", "bfloat16"):
        g = ops.cast(g, "float32")
    if any(n == 0 for n in g.shape):  # ops.max of nothing fails; unknown sizes are None
        return F32.int32(0), F32.int32(0), ops.convert_to_tensor(0.0, "float32")
    inf = ops.sum(ops.cast(ops.isinf(g), "int32"))
    nan = ops.sum(ops.cast(ops.isnan(g), "int32"))
    largest = ops.max(ops.where(ops.isfinite(g), ops.abs(g), ops.zeros_like(g)))
    return inf, nan, ops.cast(largest, "float32")


def _unscaled(largest: float, scale: float) -> float:
    """A gradient magnitude of the scaled loss times ``f32(1 / scale)``, in float32: what
    unscaling makes of it (rounding is monotonic, so the largest stays the largest)."""
    inverse = np.float32(math.inf) if scale == 0 else np.float32(1.0 / scale)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.float32(largest) * inverse)


class OptimizerDiagnostics(LossScaleOptimizerHooks):
    """The wrapper's counters, history ring and overflow record; ``SpecLossScaleOptimizer``'s
    base. Its variables are made by :meth:`_build_diagnostics`, each only when asked for."""

    # Set by the wrapper's __init__ and build.
    _diagnose: bool
    _history_size: int
    dynamic_scale: Any
    hysteresis_counter: Any
    update_count: Any
    skipped_count: Any
    last_skipped: Any
    if TYPE_CHECKING:
        @property
        def scaler_config(self) -> ScalerConfig: ...

    # Made by _build_diagnostics: the history ring (history=N)...
    history_iteration: Any
    history_scale: Any
    history_skipped: Any
    # ... and the skipped step's record (diagnose, where counts_on_device).
    overflow_step: Any
    overflow_scale: Any
    overflow_checked: Any
    overflow_counts: Any
    overflow_max: Any

    def _build_diagnostics(self, num_variables: int, counts_on_device: bool) -> list[int]:
        """Makes the variables ``diagnose`` and ``history`` ask for; their ids."""
        made = []

        def add(shape: tuple[int, ...], dtype: str, name: str) -> Any:
            made.append(self.add_variable(shape=shape, dtype=dtype, name=name,
                                          initializer=keras.initializers.Zeros(),  # pyright: ignore[reportArgumentType]
                                          aggregation="none"))
            return made[-1]

        if self._history_size:
            n = self._history_size
            self.history_iteration = add((n,), "int32", "history_iteration")
            self.history_scale = add((n,), "float32", "history_scale")
            self.history_skipped = add((n,), "int32", "history_skipped")
        if self._diagnose and counts_on_device:
            self.overflow_step = add((), "int32", "overflow_step")
            self.overflow_scale = add((), "float32", "overflow_scale")
            self.overflow_checked = add((), "int32", "overflow_checked")
            self.overflow_counts = add((num_variables, 2), "int32", "overflow_counts")
            self.overflow_max = add((num_variables,), "float32", "overflow_max")
        return [id(v) for v in made]

    # ------------------------------------------------------------ written by each update

    def _record(self, skipped: Any, scale: Any) -> None:
        """Counts one update in ``update_count``, ``skipped_count`` and ``last_skipped``, and
        writes its history record (device ops, no host read): iteration = updates so far,
        ``scale``, the scale the update left, skipped. ``skipped`` is a Python bool in
        each branch of the compiled step (and on torch's host path), else a tensor."""
        count: Any = ops.convert_to_tensor(self.update_count)
        flag = F32.int32(int(skipped)) if isinstance(skipped, bool) else ops.cast(skipped, "int32")
        if self._history_size:
            hot = ops.equal(ops.arange(self._history_size, dtype="int32"),
                            ops.mod(count, self._history_size))
            value = ops.convert_to_tensor
            self.history_iteration.assign(ops.where(hot, count + 1,
                                                    value(self.history_iteration)))
            self.history_scale.assign(ops.where(hot, ops.cast(scale, "float32"),
                                                value(self.history_scale)))
            self.history_skipped.assign(ops.where(hot, flag, value(self.history_skipped)))
        self.update_count.assign(count + 1)
        self.last_skipped.assign(flag)
        if skipped is not False:  # a finite branch leaves the count as it is
            skipped_count: Any = ops.convert_to_tensor(self.skipped_count)
            self.skipped_count.assign(skipped_count + flag)

    def _record_overflow(self, replicas: list[list[Any]] | None, indices: list[int]) -> None:
        """The skipped branch's record (TensorFlow, JAX): the step and the scale, and for
        each trainable variable its gradient's inf count, NaN count and largest finite
        magnitude (summed, and the largest, over ``replicas``, lists of gradients in the
        order of ``indices``). ``replicas=None``: no counts (``overflow_checked`` -1)."""
        count: Any = ops.convert_to_tensor(self.update_count)
        self.overflow_step.assign(count + 1)
        self.overflow_scale.assign(ops.convert_to_tensor(self.dynamic_scale))
        if replicas is None:
            self.overflow_checked.assign(F32.int32(-1))
            return
        k = len(self._optimized_variables)
        inf, nan = [F32.int32(0)] * k, [F32.int32(0)] * k
        largest = [ops.convert_to_tensor(0.0, "float32")] * k
        checked = set()
        for grads in replicas:
            for i, g in zip(indices, grads, strict=True):
                if g is None:
                    continue
                checked.add(i)
                n_inf, n_nan, big = _gradient_stats(g)
                inf[i], nan[i] = inf[i] + n_inf, nan[i] + n_nan
                largest[i] = ops.maximum(largest[i], big)
        self.overflow_checked.assign(F32.int32(len(checked)))
        if k:
            self.overflow_counts.assign(ops.stack([ops.stack(inf), ops.stack(nan)], axis=1))
            self.overflow_max.assign(ops.stack(largest))

    # ------------------------------------------------------------ read on the host

    def _indices(self, variables: Any) -> list[int]:
        """Each variable's position among the optimizer's trainable variables."""
        out = []
        for i, v in enumerate(variables):
            try:
                out.append(self._variable_index(v))
            except (KeyError, AttributeError, TypeError):
                out.append(i)
        return out

    def _variable_name(self, index: int, names: dict[int, tuple[str, Any]] | None) -> str:
        var = self._optimized_variables[index]
        for key in (id(var), id(getattr(var, "value", None))):
            name, obj = (names or {}).get(key, (None, None))
            if name is not None and (obj is var or obj is getattr(var, "value", None)):
                return name
        return var.path

    def _recorded_report(self, names: dict[int, tuple[str, Any]] | None
                         ) -> OverflowReport | None:
        """:meth:`overflow_report` from the variables the compiled step writes."""
        if not (self._diagnose or self._history_size):
            raise RuntimeError(
                f"overflow_report() records nothing on the {keras.backend.backend()} Keras "
                "backend unless asked: the skip is decided inside the compiled train step. "
                "Build the scaler with diagnose=True (which gradients held inf/NaN) or "
                "history=N (which updates skipped): KerasGradScaler(..., diagnose=True)")
        if not self.built:
            return None

        def read(v: Any) -> Any:
            return ops.convert_to_numpy(v)

        count = int(read(self.update_count))
        if not self._diagnose:
            size = self._history_size
            if not count or not int(read(self.history_skipped)[(count - 1) % size]):
                return None
            # A record holds the scale its update left: the one before it holds the scale
            # the skipped update started from; without one, that scale is inferred.
            note = _NO_DIAGNOSE
            if count > 1 and size > 1:
                scale = float(read(self.history_scale)[(count - 2) % size])
            else:
                scale, exact = scale_before_skip(self.scaler_config,
                                                 float(read(self.dynamic_scale)),
                                                 int(read(self.hysteresis_counter)))
                if not exact:
                    note += (" The scale is inferred from the backed-off one and may be off "
                             "by a rounding (or the min_scale clamp).")
            return OverflowReport(int(read(self.history_iteration)[(count - 1) % size]),
                                  scale, [], 0, None, note=note)
        step = int(read(self.overflow_step))
        if not count or step != count:
            return None
        scale = float(read(self.overflow_scale))
        checked = int(read(self.overflow_checked))
        if checked < 0:
            return OverflowReport(step, scale, [], 0, None, note=(
                "Per-gradient counts are not recorded under a tf.distribute strategy whose "
                "replicas each run the update (XLA on GPUs): each replica holds only its "
                "own gradients."))
        counts, largest = read(self.overflow_counts), read(self.overflow_max)
        overflows = [GradientOverflow(self._variable_name(i, names),
                                      tuple(self._optimized_variables[i].shape),
                                      int(counts[i, 0]), int(counts[i, 1]),
                                      _unscaled(largest[i], scale))
                     for i in range(len(counts)) if counts[i].any()]
        return OverflowReport(step, scale, overflows, checked, None)

    def history(self) -> ScaleHistory:
        """The last ``history`` updates (oldest first): iteration (this optimizer's updates
        since it was built or loaded, from 1), the scale that update left (the next
        step's), and whether it skipped. Read from the ring variables, which the apply
        step writes with device ops (no host read per step).

        Raises:
            ValueError: Built with ``history=0`` (the default).
        """
        if not self._history_size:
            raise ValueError("this optimizer keeps no history: build the scaler with history=N "
                             "(e.g. KerasGradScaler(..., history=1000)) to keep the last N "
                             "updates")
        if not self.built:
            return ScaleHistory([], [], [])
        iterations, scales, skipped = (np.asarray(ops.convert_to_numpy(v)).tolist() for v in (
            self.history_iteration, self.history_scale, self.history_skipped))
        return ScaleHistory.from_ring(iterations, scales, skipped, read_int(self.update_count))
