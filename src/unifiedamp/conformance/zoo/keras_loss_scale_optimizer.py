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
    >>> from unifiedamp.spec import ScalerConfig
    >>> KerasLossScaleOptimizer.fixed["growth_factor"], KerasLossScaleOptimizer.fixed["hysteresis"]
    (2.0, 1)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unifiedamp._tree import tree_map
from unifiedamp.conformance.adapters import STEP_KINDS, Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import ScalerConfig, ScalerState, parse_state_dict, to_state_dict

__all__ = ["DIFFERENCES", "KerasLossScaleOptimizer"]


def _loss(y_pred: Any) -> Any:
    from keras import ops

    # |loss| < 1 and d(loss)/d(weights) do not depend on the weights: a finite step
    # stays finite at every float32 scale.
    return ops.sum(y_pred) * 2.0**-4


def _compile_loss(y_true: Any, y_pred: Any) -> Any:
    return _loss(y_pred)


def _inputs(kind: str) -> np.ndarray:
    x = np.full((2, 4), 0.5, np.float32)
    x[0, 1] = STEP_KINDS[kind]
    return x


def _numpy(value: Any) -> np.ndarray:
    from keras import ops

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

        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
            1, kernel_initializer=keras.initializers.Constant(0.1),
            bias_initializer=keras.initializers.Constant(0.1))])
        opt = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam(1e-3), initial_scale=config.init_scale,
            dynamic_growth_steps=config.growth_interval)
        opt.build(model.trainable_variables)
        model.compile(optimizer=opt, loss=_compile_loss)
        return opt, model, config

    def iterate(self, handle: Any, kinds: str) -> Any:
        opt, model, _ = handle
        x = _inputs(kinds)
        variables = model.trainable_variables
        if self.backend == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                loss = opt.scale_loss(_loss(model(x)))
            opt.apply(tape.gradient(loss, variables), variables)
        elif self.backend == "torch":
            for v in variables:
                v.value.grad = None
            opt.scale_loss(_loss(model(x))).backward()
            opt.apply([v.value.grad for v in variables], variables)
        elif self.backend == "jax":
            import jax

            non_trainable = [v.value for v in model.non_trainable_variables]

            def scaled_loss(trainable: list[Any]) -> Any:
                y, _ = model.stateless_call(trainable, non_trainable, x)
                return opt.scale_loss(_loss(y))

            trainable = [v.value for v in variables]
            grads = jax.grad(scaled_loss)(trainable)
            trainable, opt_values = opt.stateless_apply(
                [v.value for v in opt.variables], grads, trainable)
            for v, value in zip(variables, trainable, strict=True):
                v.assign(value)
            for v, value in zip(opt.variables, opt_values, strict=True):
                v.assign(value)
        else:
            raise NotImplementedError(f"no custom loop for the {self.backend!r} Keras backend")
        return handle

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        handle[1].train_on_batch(_inputs(kinds), np.zeros((2, 1), np.float32))
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


DIFFERENCES: dict[str, Difference] = {}
