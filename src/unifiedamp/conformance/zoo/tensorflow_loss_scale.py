"""The zoo's adapter of TensorFlow's ``tf.compat.v1.mixed_precision.DynamicLossScale``, driven
by the optimizer TensorFlow 1 pairs it with.

Each iteration is ``optimizer.minimize(loss, var_list)`` on
``tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(AdamOptimizer(1e-3),
loss_scale)``: ``compute_gradients`` multiplies the loss by the scale and the gradients by
``1 / loss_scale``, ``apply_gradients`` calls ``loss_scale.update(grads)`` and applies them
only where they are finite. ``iterate`` runs it eagerly, ``compiled_iterate`` under
``tf.function``.

TensorFlow's class takes ``initial_loss_scale``, ``increment_period`` and one
``multiplier``: it grows by the multiplier and backs off by dividing by it, so the adapter
runs ``backoff_factor = 1 / growth_factor`` only, and only for powers of two, where dividing
gives the bits of the spec's multiply by the float32 reciprocal. Its state is two variables,
``current_loss_scale`` and ``good_steps`` (the growth tracker), found among the wrapper's
``variables()``; ``save`` reads them and ``load`` assigns them, as restoring a
``tf.train.Checkpoint`` does.

Example:
    >>> from unifiedamp.spec import ScalerConfig
    >>> tf1 = TensorFlowV1DynamicLossScale()
    >>> tf1.expresses(ScalerConfig(growth_factor=4.0, backoff_factor=0.25)) is None
    True
    >>> print(tf1.expresses(ScalerConfig(growth_factor=3.0, backoff_factor=1 / 3)))
    TensorFlow divides by multiplier=3.0 on a backoff: that equals multiplying by f32(1 / \
multiplier) only for a power of two
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from unifiedamp.conformance.interface import STEP_KINDS, Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import ScalerConfig, ScalerState, parse_state_dict, to_state_dict

__all__ = ["DIFFERENCES", "TensorFlowV1DynamicLossScale"]


class _Run(NamedTuple):
    """A handle: the loss scale, its wrapper over Adam, what it trains, and the step,
    eager and compiled."""

    loss_scale: Any
    optimizer: Any
    base: Any
    params: list[Any]
    eager: Any
    compiled: Any
    config: ScalerConfig


def _state_variables(optimizer: Any) -> tuple[Any, Any]:
    """``current_loss_scale`` and ``good_steps``, the loss scale's two variables."""
    found = {v.name.split(":")[0]: v for v in optimizer.variables()}
    return found["current_loss_scale"], found["good_steps"]


class TensorFlowV1DynamicLossScale(Adapter):
    """``tf.compat.v1.mixed_precision.DynamicLossScale`` in a
    ``MixedPrecisionLossScaleOptimizer`` over ``tf.compat.v1.train.AdamOptimizer``.

    The loss scale has no hysteresis, floor or ceiling argument (it never backs off below
    1), no static or disabled mode and no setters; each wrapper updates its own loss scale
    once per ``apply_gradients``, so one scale cannot serve two optimizers: those tests and
    configs are skipped.
    """

    name = "tensorflow-v1"
    capabilities = frozenset({"state_dict", "jit"})
    fixed = {"backoff_factor": lambda c: 1.0 / c.growth_factor, "hysteresis": 1,
             "min_scale": None, "max_scale": None, "dynamic": True, "enabled": True}

    def expresses(self, config: ScalerConfig) -> str | None:
        reason = super().expresses(config)
        if reason is None and not (math.frexp(config.growth_factor)[0] == 0.5
                                   and config.growth_factor <= 2.0**126):
            reason = (f"TensorFlow divides by multiplier={config.growth_factor!r} on a backoff: "
                      "that equals multiplying by f32(1 / multiplier) only for a power of two")
        return reason

    def info(self) -> dict[str, Any]:
        import tensorflow as tf

        device = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
        return {"framework": "tensorflow", "version": tf.__version__, "device": device}

    def _run(self, config: ScalerConfig, params: list[Any], base: Any) -> _Run:
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"tf.compat.v1 DynamicLossScale cannot run {config.to_dict()}: "
                             f"{reason}")
        import tensorflow as tf

        loss_scale = tf.compat.v1.mixed_precision.DynamicLossScale(
            initial_loss_scale=config.init_scale, increment_period=config.growth_interval,
            multiplier=config.growth_factor)
        optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            base, loss_scale)
        w, b = params

        def step(x: Any) -> None:
            # |loss| < 1 and d(loss)/d(params) do not depend on the parameters: a finite
            # step stays finite at every float32 scale.
            optimizer.minimize(lambda: tf.reduce_sum(tf.linalg.matvec(x, w) + b) * 2.0**-4,
                               var_list=params)

        return _Run(loss_scale, optimizer, base, params, step, tf.function(step), config)

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        if optimizers != 1:
            raise ValueError("a MixedPrecisionLossScaleOptimizer updates its loss scale at each "
                             f"apply_gradients: one optimizer only, not {optimizers}")
        import tensorflow as tf

        params = [tf.Variable(tf.fill([4], 0.1)), tf.Variable(0.1)]  # pyright: ignore[reportArgumentType]
        return self._run(config, params, tf.compat.v1.train.AdamOptimizer(1e-3))

    def iterate(self, handle: Any, kinds: str, compiled: bool = False) -> Any:
        import tensorflow as tf

        if len(kinds) != 1:
            raise ValueError(f"{len(kinds)} kinds for 1 optimizer")
        x = np.full((2, 4), 0.5, np.float32)
        x[0, 1] = STEP_KINDS[kinds]
        (handle.compiled if compiled else handle.eager)(tf.constant(x))
        return handle

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        return self.iterate(handle, kinds, compiled=True)

    def read(self, handle: Any) -> ScalerState:
        scale, good_steps = _state_variables(handle.optimizer)
        return ScalerState(float(scale.numpy()), int(good_steps.numpy()), 0)

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        # The parameters and Adam's moments (made on the first step that applies, at 0);
        # beta1_power and beta2_power change with them.
        slots = [handle.base.get_slot(p, name) for name in handle.base.get_slot_names()
                 for p in handle.params]
        return [np.array(v.numpy()) for v in [*handle.params, *slots] if v is not None]

    def save(self, handle: Any) -> dict[str, Any]:
        return to_state_dict(handle.config, self.read(handle), "tensorflow-v1")

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        config, state = parse_state_dict(state_dict)
        if state.hysteresis_tracker:
            raise ValueError("tf.compat.v1 DynamicLossScale has no hysteresis tracker: cannot "
                             f"load hysteresis_tracker={state.hysteresis_tracker}")
        run = self._run(config, handle.params, handle.base)
        scale, good_steps = _state_variables(run.optimizer)
        scale.assign(np.float32(state.scale))
        good_steps.assign(np.int64(state.growth_tracker))
        return run


_SOURCE = "tensorflow/python/training/experimental"
_SNIPPETS = "docs/snippets/zoo/tensorflow-v1"

DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="floor of 1",
        sentence="A backoff never goes below 1: update takes maximum(current_loss_scale / "
                 "multiplier, 1), which also lifts a scale that started below 1 up to 1 at "
                 "its first overflow.",
        matters="Only for a model whose float16 gradients overflow even unscaled: at a scale "
                "of 1 every step then overflows and is skipped, where the spec's scale goes "
                "below 1 and training goes on. Growth timing, growth overflow (the scale is "
                "kept), NaN handling and the float32 products match the spec.",
        checked=f"{_SOURCE}/loss_scale.py (tensorflow 2.21.0), DynamicLossScale.update, "
                "update_if_not_finite_grads, lines 411-412: math_ops.maximum("
                "self._current_loss_scale / self._multiplier, 1). backoff_below_one (2, "
                "IIIF): max(2 / 2, 1) = 1, then max(1 / 2, 1) = 1 (the spec 0.5). "
                "reciprocal_overflow_skips_finite_steps (2**-130): 1 / 2**-130 is inf, the "
                "step is skipped as in the spec, then max(2**-131, 1) = 1 (the spec 2**-131).",
        snippet=f"{_SNIPPETS}/floor_of_1.py"),
    Difference(
        cause="flushes a subnormal 1/scale to zero",
        sentence="It unscales by multiplying with 1 / loss_scale, and TensorFlow's CPU kernels "
                 "flush a subnormal result to 0, so above a scale of 2**126 the reciprocal is 0 "
                 "and a finite step applies zero gradients: no parameter or moment moves, as "
                 "if the step were skipped (the scale updates as for a finite step).",
        matters="No: a scale above 8.5e37 never occurs in fp16 training (a float16 loss times "
                "it overflows); only a config that starts there sees it.",
        checked=f"{_SOURCE}/loss_scale_optimizer.py (tensorflow 2.21.0), "
                "MixedPrecisionLossScaleOptimizer._unscale_grads, lines 140 and 151: "
                "loss_scale_reciprocal = 1 / loss_scale; grad * loss_scale_reciprocal. "
                "growth_overflow_keeps_scale (2**127, interval 1, FFIF): 1 / 2**127 = 2**-127 "
                "flushes to 0.0 (seen: 1 / tf.Variable(2.0**127) is 0.0, eagerly and under "
                "tf.function), the gradients 2**123 become 0 where the spec's are 2**-4, Adam "
                "moves nothing; the scale (2**127 * 2 = inf, kept) and good_steps match the "
                "spec.",
        snippet=f"{_SNIPPETS}/flushes_a_subnormal_reciprocal_to_zero.py"),
)
