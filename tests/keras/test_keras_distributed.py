"""The Keras backend under data parallelism: found_inf is the OR over replicas.

Two replicas on one CPU each time: ``tf.distribute.MirroredStrategy`` over two logical
CPUs (``model.fit`` and a custom ``strategy.run`` loop), and Keras's JAX ``DataParallel``
over two host devices. A global batch of two examples gives each replica one; an inf in
one replica's example makes that replica's gradients inf and leaves the other's finite.
Every step is checked against the spec's reference rule (``spec.update`` with found_inf
= any replica's inf), on every replica's copy of the variables, and a skipped step must
leave weights and the inner optimizer's variables (Adam's moments, iterations) as they
were on every replica.

With XLA-compiled replicas on GPUs (and only there) TensorFlow runs ``apply()`` without
``merge_call``, and found_inf is all-reduced in the replica context: the custom loop runs
that way on two GPUs (two logical ones on a single GPU) where TensorFlow sees one, and is
skipped elsewhere.

Keras 3.15's own ``LossScaleOptimizer`` takes the first replica's flag under
MirroredStrategy: the test of the native class asserts that behaviour as measured (an
inf on replica 1 only is applied, and the scale grows instead of backing off).

Logical devices must be configured before TensorFlow or JAX initialise (JAX's host devices
by ``XLA_FLAGS`` before it is imported), and the Keras backend is chosen at import: every
test runs its program in a fresh interpreter (6 to 12 s each on 2 cores), with a timeout.
The program sets its own ``KERAS_BACKEND``, so each test runs in one of the keras sessions
alone, the one of its backend, and skips in the others.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from typing import Any

import pytest

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="keras not installed"),
]

CONFIG = ScalerConfig(1024.0, growth_interval=2)
TIMEOUT = 240
# One step per entry, one character per replica: F a finite example, I an inf one.
STEPS = ["FF", "FI", "FF", "FF", "FF", "IF"]

TF_ENV = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
JAX_ENV = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}

# Prints one line: RESULT {"steps": [...]}, each step's record read on every replica.
TF_PRELUDE = """
import json
import tensorflow as tf
DEVICE = {device!r}
physical = tf.config.list_physical_devices(DEVICE)
if not physical:
    print("SKIP TensorFlow sees no " + DEVICE + " (a CPU-only build of TensorFlow, or no driver)")
    raise SystemExit(0)
if len(physical) == 1:  # two logical devices on the one
    memory = {{"memory_limit": 1024}} if DEVICE == "GPU" else {{}}
    tf.config.set_logical_device_configuration(
        physical[0], [tf.config.LogicalDeviceConfiguration(**memory)] * 2)
import keras
import numpy as np
import unifiedamp as ua

STEPS = {steps!r}
NATIVE = {native!r}
strategy = tf.distribute.MirroredStrategy(["/" + DEVICE + ":0", "/" + DEVICE + ":1"])
assert strategy.num_replicas_in_sync == 2

def copies(v):
    return [np.asarray(t.numpy()).tolist()
            for t in strategy.experimental_local_results(getattr(v, "value", v))]

def record(opt, model):
    hyst = getattr(opt, "hysteresis_counter", None)
    counters = [getattr(opt, n, None) for n in ("update_count", "skipped_count", "last_skipped")]
    return {{"scale": copies(opt.dynamic_scale), "growth": copies(opt.step_counter),
            "hysteresis": copies(hyst) if hyst is not None else None,
            "counters": None if NATIVE else [copies(c) for c in counters],
            "weights": [copies(v) for v in model.trainable_variables],
            "inner": [copies(v) for v in opt.inner_optimizer.variables],
            "iterations": copies(opt.inner_optimizer.iterations)}}

with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    if NATIVE:
        opt = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam(0.1), initial_scale=1024.0, dynamic_growth_steps=2)
    else:
        opt = ua.GradScaler(1024.0, growth_interval=2, backend="keras").wrap(
            keras.optimizers.Adam(0.1))
"""

TF_FIT = TF_PRELUDE + """
    model.compile(optimizer=opt, loss="mse")

train_step = model.train_step

def recording_train_step(data):
    # Which replica saw a non-finite input: logs are averaged over replicas (0.5 each).
    logs = dict(train_step(data))
    bad = tf.cast(tf.logical_not(tf.reduce_all(tf.math.is_finite(data[0]))), "float32")
    rid = tf.distribute.get_replica_context().replica_id_in_sync_group
    for r in range(2):
        logs[f"inf_on_{{r}}"] = bad * tf.cast(tf.equal(rid, r), "float32")
    return logs

model.train_step = recording_train_step
out = []
for kinds in STEPS:
    x = np.ones((2, 3), "float32")
    for r, kind in enumerate(kinds):
        if kind == "I":
            x[r, 0] = np.inf
    history = model.fit(x, np.ones((2, 1), "float32"), batch_size=2, epochs=1,
                        shuffle=False, verbose=0)
    rec = record(opt, model)
    rec["inf_on"] = [history.history[f"inf_on_{{r}}"][0] * 2 for r in range(2)]
    out.append(rec)
print("RESULT " + json.dumps({{"steps": out}}))
"""

TF_CUSTOM_LOOP = TF_PRELUDE + """
    opt.build(model.trainable_variables)

no_merge_call = []

def replica_fn(x):
    # Traced once per replica: whether apply() runs without merge_call (XLA on GPUs only).
    no_merge_call.append(tf.__internal__.distribute.strategy_supports_no_merge_call())
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - 1.0) ** 2)
        scaled = opt.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)

if {xla!r}:
    replica_fn = tf.function(replica_fn, jit_compile=True)

@tf.function
def step(x):
    strategy.run(replica_fn, args=(x,))

def values(kinds):
    def value_fn(ctx):
        x = np.ones((1, 3), "float32")
        if kinds[ctx.replica_id_in_sync_group] == "I":
            x[0, 0] = np.inf
        return tf.constant(x)
    return strategy.experimental_distribute_values_from_function(value_fn)

out = []
try:
    for kinds in STEPS:
        step(values(kinds))
        rec = record(opt, model)
        rec["inf_on"] = [1.0 if k == "I" else 0.0 for k in kinds]
        out.append(rec)
except tf.errors.InvalidArgumentError as error:
    # Why Keras 3.15 turns XLA off under tf.distribute: TensorFlow places a compiled
    # replica on one device, away from the other replicas' variables (seen on CPUs).
    placement = [line for line in str(error).splitlines() if "Trying to access resource" in line]
    if not {xla!r} or not placement:
        raise
    print("SKIP XLA-compiled replicas of MirroredStrategy do not run here: " + placement[0])
    raise SystemExit(0)
print("RESULT " + json.dumps({{"steps": out, "no_merge_call": no_merge_call}}))
"""

JAX_FIT = """
import json
import jax
import keras
import numpy as np
import unifiedamp as ua

STEPS = {steps!r}
devices = keras.distribution.list_devices()
assert len(devices) == 2, devices
distribution = keras.distribution.DataParallel(devices=devices)
keras.distribution.set_distribution(distribution)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
opt = ua.GradScaler(1024.0, growth_interval=2, backend="keras").wrap(keras.optimizers.Adam(0.1))
model.compile(optimizer=opt, loss="mse")
sharding = distribution.get_data_layout((2, 3)).backend_layout
order = [d.id for d in jax.devices()]

def copies(v):
    shards = sorted(v.value.addressable_shards, key=lambda s: order.index(s.device.id))
    return [np.asarray(s.data).tolist() for s in shards]

out = []
for kinds in STEPS:
    x = np.ones((2, 3), "float32")
    for r, kind in enumerate(kinds):
        if kind == "I":
            x[r, 0] = np.inf
    placed = jax.device_put(x, sharding)
    shards = sorted(placed.addressable_shards, key=lambda s: order.index(s.device.id))
    model.fit(x, np.ones((2, 1), "float32"), batch_size=2, epochs=1, shuffle=False, verbose=0)
    out.append({{"scale": copies(opt.dynamic_scale), "growth": copies(opt.step_counter),
                "hysteresis": copies(opt.hysteresis_counter),
                "counters": [copies(c) for c in (opt.update_count, opt.skipped_count,
                                                 opt.last_skipped)],
                "weights": [copies(v) for v in model.trainable_variables],
                "inner": [copies(v) for v in opt.inner_optimizer.variables],
                "iterations": copies(opt.inner_optimizer.iterations),
                "inf_on": [float(not np.isfinite(np.asarray(s.data)).all()) for s in shards]}})
print("RESULT " + json.dumps({{"steps": out}}))
"""


def in_the_session_of(backend: str) -> pytest.MarkDecorator:
    """Runs the test in the keras session of ``backend`` alone: its program runs Keras on
    that backend whatever the session's is."""
    import keras

    session = keras.backend.backend()
    return pytest.mark.skipif(session != backend, reason=(
        f"KERAS_BACKEND={session}: the program runs Keras on {backend} in a process of its "
        f"own; the keras-{backend} session runs it"))


def run_program(run_python, code: str, env: dict, key: str | None = "steps") -> Any:
    """The program's RESULT (its ``key`` entry); skips the test where it printed SKIP."""
    proc = run_python(code, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIP ")]
    if skips:
        pytest.skip(skips[0][len("SKIP "):])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(lines[-1][len("RESULT "):])
    return result if key is None else result[key]


def expected_states(steps: list[str]) -> list[ScalerState]:
    """The reference state after each step: found_inf is any replica's inf."""
    state, out = ScalerState.initial(CONFIG), []
    for kinds in steps:
        state = spec.update(CONFIG, state, "I" in kinds)
        out.append(state)
    return out


def all_finite(value) -> bool:
    if isinstance(value, list):
        return all(all_finite(v) for v in value)
    return math.isfinite(value)


def assert_follows_the_spec(records: list[dict], steps: list[str]) -> None:
    assert len(records) == len(steps)
    previous = None
    for i, (rec, kinds, want) in enumerate(zip(records, steps, expected_states(steps),
                                               strict=True)):
        where = f"step {i} ({kinds})"
        # The inf reached the replica it was meant for, and only that one.
        assert rec["inf_on"] == [1.0 if k == "I" else 0.0 for k in kinds], where
        for replica in range(2):
            got = (rec["scale"][replica], rec["growth"][replica], rec["hysteresis"][replica])
            assert isinstance(got[1], int) and isinstance(got[2], int), f"{where}: {got}"
            assert spec.f32(got[0]) == got[0], f"{where}: {got[0]!r} is no float32 value"
            assert ScalerState(*got) == want, (
                f"{where}, replica {replica}: expected {want}, got {got}")
            # num_steps, num_skipped_steps, last_step_skipped: counted once per step.
            counters = [c[replica] for c in rec["counters"]]
            skipped = ["I" in k for k in steps[:i + 1]]
            assert counters == [i + 1, sum(skipped), int(skipped[-1])], f"{where}: {counters}"
        for key in ("weights", "inner"):
            for var in rec[key]:
                assert var[0] == var[1], f"{where}: the replicas' {key} differ"
        assert all_finite(rec["weights"]) and all_finite(rec["inner"]), where
        if previous is not None:
            if "I" in kinds:  # skipped: weights, moments and iterations untouched
                assert rec["weights"] == previous["weights"], where
                assert rec["inner"] == previous["inner"], where
            else:
                assert rec["weights"] != previous["weights"], where
                assert rec["iterations"][0] == previous["iterations"][0] + 1, where
        previous = rec
    assert records[1]["scale"] == [512.0, 512.0]  # the inf on replica 1 only backs off


def test_expected_states_back_off_then_grow_on_schedule():
    assert expected_states(STEPS) == [
        ScalerState(1024.0, 1, 0), ScalerState(512.0, 0, 0), ScalerState(512.0, 1, 0),
        ScalerState(1024.0, 0, 0), ScalerState(1024.0, 1, 0), ScalerState(512.0, 0, 0)]


@in_the_session_of("tensorflow")
def test_mirrored_fit_skips_on_every_replica_when_one_replica_overflows(run_python):
    code = TF_FIT.format(device="CPU", steps=STEPS, native=False)
    assert_follows_the_spec(run_program(run_python, code, TF_ENV), STEPS)


@in_the_session_of("tensorflow")
def test_mirrored_custom_loop_skips_on_every_replica(run_python):
    code = TF_CUSTOM_LOOP.format(device="CPU", steps=STEPS, native=False, xla=False)
    assert_follows_the_spec(run_program(run_python, code, TF_ENV), STEPS)


@pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason=(
    "needs an NVIDIA GPU: TensorFlow runs apply() without merge_call (where found_inf is "
    "all-reduced in the replica context) only for XLA-compiled replicas on GPUs; "
    "MirroredStrategy over CPUs always merges"))
@in_the_session_of("tensorflow")
def test_mirrored_xla_custom_loop_on_gpus_skips_on_every_replica(run_python):
    code = TF_CUSTOM_LOOP.format(device="GPU", steps=STEPS, native=False, xla=True)
    env = {k: v for k, v in TF_ENV.items() if k != "CUDA_VISIBLE_DEVICES"}
    result = run_program(run_python, code, env, key=None)
    # The path this test is for was taken (traced once per replica).
    assert result["no_merge_call"] and all(result["no_merge_call"]), result["no_merge_call"]
    assert_follows_the_spec(result["steps"], STEPS)


@in_the_session_of("tensorflow")
def test_native_loss_scale_optimizer_applies_an_inf_on_replica_1(run_python):
    """Keras 3.15's own class decides on replica 0's gradients (why ours exists): the
    inf on replica 1 reaches the weights and Adam's moments, and the step counts as
    finite (the scale grows to 2048 instead of backing off to 512)."""
    steps = STEPS[:2]
    code = TF_FIT.format(device="CPU", steps=steps, native=True)
    first, second = run_program(run_python, code, TF_ENV)
    assert second["inf_on"] == [0.0, 1.0]
    assert (first["scale"], first["growth"]) == ([1024.0, 1024.0], [1, 1])
    assert all_finite(first["weights"])
    assert (second["scale"], second["growth"]) == ([2048.0, 2048.0], [0, 0])
    for replica in range(2):
        assert not all_finite([var[replica] for var in second["weights"]])
        assert not all_finite([var[replica] for var in second["inner"]])
    assert second["iterations"] == [2, 2]


@in_the_session_of("jax")
def test_jax_data_parallel_fit_skips_on_every_device(run_python):
    # Under jit the gradients of a DataParallel step are already global (the loss is a
    # mean over the sharded batch): one device's inf is every device's.
    code = JAX_FIT.format(steps=STEPS)
    assert_follows_the_spec(run_program(run_python, code, JAX_ENV), STEPS)
