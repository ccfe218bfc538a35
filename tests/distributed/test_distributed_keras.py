"""Keras's own LossScaleOptimizer under Keras's JAX ``DataParallel`` over two host devices
(``model.fit``), an inf in one device's example at a time.

The program runs in an interpreter of its own (JAX's host devices are set by ``XLA_FLAGS``
before it starts, Keras's backend at its import): 6 to 12 s on two cores. The unifiedamp
scaler in the same setting: ``tests/keras/test_keras_distributed.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(importlib.util.find_spec("keras") is None
                       or importlib.util.find_spec("jax") is None,
                       reason="keras and jax not installed"),
]

CONFIG = ScalerConfig(1024.0, growth_interval=2)
# One step per entry, one character per device: F a finite example, I an inf one.
STEPS = ["FF", "FI", "FF", "FF", "FF", "IF"]
ENV = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}

# Prints one line: RESULT [...], each step's record read on every device.
PROGRAM = """
import json
import jax
import keras
import numpy as np

STEPS = {steps!r}
devices = keras.distribution.list_devices()
assert len(devices) == 2, devices
distribution = keras.distribution.DataParallel(devices=devices)
keras.distribution.set_distribution(distribution)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
opt = keras.optimizers.LossScaleOptimizer(
    keras.optimizers.Adam(0.1), initial_scale={scale!r}, dynamic_growth_steps={interval!r})
model.compile(optimizer=opt, loss="mse")
sharding = distribution.get_data_layout((2, 3)).backend_layout
order = [d.id for d in jax.devices()]

def copies(value):
    shards = sorted(value.addressable_shards, key=lambda s: order.index(s.device.id))
    return [np.asarray(s.data).tolist() for s in shards]

out = []
for kinds in STEPS:
    x = np.ones((2, 3), "float32")
    for device, kind in enumerate(kinds):
        if kind == "I":
            x[device, 0] = np.inf
    placed = copies(jax.device_put(x, sharding))
    model.fit(x, np.ones((2, 1), "float32"), batch_size=2, epochs=1, shuffle=False, verbose=0)
    out.append({{"inf_on": [float(not np.isfinite(shard).all()) for shard in placed],
                "scale": copies(opt.dynamic_scale.value),
                "growth": copies(opt.step_counter.value),
                "weights": [copies(v.value) for v in model.trainable_variables],
                "iterations": copies(opt.inner_optimizer.iterations.value)}})
print("RESULT " + json.dumps(out))
"""


def all_finite(value) -> bool:
    if isinstance(value, list):
        return all(all_finite(v) for v in value)
    return math.isfinite(value)


def expected_states() -> list[ScalerState]:
    """The spec's state after each step: found_inf is any device's inf."""
    state, out = ScalerState.initial(CONFIG), []
    for kinds in STEPS:
        state = spec.update(CONFIG, state, "I" in kinds)
        out.append(state)
    return out


def test_native_loss_scale_optimizer_under_jax_data_parallel_follows_the_spec(run_python):
    """Under jit the gradients of a DataParallel step are global already (the loss is a
    mean over the sharded batch): one device's inf is every device's, and Keras's own
    class skips on both devices, backs off and grows on the spec's schedule."""
    code = PROGRAM.format(steps=STEPS, scale=CONFIG.init_scale,
                          interval=CONFIG.growth_interval)
    proc = run_python(code, timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads(lines[-1][len("RESULT "):])
    previous = None
    for i, (rec, kinds, want) in enumerate(zip(records, STEPS, expected_states(),
                                               strict=True)):
        where = f"step {i} ({kinds})"
        # The inf reached the device it was meant for, and only that one.
        assert rec["inf_on"] == [1.0 if k == "I" else 0.0 for k in kinds], where
        for device in range(2):
            got = ScalerState(rec["scale"][device], rec["growth"][device], 0)
            assert got == want, f"{where}, device {device}: expected {want}, got {got}"
        for var in rec["weights"]:
            assert var[0] == var[1], f"{where}: the devices' weights differ"
            assert all_finite(var), where
        if previous is not None:
            stepped = rec["weights"] != previous["weights"]
            assert stepped == ("I" not in kinds), where
            assert rec["iterations"][0] == previous["iterations"][0] + ("I" not in kinds)
        previous = rec
    assert [r["scale"][0] for r in records] == [1024.0, 512.0, 512.0, 1024.0, 1024.0, 512.0]
