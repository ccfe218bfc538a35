"""Keras on TensorFlow under ``tf.distribute.MultiWorkerMirroredStrategy``: two worker
processes on this machine, one CPU replica each, a custom training loop.

Engine:

- ``multiworker``: two local workers (``TF_CONFIG`` per process, two free ports), one
  replica each; every step runs ``strategy.run`` of a replica function that takes the
  gradients of ``opt.scale_loss(loss)`` and calls ``opt.apply(grads)``, in a
  ``tf.function``. Worker ``r`` plants step ``i``'s kind ``kinds[r][i]`` in its own
  example (an inf or NaN makes only its gradients non-finite).

Scalers:

- ``unifiedamp``: ``KerasGradScaler(...).wrap(keras.optimizers.SGD(...))``, which ORs
  found_inf over every replica of every worker before it decides.
- ``keras``: ``keras.optimizers.LossScaleOptimizer(SGD)``, which takes each worker's own
  first replica's flag: with an inf on one worker only, that worker skips while the other
  waits in the gradients' all-reduce, and the run deadlocks: the strategy's collectives
  wait at most ``collective_timeout`` seconds
  (``CommunicationOptions(timeout_seconds=)``), then raise ``DeadlineExceededError``.

The records follow :mod:`unifiedamp.conformance.engines`: each worker's own copy of the
scale and trackers (``dynamic_scale``, ``step_counter``, ``hysteresis_counter``; Keras's
class has no hysteresis, recorded 0), and the whole model's weights. The loss of each
worker is divided by the number of workers (the strategy sums the gradients), so the
reference is a single process taking the spec's steps on the mean gradient.

MirroredStrategy over several CPUs in one process (``model.fit`` and a custom loop) is
tested in ``tests/keras/test_keras_distributed.py``.

Example:
    >>> sorted(ENGINES), sorted(SCALERS)
    (['multiworker'], ['keras', 'unifiedamp'])
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from unifiedamp.conformance.engines import (
    COLLECTIVE_TIMEOUT,
    DEFAULT_CONFIG,
    Run,
    check_kinds,
    default_kinds,
    free_ports,
    launch,
    rank_main,
    step_record,
)
from unifiedamp.conformance.engines._linear import (
    FEATURES,
    LEARNING_RATE,
    LOSS_FACTOR,
    START,
    example,
    reference,
)
from unifiedamp.spec import ScalerConfig, f32

ENGINES: dict[str, str] = {
    "multiworker": "tf.distribute.MultiWorkerMirroredStrategy, 2 local workers (TF_CONFIG), "
                   "one CPU replica each, custom loop (strategy.run + optimizer.apply)",
}
SCALERS: dict[str, str] = {
    "unifiedamp": "unifiedamp.backends.keras.KerasGradScaler(...).wrap(keras.optimizers.SGD)",
    "keras": "keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD)",
}

#: Workers per engine.
WORLD = {"multiworker": 2}

_MODULE = "unifiedamp.conformance.engines.tensorflow"


def _native_config(config: ScalerConfig) -> None:
    # What keras.optimizers.LossScaleOptimizer can express.
    expressible = ScalerConfig(config.init_scale, growth_interval=config.growth_interval)
    if config != expressible:
        raise ValueError(
            f"config {config}: keras.optimizers.LossScaleOptimizer has only initial_scale and "
            "dynamic_growth_steps (growth 2, backoff 0.5, hysteresis 1, no bounds); give a "
            "ScalerConfig(init_scale, growth_interval=N)")


def run(engine: str, scaler: str, kinds: Sequence[str] | None = None,
        config: ScalerConfig | None = None, timeout: float | None = None,
        collective_timeout: float = COLLECTIVE_TIMEOUT) -> Run:
    """Runs ``engine`` with ``scaler`` as :data:`WORLD` worker processes; see the module.

    Args:
        kinds: Per worker, one gradient kind per step (default
            :func:`~unifiedamp.conformance.engines.default_kinds`).
        config: The scaler's config (default
            :data:`~unifiedamp.conformance.engines.DEFAULT_CONFIG`).
        timeout: Seconds before every worker is killed (status ``"deadlock"``); by
            default 120, and 90 for ``keras``, which deadlocks (a run of the two workers
            takes 20 to 30 s on two cores).
        collective_timeout: Seconds a worker waits in one collective before TensorFlow
            raises ``DeadlineExceededError``: the run is then a deadlock, found before
            ``timeout``.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    if scaler not in SCALERS:
        raise ValueError(f"scaler {scaler!r}: one of {', '.join(SCALERS)}")
    world = WORLD[engine]
    kinds = list(default_kinds(world) if kinds is None else kinds)
    config = DEFAULT_CONFIG if config is None else config
    check_kinds(kinds, world)
    if scaler == "keras":
        _native_config(config)
    # One port per worker's server (launch's own port is for one rendezvous).
    workers = [f"localhost:{p}" for p in free_ports(world)]

    def env(rank: int) -> dict[str, str]:
        return {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
                "CUDA_VISIBLE_DEVICES": "", "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})}

    job = {"engine": engine, "scaler": scaler, "kinds": kinds, "config": config.to_dict(),
           "collective_timeout": collective_timeout}
    if timeout is None:
        timeout = 90.0 if scaler == "keras" else 120.0
    outcome = launch(_MODULE, job, world, timeout=timeout, env=env)
    return Run(config, kinds, outcome, replicas=True, reference=reference(kinds))


# ------------------------------------------------------------ the worker program


def train(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One worker: its records, one per step (run by :func:`run` through ``launch``; the
    cluster from ``TF_CONFIG``)."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=job["collective_timeout"]))
    import keras

    from unifiedamp.backends.keras import KerasGradScaler

    world, rank = job["world"], job["rank"]
    if strategy.num_replicas_in_sync != world:
        raise RuntimeError(f"{strategy.num_replicas_in_sync} replicas in sync for {world} "
                           "workers: each worker should see one CPU")
    config = ScalerConfig(**job["config"])
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((FEATURES,)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(START),  # pyright: ignore[reportArgumentType]
                               bias_initializer=keras.initializers.Constant(START))])  # pyright: ignore[reportArgumentType]
        inner = keras.optimizers.SGD(LEARNING_RATE)
        if job["scaler"] == "keras":
            opt = keras.optimizers.LossScaleOptimizer(
                inner, initial_scale=f32(config.init_scale),
                dynamic_growth_steps=config.growth_interval)
        else:
            opt = KerasGradScaler(**job["config"]).wrap(inner)
        opt.build(model.trainable_variables)

    def replica_fn(x: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x)) * (LOSS_FACTOR / world)
            scaled: Any = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    @tf.function
    def step(x: Any) -> None:
        strategy.run(replica_fn, args=(x,))

    def local(variable: Any) -> float:
        # This worker's copy (its one replica's).
        copies = strategy.experimental_local_results(getattr(variable, "value", variable))
        return float(np.asarray(copies[0].numpy()))

    def weights() -> list[np.ndarray]:
        return [np.asarray(v.numpy()) for v in model.trainable_variables]

    hysteresis = getattr(opt, "hysteresis_counter", None)
    records = []
    for kind in job["kinds"][rank]:
        x = strategy.experimental_distribute_values_from_function(
            lambda _ctx, kind=kind: tf.constant(example(kind)))
        before = weights()
        step(x)
        after = weights()
        state = (local(opt.dynamic_scale), local(opt.step_counter),
                 0 if hysteresis is None else local(hysteresis))
        stepped = any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
        records.append(step_record(kind, state, stepped, after))
        # Where a run that deadlocks got to (its records are never written).
        print(f"step {len(records) - 1} {kind} done: scale {state[0]!r}", flush=True)
    return records


def collective_timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is TensorFlow's error for a collective that waited past
    ``CommunicationOptions(timeout_seconds=)``: a ``DeadlineExceededError``.

    Example:
        >>> collective_timed_out(TimeoutError("a socket's"))
        False
    """
    return type(exc).__name__ == "DeadlineExceededError"


if __name__ == "__main__":
    # Keras picks its backend at import; run() sets it too, this covers a hand-made launch.
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    rank_main(train, timed_out=collective_timed_out)
