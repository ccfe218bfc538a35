"""An inf in one device's batch only: every device skips the step and backs off together.

JAX fixes its device count when it starts (``XLA_FLAGS=--xla_force_host_platform_device_count``),
so this file is also a program: the ``four_devices`` fixture runs it once, in a process of its
own on four host devices, and the tests read their part of the JSON line it prints. It runs

- the conformance adapter's device step (``unscale(grads, axis_name=)``, ``where_finite``,
  ``update``: ``unifiedamp.conformance.adapters.jax_devices``) under ``shard_map`` and ``pmap``;
- ``loss_scaled(..., axis_name=)`` in a default (vma-checked) ``jax.shard_map`` and under
  ``pmap`` (the recipe of docs/backends/jax.md), against an unscaled run without the step;
- ``loss_scaled_accumulate(..., axis_name=)`` in a default ``jax.shard_map``, against an
  unscaled accumulation without the window;
- a 2 x 2 ("data", "model") mesh with the weights' columns sharded over "model":
  ``axis_name=("data", "model")`` in a default and an unchecked ``shard_map`` (by hand and
  with ``loss_scaled``), against an unscaled run without the step; and ``axis_name="data"``
  unchecked, which warns and lets the model columns' scales split.

(one device: test_jax_axis_name.py; two processes: tests/distributed/test_distributed_jax.py)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from unifiedamp.backends.jax import (  # noqa: E402
    JaxGradScaler,
    find_scaler,
    loss_scaled,
    loss_scaled_accumulate,
    step_if_finite,
)

N = 4  # host devices in the program's process


# ------------------------------------------------------------ the program (four devices)


def scaler_steps():
    """Per mode: one step with an inf on device 2 (growth_interval 2), one all finite
    (growth_interval 1); each device's state and whether it stepped."""
    from unifiedamp.conformance.adapters import jax_devices

    return {mode: [jax_devices.run({"init_scale": 1024.0, "growth_interval": 2},
                                   ["F", "F", "I", "F"], mode),
                   jax_devices.run({"init_scale": 1024.0, "growth_interval": 1}, ["F"] * N, mode)]
            for mode in ("shard_map", "pmap")}


def loss_scaled_steps():
    """Four steps of loss_scaled(adam) with axis_name, step 1 with an inf on device 2 only.

    A default jax.shard_map checks varying manual axes (vma): parameters sharded over the
    axis give gradients, updates and optimizer state that vary over it, the skip branch's
    zeros and the incoming state do not. The same steps run under pmap, which checks no
    replication: each device holds its own scaler, and only axis_name makes them agree."""
    poison = {1: 2}  # step -> the device whose batch holds an inf
    mesh = Mesh(np.array(jax.devices()[:N]), ("d",))
    tx = loss_scaled(optax.adam(0.05), JaxGradScaler(1024.0, growth_interval=2), axis_name="d")
    w = jnp.arange(N * 3, dtype=jnp.float32).reshape(N, 3) / 10.0  # a row per device

    def batches(i):
        x = jnp.ones((N, 2, 3)) * (i + 1)
        return x.at[poison[i], 0, 0].set(jnp.inf) if i in poison else x

    def local_loss(w, x):  # w: (1, 3) and x: (1, 2, 3), this device's shards
        return ((x[0] @ w[0] - 1.0) ** 2).mean()

    def step(w, opt_state, x):
        scaler = find_scaler(opt_state)
        grads = jax.grad(lambda w: scaler.scale(local_loss(w, x)))(w)
        updates, opt_state = tx.update(grads, opt_state, w)
        return optax.apply_updates(w, updates), opt_state

    opt_state = tx.init(w)
    specs = jax.tree.map(lambda a: P("d") if a.ndim else P(), opt_state)
    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("d"), specs, P("d")),
                               out_specs=(P("d"), specs)))
    for i in range(4):
        w, opt_state = fn(w, opt_state, batches(i))

    # the reference: plain adam on every row's loss, without the skipped step
    ref_tx = optax.adam(0.05)
    ref = jnp.arange(N * 3, dtype=jnp.float32).reshape(N, 3) / 10.0
    ref_state = ref_tx.init(ref)
    for i in range(4):
        if i in poison:
            continue
        x = batches(i)
        grads = jax.grad(lambda r, x=x: sum(local_loss(r[j:j + 1], x[j:j + 1])
                                            for j in range(N)))(ref)
        updates, ref_state = ref_tx.update(grads, ref_state, ref)
        ref = optax.apply_updates(ref, updates)

    pmapped = jax.pmap(step, axis_name="d")
    w_p = jnp.arange(N * 3, dtype=jnp.float32).reshape(N, 1, 3) / 10.0
    state_p = jax.vmap(tx.init)(w_p)
    for i in range(4):
        w_p, state_p = pmapped(w_p, state_p, batches(i)[:, None])
    s = find_scaler(state_p)
    return {"w": np.asarray(w).tolist(), "ref": np.asarray(ref).tolist(),
            "state": list(find_scaler(opt_state).state),
            "pmap_w": np.asarray(w_p).reshape(N, 3).tolist(),
            "pmap_states": np.stack([s.loss_scale, s.growth_tracker,
                                     s.hysteresis_tracker], 1).tolist()}


def accumulated_steps():
    """Eight micro-batches of loss_scaled_accumulate(adam, every_k=2) with axis_name in a
    default shard_map, micro-batch 3 with an inf on device 2 only: window 1 is skipped."""
    k = 2
    mesh = Mesh(np.array(jax.devices()[:N]), ("d",))
    tx = loss_scaled_accumulate(optax.adam(0.05), JaxGradScaler(1024.0, growth_interval=1), k,
                                axis_name="d")
    w0 = jnp.arange(N * 3, dtype=jnp.float32).reshape(N, 3) / 10.0  # a row per device

    def batches(i):
        x = jnp.ones((N, 2, 3)) * (i + 1) / 4
        return x.at[2, 0, 0].set(jnp.inf) if i == 3 else x

    def local_loss(w, x):
        return ((x[0] @ w[0] - 1.0) ** 2).mean() / k

    def step(w, opt_state, x):
        scaler = find_scaler(opt_state)
        grads = jax.grad(lambda w: scaler.scale(local_loss(w, x)))(w)
        updates, opt_state = tx.update(grads, opt_state, w)
        return optax.apply_updates(w, updates), opt_state

    opt_state = tx.init(w0)
    specs = jax.tree.map(lambda a: P("d") if a.ndim else P(), opt_state)
    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("d"), specs, P("d")),
                               out_specs=(P("d"), specs)))
    w, scales = w0, []
    for i in range(8):
        w, opt_state = fn(w, opt_state, batches(i))
        scales.append(find_scaler(opt_state).get_scale())

    ref_tx = optax.adam(0.05)
    ref, ref_state = w0, ref_tx.init(w0)
    for window in (0, 2, 3):
        grads = 0
        for i in range(window * k, window * k + k):
            x = batches(i)
            grads = grads + jax.grad(lambda r, x=x: sum(local_loss(r[j:j + 1], x[j:j + 1])
                                                        for j in range(N)))(ref)
        updates, ref_state = ref_tx.update(grads, ref_state, ref)
        ref = optax.apply_updates(ref, updates)
    return {"w": np.asarray(w).tolist(), "ref": np.asarray(ref).tolist(), "scales": scales}


def mesh_2d_steps():
    """Three steps on a 2 x 2 ("data", "model") mesh (growth_interval 1), step 1 with an
    inf in the targets of device (data 1, model 0) only: it reaches the gradient of the
    columns on "model" 0 alone. Per run: each device's scale after each step, the weights
    and the warnings; and the unscaled references without step 1."""
    mesh = Mesh(np.array(jax.devices()[:N]).reshape(2, 2), ("data", "model"))
    w0 = jnp.arange(12, dtype=jnp.float32).reshape(3, 4) / 10  # columns sharded over "model"
    x = jnp.arange(12, dtype=jnp.float32).reshape(4, 3) / 10  # rows split over "data"
    columns, rows, cells = P(None, "model"), P("data"), P("data", "model")

    def targets(i):
        y = jnp.ones((4, 4))
        return y.at[2, 0].set(jnp.inf) if i == 1 else y  # row 2: "data" 1; column 0: "model" 0

    def local_loss(w, x, y):
        return ((x @ w - y) ** 2).mean()

    def global_loss(w, y):  # every device's local loss, summed
        return sum(local_loss(w[:, 2 * m:2 * m + 2], x[2 * d:2 * d + 2],
                              y[2 * d:2 * d + 2, 2 * m:2 * m + 2])
                   for d in range(2) for m in range(2))

    def steps(fn, carried):
        per_device = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(3):
                *carried, scales = fn(*carried, x, targets(i))
                per_device.append(np.asarray(scales).tolist())
        return {"scales": per_device, "w": np.asarray(carried[0]).tolist(),
                "warnings": sorted({str(w.message) for w in caught})}

    def by_hand(axis_name, check_vma=True):
        def step(w, scaler, x, y):
            grads = jax.grad(lambda w: scaler.scale(local_loss(w, x, y)))(w)
            if not check_vma:  # each device's own gradient: sum it as a default shard_map does
                grads = lax.psum(grads, "data")
            grads, finite = scaler.unscale(grads, axis_name=axis_name)
            w = step_if_finite(finite, lambda w: w - 0.1 * grads, w)
            scaler = scaler.update(finite)
            return w, scaler, scaler.loss_scale[None, None]

        fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(columns, P(), rows, cells),
                                   out_specs=(columns, P(), cells), check_vma=check_vma))
        return steps(fn, [w0, JaxGradScaler(8192.0, growth_interval=1)])

    tx = loss_scaled(optax.adam(0.05), JaxGradScaler(8192.0, growth_interval=1),
                     axis_name=("data", "model"))

    def adam_step(w, opt_state, x, y):
        scaler = find_scaler(opt_state)
        grads = jax.grad(lambda w: scaler.scale(local_loss(w, x, y)))(w)
        updates, opt_state = tx.update(grads, opt_state, w)
        return (optax.apply_updates(w, updates), opt_state,
                find_scaler(opt_state).loss_scale[None, None])

    opt_state = tx.init(w0)
    specs = jax.tree.map(lambda a: columns if a.ndim else P(), opt_state)
    adam = jax.jit(jax.shard_map(adam_step, mesh=mesh,
                                 in_specs=(columns, specs, rows, cells),
                                 out_specs=(columns, specs, cells)))

    def reference(ref_tx):
        w, state = w0, ref_tx.init(w0)
        for i in (0, 2):
            updates, state = ref_tx.update(jax.grad(global_loss)(w, targets(i)), state, w)
            w = optax.apply_updates(w, updates)
        return np.asarray(w).tolist()

    return {"checked": by_hand(("data", "model")),
            "unchecked": by_hand(("data", "model"), check_vma=False),
            "unchecked_data_only": by_hand("data", check_vma=False),
            "adam": steps(adam, [w0, opt_state]),
            "ref_sgd": reference(optax.sgd(0.1)), "ref_adam": reference(optax.adam(0.05))}


PARTS = {"scaler": scaler_steps, "loss_scaled": loss_scaled_steps,
         "accumulate": accumulated_steps, "mesh_2d": mesh_2d_steps}


def main() -> None:
    """Runs every part (one that fails reports its traceback) and prints one JSON line."""
    if jax.device_count() != N:
        sys.exit(f"{jax.device_count()} devices, not {N}: run with XLA_FLAGS="
                 f"--xla_force_host_platform_device_count={N} JAX_PLATFORMS=cpu")
    results = {}
    for name, part in PARTS.items():
        try:
            results[name] = part()
        except Exception:  # noqa: BLE001 - the test of that part shows it
            results[name] = {"error": traceback.format_exc()}
    print(json.dumps(results))


# ------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def four_devices():
    """The program's results: this file run by a new interpreter on four host devices."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={N}",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def part(results, name):
    if "error" in results[name]:
        pytest.fail(f"{name} failed on {N} devices:\n{results[name]['error']}")
    return results[name]


@pytest.mark.parametrize("mode", ["shard_map", "pmap"])
def test_inf_on_one_of_four_devices_skips_and_backs_off_everywhere(four_devices, mode):
    out, finite = part(four_devices, "scaler")[mode]
    assert out["states"] == [[512.0, 0, 0]] * 4
    assert out["stepped"] == [False] * 4
    assert finite["states"] == [[2048.0, 0, 0]] * 4 and finite["stepped"] == [True] * 4


def test_loss_scaled_with_axis_name_skips_on_every_device_in_shard_map_and_pmap(four_devices):
    out = part(four_devices, "loss_scaled")
    # F I F F: every device skips step 1 (an inf on device 2 only) and backs off together
    assert out["state"] == [1024.0, 0, 0]
    assert out["pmap_states"] == [[1024.0, 0, 0]] * 4
    for w in (out["w"], out["pmap_w"]):
        np.testing.assert_allclose(np.asarray(w, np.float32),
                                   np.asarray(out["ref"], np.float32), rtol=4e-7, atol=0)


def test_axis_name_in_a_default_shard_map_skips_the_window_on_every_device(four_devices):
    out = part(four_devices, "accumulate")
    # windows F I F F with growth_interval 1: every device backs off and grows together
    assert out["scales"] == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0, 4096.0]
    np.testing.assert_allclose(np.asarray(out["w"], np.float32),
                               np.asarray(out["ref"], np.float32), rtol=2e-6, atol=6e-8)


@pytest.mark.parametrize("run", ["checked", "unchecked", "adam"])
def test_a_tuple_on_a_2x2_mesh_with_sharded_weights_skips_on_every_device(four_devices, run):
    out = part(four_devices, "mesh_2d")
    # every device grows, backs off for the inf on device (data 1, model 0), grows again
    assert out[run]["scales"] == [[[16384.0] * 2] * 2, [[8192.0] * 2] * 2, [[16384.0] * 2] * 2]
    assert out[run]["warnings"] == []
    ref = out["ref_adam" if run == "adam" else "ref_sgd"]
    np.testing.assert_allclose(np.asarray(out[run]["w"], np.float32),
                               np.asarray(ref, np.float32), rtol=4e-7, atol=0)


def test_an_axis_name_leaving_out_model_warns_and_the_model_columns_split(four_devices):
    results = part(four_devices, "mesh_2d")
    out = results["unchecked_data_only"]
    (message,) = out["warnings"]
    assert "axis_name='data'" in message and "not over 'model'" in message
    assert "Fix: pass axis_name=('data', 'model')" in message
    # what it warns of: the devices of "model" 0 skip step 1 and back off, those of "model" 1
    # step and grow, so the weights' two column blocks took different steps
    assert out["scales"][1] == [[8192.0, 32768.0], [8192.0, 32768.0]]
    w, ref = (np.asarray(a, np.float32) for a in (out["w"], results["ref_sgd"]))
    np.testing.assert_allclose(w[:, :2], ref[:, :2], rtol=4e-7, atol=0)
    assert not np.allclose(w[:, 2:], ref[:, 2:], rtol=1e-3)


if __name__ == "__main__":
    main()
