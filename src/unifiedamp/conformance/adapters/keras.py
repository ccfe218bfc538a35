"""How the conformance suite drives the Keras backend, on whichever Keras backend is loaded.

``iterate`` is a custom training loop with the backend's own autodiff
(``tf.GradientTape``, torch autograd, ``jax.grad`` over ``stateless_call``) and
the wrapped optimizer's ``apply``; ``compiled_iterate`` is ``model.train_on_batch``,
the compiled ``fit`` step (``tf.function``, ``jax.jit``; eager on torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, cast

import keras
import numpy as np
from keras import ops

from unifiedamp._tree import tree_map as _map
from unifiedamp.conformance.interface import STEP_KINDS, Adapter
from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["KerasAdapter", "compile_loss", "inputs", "loss_of", "run_replicas",
           "scaled_gradients"]


def loss_of(y_pred: Any) -> Any:
    # |loss| < 1 and d(loss)/d(weights) do not depend on the weights, so a finite
    # step stays finite at every float32 scale.
    total: Any = ops.sum(y_pred)
    return total * 2.0**-4


def compile_loss(y_true: Any, y_pred: Any) -> Any:
    return loss_of(y_pred)


def inputs(kind: str) -> np.ndarray:
    x = np.full((2, 4), 0.5, np.float32)
    x[0, 1] = STEP_KINDS[kind]
    return x


def scaled_gradients(model: keras.Model, scale: Any, x: np.ndarray) -> list[Any]:
    """The gradients of ``scale(loss_of(model(x)))`` by the backend's own autodiff."""
    backend = keras.backend.backend()
    variables = model.trainable_variables
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = scale(loss_of(model(x)))
        return tape.gradient(loss, variables)
    if backend == "torch":
        for v in variables:
            v.value.grad = None
        scale(loss_of(model(x))).backward()
        return [v.value.grad for v in variables]
    if backend == "jax":
        import jax

        def f(trainable: list[Any]) -> Any:
            y, _ = cast("tuple[Any, list[Any]]", model.stateless_call(
                trainable, [v.value for v in model.non_trainable_variables], x))
            return scale(loss_of(y))

        return jax.grad(f)([v.value for v in variables])
    raise NotImplementedError(f"no custom loop for the {backend!r} Keras backend")


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(1e-3),
    "sgd": lambda: keras.optimizers.SGD(1e-2, momentum=0.9),
}


def make_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
        1, kernel_initializer=keras.initializers.Constant(0.1),  # pyright: ignore[reportArgumentType]
        bias_initializer=keras.initializers.Constant(0.1))])  # pyright: ignore[reportArgumentType]
    return model


def _device() -> str:
    """Where the Keras backend puts new variables (what the report header names)."""
    return str(keras.Variable(0.0).value.device).lower().split("device:")[-1]


def fit_step_model(scaler: Any, optimizer: str = "adam") -> tuple[keras.Model, Any]:
    """The adapter's model, compiled with ``scaler.wrap(optimizer)`` (in the current
    distribution scope, if any): ``(model, wrapped optimizer)``."""
    model = make_model()
    opt = scaler.wrap(OPTIMIZERS[optimizer]())
    opt.build(model.trainable_variables)
    model.compile(optimizer=opt, loss=compile_loss)
    return model, opt


class KerasAdapter(Adapter):
    """One ``Dense(1)`` model and one wrapped optimizer per scaler (a Keras scaler wraps one
    optimizer, and each wrapped optimizer holds its own scale: no ``multi_optimizer``).

    Args:
        scaler_cls: The Keras backend's scaler class, or a subclass.
        optimizer: ``"adam"`` (default) or ``"sgd"`` (with momentum).

    Example:
        >>> from unifiedamp.backends.keras import KerasGradScaler
        >>> KerasAdapter(KerasGradScaler).name.startswith("keras[")
        True
    """

    dtypes = ("float16", "float32")

    def __init__(self, scaler_cls: Any, optimizer: str = "adam"):
        self.scaler_cls = scaler_cls
        self.scaler_type = scaler_cls
        self.optimizer = optimizer
        suffix = "" if optimizer == "adam" else f",{optimizer}"
        self.name = f"keras[{keras.backend.backend()}{suffix}]"
        capabilities = {"functional_unscale", "scale_tree", "disable", "state_dict", "jit",
                        "set_config"}
        if keras.backend.backend() in ("tensorflow", "jax"):
            # MirroredStrategy / DataParallel in a child process; Keras has no data
            # parallelism of its own on torch.
            capabilities.add("distributed")
        self.capabilities = frozenset(capabilities)

    def info(self) -> dict[str, Any]:
        return {"framework": "keras", "version": keras.__version__,
                "device": f"{keras.backend.backend()} {_device()}"}

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        if optimizers != 1:
            raise ValueError("the keras adapter trains one optimizer per scaler")
        scaler = self.scaler_cls(**config.to_dict())
        model, opt = fit_step_model(scaler, self.optimizer)
        return scaler, model, opt

    def iterate(self, handle: Any, kinds: str) -> Any:
        scaler, model, opt = handle
        grads = scaled_gradients(model, scaler.scale, inputs(kinds))
        opt.apply(grads, model.trainable_variables)
        return handle

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        """One ``model.train_on_batch`` step: the ``fit`` path, compiled by the backend.

        A config change needs no retrace: the compiled step reads the rule from the
        optimizer's variables, which the inherited ``reconfigure`` sets."""
        model = handle[1]
        model.train_on_batch(inputs(kinds), np.zeros((2, 1), np.float32))
        return handle

    def read(self, handle: Any) -> ScalerState:
        return handle[0].state

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        _, model, opt = handle
        inner = getattr(opt, "inner_optimizer", opt)
        return [np.array(ops.convert_to_numpy(v)) for v in
                [*model.trainable_variables, *inner.variables]]

    def save(self, handle: Any) -> dict[str, Any]:
        return handle[0].state_dict()

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        handle[0].load_state_dict(state_dict)
        return handle

    def scale_tree(self, handle: Any, tree: Any) -> Any:
        out = handle[0].scale(_map(ops.convert_to_tensor, tree))
        return _map(lambda t: np.asarray(ops.convert_to_numpy(t)), out)

    def unscale_tree(self, handle: Any, tree: Any) -> tuple[Any, bool]:
        out, finite = handle[0].unscale(tree)
        return _map(lambda t: np.asarray(ops.convert_to_numpy(t)), out), bool(finite)

    def distributed_iterate(self, handle: Any, kinds_per_rank: list[str]) -> list[ScalerState]:
        """One ``fit`` step with one replica per rank (``MirroredStrategy`` over logical
        CPUs on TensorFlow, ``DataParallel`` over host devices on JAX) in a fresh
        process; each replica's copy of the state after it. The child builds the
        built-in ``KerasGradScaler``: a subclass is not carried over."""
        states = run_replicas(keras.backend.backend(), handle[0].config.to_dict(),
                              list(kinds_per_rank), self.optimizer)
        return [ScalerState(float(s), int(g), int(h)) for s, g, h in states]


def run_replicas(backend: str, config: dict[str, Any], kinds: list[str],
                 optimizer: str = "adam", timeout: float = 300) -> list[list[float]]:
    """Runs :mod:`unifiedamp.conformance.adapters.keras_replicas` for ``backend`` in a fresh
    process (the Keras backend and the device count are fixed when a process starts
    them); returns ``[scale, growth, hysteresis]`` per replica. ``optimizer``: the
    adapter's ``"adam"`` or ``"sgd"``."""
    if backend not in ("tensorflow", "jax"):
        raise ValueError(f"no data-parallel run for the {backend!r} Keras backend: "
                         "use 'tensorflow' or 'jax'")
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if backend == "jax":
        env.update(JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={len(kinds)}")
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    child = "unifiedamp.conformance.adapters.keras_replicas"
    proc = subprocess.run([sys.executable, "-m", child, json.dumps([config, kinds, optimizer])],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the {backend} replica run failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
