"""The zoo's adapter of Keras 3's ``keras.optimizers.LossScaleOptimizer``, on whichever
Keras backend the process runs (``KERAS_BACKEND``: the zoo runs it on TensorFlow, JAX
and torch, one process each).

``iterate`` is the custom training loop of Keras's guides, with the backend's own
autodiff of ``optimizer.scale_loss(loss)``: ``tf.GradientTape`` then ``optimizer.apply``
on TensorFlow, ``loss.backward()`` then ``optimizer.apply`` on torch, and on JAX
``jax.grad`` over ``model.stateless_call`` then ``optimizer.stateless_apply`` (the
optimizer's stateful ``apply`` branches with ``jax.lax.cond``, which cannot assign
variables), the new values assigned back. ``compiled_iterate`` is
``model.train_on_batch``, the ``fit`` step: a ``tf.function`` on TensorFlow, ``jax.jit``
on JAX; Keras runs it eagerly on torch (``jit_compile="auto"`` is off there), so torch
does not declare ``jit``.

The optimizer holds its state in two variables, ``dynamic_scale`` and ``step_counter``
(the growth tracker); ``save`` and ``load`` go through ``save_own_variables`` /
``load_own_variables``, the calls a ``.keras`` checkpoint makes, and ``load`` rebuilds
the optimizer from the config first, as ``from_config`` does.

Example:
    >>> KerasLossScaleOptimizer.fixed["growth_factor"], KerasLossScaleOptimizer.fixed["hysteresis"]
    (2.0, 1)
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from unifiedamp._tree import tree_map
from unifiedamp.conformance.interface import Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import ScalerConfig, ScalerState, parse_state_dict, to_state_dict

__all__ = ["DIFFERENCES", "KerasLossScaleOptimizer"]


def _numpy(value: Any) -> np.ndarray:
    from keras import ops

    # A variable's tensor, read by its framework's own call: NumPy 2 warns on the
    # __array__ of TensorFlow's and torch's tensors, which ops.convert_to_numpy calls.
    value = getattr(value, "value", value)
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy().copy()
    if hasattr(value, "numpy"):
        return np.array(value.numpy())
    return np.array(ops.convert_to_numpy(value))


class KerasLossScaleOptimizer(Adapter):
    """``keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))`` training a
    ``Dense(1)`` model. Handles are ``(optimizer, model, config)``.

    Keras's class takes ``initial_scale`` and ``dynamic_growth_steps``; it doubles and
    halves (hard-coded), has no hysteresis, floor, ceiling, static or disabled mode,
    no setters and wraps one optimizer: those configs and tests are skipped.
    """

    dtypes = ("float16", "float32")
    fixed = {"growth_factor": 2.0, "backoff_factor": 0.5, "hysteresis": 1, "min_scale": None,
             "max_scale": None, "dynamic": True, "enabled": True}

    def __init__(self) -> None:
        import keras

        self.backend = keras.backend.backend()
        self.name = f"keras-{self.backend}"
        capabilities = {"scale_tree", "state_dict"}
        if self.backend in ("tensorflow", "jax"):
            capabilities.add("jit")
        self.capabilities = frozenset(capabilities)

    def info(self) -> dict[str, Any]:
        import keras

        device = str(keras.Variable(0.0).value.device).lower().split("device:")[-1]
        return {"framework": f"keras ({self.backend})", "version": keras.__version__,
                "device": device}

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        if optimizers != 1:
            raise ValueError("a LossScaleOptimizer wraps one optimizer")
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"keras's LossScaleOptimizer cannot run {config.to_dict()}: "
                             f"{reason}")
        import keras

        from unifiedamp.conformance.adapters.keras import compile_loss

        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
            1, kernel_initializer=keras.initializers.Constant(0.1),  # pyright: ignore[reportArgumentType]
            bias_initializer=keras.initializers.Constant(0.1))])  # pyright: ignore[reportArgumentType]
        opt = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam(1e-3), initial_scale=config.init_scale,
            dynamic_growth_steps=config.growth_interval)
        opt.build(model.trainable_variables)
        model.compile(optimizer=opt, loss=compile_loss)
        return opt, model, config

    def iterate(self, handle: Any, kinds: str) -> Any:
        from unifiedamp.conformance.adapters.keras import inputs, scaled_gradients

        opt, model, _ = handle
        variables = model.trainable_variables
        grads = scaled_gradients(model, opt.scale_loss, inputs(kinds))
        if self.backend != "jax":
            opt.apply(grads, variables)
            return handle
        # On JAX the stateful apply runs only inside a traced train step: the stateless one,
        # its results assigned back, is what such a step does.
        trainable, opt_values = opt.stateless_apply(
            [v.value for v in opt.variables], grads, [v.value for v in variables])
        for v, value in zip([*variables, *opt.variables], [*trainable, *opt_values],
                            strict=True):
            v.assign(value)
        return handle

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        from unifiedamp.conformance.adapters.keras import inputs

        handle[1].train_on_batch(inputs(kinds), np.zeros((2, 1), np.float32))
        return handle

    def read(self, handle: Any) -> ScalerState:
        opt = handle[0]
        return ScalerState(float(_numpy(opt.dynamic_scale)), int(_numpy(opt.step_counter)), 0)

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        opt, model, _ = handle
        return [_numpy(v) for v in [*model.trainable_variables,
                                    *opt.inner_optimizer.variables]]

    def _store(self, opt: Any) -> tuple[dict[str, np.ndarray], str, str]:
        store: dict[str, np.ndarray] = {}
        with warnings.catch_warnings():
            # Keras's Variable.numpy() is np.array(self), which NumPy 2 warns about.
            warnings.filterwarnings("ignore", "__array__ implementation doesn't accept a copy",
                                    DeprecationWarning)
            opt.save_own_variables(store)
        index = {id(v): str(i) for i, v in enumerate(opt.variables)}
        return store, index[id(opt.dynamic_scale)], index[id(opt.step_counter)]

    def save(self, handle: Any) -> dict[str, Any]:
        opt, _, config = handle
        store, scale, counter = self._store(opt)
        config = config.replace(init_scale=float(opt.initial_scale),
                                growth_interval=int(opt.dynamic_growth_steps))
        return to_state_dict(config, ScalerState(float(store[scale]), int(store[counter]), 0),
                             "keras")

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        config, state = parse_state_dict(state_dict)
        if state.hysteresis_tracker:
            raise ValueError("keras's LossScaleOptimizer has no hysteresis tracker: cannot "
                             f"load hysteresis_tracker={state.hysteresis_tracker}")
        old_opt, old_model = handle[0], handle[1]
        opt, model, config = self.new(config)
        model.set_weights(old_model.get_weights())
        store, scale, counter = self._store(old_opt)
        store[scale] = np.asarray(state.scale, store[scale].dtype)
        store[counter] = np.asarray(state.growth_tracker, store[counter].dtype)
        opt.load_own_variables(store)
        return opt, model, config

    def scale_tree(self, handle: Any, tree: Any) -> Any:
        from keras import ops

        return tree_map(lambda leaf: _numpy(handle[0].scale_loss(ops.convert_to_tensor(leaf))),
                        tree)


_SOURCE = "keras/src/optimizers/loss_scale_optimizer.py (keras 3.15.1)"
_SNIPPETS = "docs/snippets/zoo/keras-tensorflow"

DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="growth overflows to inf",
        sentence="A growth has no inf guard: at 2**127 the scale doubles to inf, and from then "
                 "on every scaled loss and gradient is inf or NaN, so every later step is "
                 "skipped and the scale stays inf (inf * 0.5 = inf).",
        matters="Yes, in long runs whose gradients never overflow (a zero loss, frozen or "
                "unused weights): with the default 2000 steps the scale reaches 2**127 after "
                "112 growths from 2**15 (224,000 finite steps in a row) and the next growth "
                "stops training for good.",
        checked=f"{_SOURCE}: the growth (upscale in _stateful_handle_finite_grads, line 229, "
                "and in _stateless_handle_finite_grads, line 151) assigns "
                "ops.multiply(dynamic_scale, 2.0) with no finiteness check. "
                "growth_overflow_keeps_scale (2**127, interval 1, FFIF): step 1 gives "
                "f32(2**128) = inf (seen on tensorflow, jax and torch, eager and compiled); "
                "the spec keeps 2**127. Then scale_loss gives inf, check_finite is False and "
                "the backoff gives inf * 0.5 = inf; the parameters stay as they were.",
        snippet=f"{_SNIPPETS}/growth_overflows_to_inf.py"),
    Difference(
        cause="flushes subnormals to zero",
        sentence="On TensorFlow and JAX, whose CPU kernels flush subnormal float32 values to "
                 "zero, a backoff below 2**-126 gives 0 instead of a subnormal scale, and a "
                 "subnormal scale reads as 0 (the scaled loss and the scale the gradients are "
                 "divided by); torch keeps subnormal scales, as the spec does.",
        matters="No by itself: the scale reaches 2**-126 only after 141 overflows in a row "
                "from 2**15; it brings the scale of 0, and the NaN weights of the next finite "
                "step (below), 23 overflows sooner than on torch.",
        checked=f"{_SOURCE}: the backoff assigns ops.multiply(dynamic_scale, 0.5) (lines 195 "
                "and 244). From 2**-126, one overflow: 0.0 on tensorflow and jax, 2**-127 "
                "(0x00400000) on torch and in the spec. backoff_reaches_zero_and_stays "
                "(2**-148, interval 1, IIFF): 0.0 at step 1 where the spec gives 2**-149. "
                "reciprocal_overflow_skips_finite_steps (2**-130, FFF): scale_loss gives 0, the "
                "gradients are 0 and the growth 2**-130 * 2 gives 0.0 (torch 2**-129; the spec "
                "skips the step and backs off to 2**-131).",
        snippet=f"{_SNIPPETS}/flushes_subnormals_to_zero.py",
        columns=("keras-tensorflow", "keras-jax")),
    Difference(
        cause="takes a finite step whose 1/scale overflows",
        sentence="It checks the scaled gradients before dividing them by the scale, so it "
                 "takes a finite step at a scale whose reciprocal overflows float32, where the "
                 "spec skips it and backs off: at a subnormal scale on torch the division is "
                 "exact and the scale grows on; at a scale of 0 (on TensorFlow and JAX, at any "
                 "subnormal scale, read as 0) the gradients are 0 / 0 = NaN and every weight "
                 "becomes NaN.",
        matters="Rarely, but for good: the scale reaches 0 only after 165 overflows in a row "
                "from 2**15 (142 on TensorFlow and JAX), and the first finite step after that "
                "turns every weight into NaN.",
        checked=f"{_SOURCE}: _common_apply and _tf_apply (and stateless_apply on JAX) test "
                "check_finite(grads) on the scaled gradients; the finite branch unscales with "
                "ops.divide(g, scale) (lines 174 and 220). reciprocal_overflow_skips_finite_steps "
                "(2**-130, interval 1, FFF): the gradients 2**-4 * 2**-130 are finite, the step "
                "is taken and the scale doubles on torch (2**-129, 2**-128, 2**-127, weights "
                "finite); tensorflow and jax read 2**-130 as 0 and take the step with 0 / 0 = "
                "NaN. backoff_reaches_zero_and_stays (2**-148, IIFF): the two overflows give 0 "
                "(2**-149 * 0.5 rounds to 0), the finite step 3 is taken with 0 / 0 = NaN: the "
                "weights read NaN after step 3 (seen on all three backends). The spec skips "
                "both (1 / 2**-130 and 1 / 0 overflow).",
        snippet=f"{_SNIPPETS}/takes_a_finite_step_whose_reciprocal_overflows.py"),
    Difference(
        cause="grows only when the tracker equals the interval",
        sentence="It grows only when step_counter == dynamic_growth_steps - 1 and otherwise "
                 "adds 1, so a counter at or past the interval (variables saved under a "
                 "longer dynamic_growth_steps) never grows again until an overflow resets it "
                 "to 0.",
        matters="Only after restoring optimizer variables into an optimizer with a smaller "
                "dynamic_growth_steps: the scale then stops growing until the next overflow, "
                "which with a well-chosen scale may be thousands of steps away.",
        checked=f"{_SOURCE}: ops.cond(ops.equal(step_counter, dynamic_growth_steps - 1), "
                "upscale, increment) (lines 164 and 236). Loaded counter 7, interval 5: 7 != 4, "
                "counter 8 (seen: scale 1024.0, tracker 8), then 9, 10, ...; the spec grows "
                "on the first finite step (7 + 1 >= 5). An overflow assigns step_counter 0, "
                "after which growth comes every 5 finite steps again.",
        snippet=f"{_SNIPPETS}/grows_only_when_the_tracker_equals_the_interval.py"),
)
