"""One Keras ``fit`` step on several replicas; run as a program of its own.

``python -m unifiedamp.conformance.adapters.keras_replicas '[CONFIG, KINDS, OPTIMIZER]'``
under ``KERAS_BACKEND=tensorflow`` (``tf.distribute.MirroredStrategy`` over
``len(KINDS)`` logical CPUs, configured here before TensorFlow starts) or
``KERAS_BACKEND=jax`` (Keras's ``DataParallel`` over host devices: set
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before it starts).
:func:`unifiedamp.conformance.adapters.keras.run_replicas` does both. The global
batch holds one example per replica; replica ``i``'s example plants kind ``KINDS[i]``
(an inf or a NaN makes that replica's gradients non-finite, the others' stay finite).
Prints one JSON line: each replica's copy of the scale and both trackers after the step.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from unifiedamp.conformance.interface import STEP_KINDS


def _batch(kinds: list[str]) -> Any:
    import numpy as np

    x = np.full((len(kinds), 4), 0.5, np.float32)
    for r, kind in enumerate(kinds):
        x[r, 1] = STEP_KINDS[kind]
    return x


def _tensorflow(config: dict[str, Any], kinds: list[str], optimizer: str) -> list[list[float]]:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * len(kinds))
    from unifiedamp.backends.keras import KerasGradScaler
    from unifiedamp.conformance.adapters.keras import fit_step_model

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(len(kinds))])
    with strategy.scope():
        model, opt = fit_step_model(KerasGradScaler(**config), optimizer)
    model.fit(_batch(kinds), _zeros(len(kinds)), batch_size=len(kinds), epochs=1,
              shuffle=False, verbose=0)  # pyright: ignore[reportArgumentType]

    def copies(variable: Any) -> list[float]:
        return [float(t.numpy()) for t in
                strategy.experimental_local_results(getattr(variable, "value", variable))]

    return [list(s) for s in zip(copies(opt.dynamic_scale), copies(opt.step_counter),
                                 copies(opt.hysteresis_counter), strict=True)]


def _jax(config: dict[str, Any], kinds: list[str], optimizer: str) -> list[list[float]]:
    import keras

    from unifiedamp.backends.keras import KerasGradScaler
    from unifiedamp.conformance.adapters.keras import fit_step_model

    devices = keras.distribution.list_devices()
    if len(devices) != len(kinds):
        raise RuntimeError(f"{len(devices)} devices for {len(kinds)} replicas: set "
                           "XLA_FLAGS=--xla_force_host_platform_device_count before jax starts")
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    model, opt = fit_step_model(KerasGradScaler(**config), optimizer)
    model.fit(_batch(kinds), _zeros(len(kinds)), batch_size=len(kinds), epochs=1,
              shuffle=False, verbose=0)  # pyright: ignore[reportArgumentType]
    order = [str(d) for d in devices]

    def copies(variable: Any) -> list[float]:
        shards = variable.value.addressable_shards
        by_device = {f"{s.device.platform}:{s.device.id}": s for s in shards}
        return [float(by_device[d].data) for d in order]

    return [list(s) for s in zip(copies(opt.dynamic_scale), copies(opt.step_counter),
                                 copies(opt.hysteresis_counter), strict=True)]


def _zeros(n: int) -> Any:
    import numpy as np

    return np.zeros((n, 1), np.float32)


def main(argv: list[str]) -> None:
    config, kinds, optimizer = json.loads(argv[0])
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    run = {"tensorflow": _tensorflow, "jax": _jax}.get(backend)
    if run is None:
        raise SystemExit(f"KERAS_BACKEND={backend!r}: run under 'tensorflow' or 'jax'")
    print(json.dumps(run(config, kinds, optimizer)))


if __name__ == "__main__":
    main(sys.argv[1:])
