"""The Keras backend's cost in model.fit and in a custom loop, on each Keras backend,
against plain SGD and keras.optimizers.LossScaleOptimizer.

Run: python benchmarks/bench_keras.py [--backends tensorflow,jax,torch] [--repeats R]
     [--steps S] [--epochs E] [--policy float32|mixed_float16] [--markdown]

A ~5M-parameter MLP (Dense 1024-2048-1024-1024, ReLU), SGD, batch 64, MSE on
random data, with (a) plain SGD, (b) keras.optimizers.LossScaleOptimizer(SGD),
(c) unifiedamp's wrapper with the config Keras expresses (growth 2, backoff 0.5),
(d) unifiedamp's wrapper with growth 1.5, backoff 0.7, hysteresis 2, min_scale 1;
scale 1024, growth interval 2000 for (b)-(d). Two paths per Keras backend:
1. model.fit over S batches held in memory: each fit call runs E + 1 epochs and
   its first epoch (iterator set-up) is dropped; ms/step = epoch time / S. The
   train function is traced once beforehand (one warm-up fit call per case); with
   jit_compile="auto" it is a tf.function without XLA on a CPU-only TensorFlow,
   jax.jit on JAX, eager on torch (printed as jit_compile).
2. A custom loop: tf.GradientTape inside a tf.function and opt.apply (TensorFlow),
   jax.grad over stateless_call and opt.stateless_apply under one jax.jit (JAX),
   autograd and opt.apply under torch.no_grad (torch); each run makes E timed passes
   over the S batches (JAX: the state donated, written back after the run).
Keras picks its backend from KERAS_BACKEND when it is first imported, so each
backend runs in a child process (this script with --keras-backend X under
KERAS_BACKEND=X), which prints its figures as JSON; the parent prints one table.
Within a child the cases run interleaved in a rotating order; medians and the ratios
c/b (target <= 1.03) and c/a, d/a (target <= 1.10), each the median over rounds of that
round's ratio (drift between rounds cancels), are printed, ratios only ever
between runs of one process. After the runs, (b)-(d) must still hold scale 1024
with every step counted (no step skipped). --policy mixed_float16 gives every
Dense layer that policy (the model's own policy stays float32, so model.compile
does not wrap the plain SGD in a LossScaleOptimizer) and skips that check; it
runs on CPU on all three Keras backends. The children keep freed memory in the
process (_timing.STEADY_MALLOC; --glibc-malloc for glibc's defaults, noisier on
JAX). The defaults (20 rounds, 12 steps) take about six minutes on two cores;
--repeats 3 --steps 4 --epochs 1 about one (mostly start-up and tracing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from _timing import child_env, interleaved_rounds, round_ratio  # benchmarks/_timing.py

BACKENDS = ("tensorflow", "jax", "torch")
A, B = "a plain SGD", "b keras LossScaleOptimizer"
C, D = "c unifiedamp (growth 2, backoff 0.5)", "d unifiedamp (1.5, 0.7, hyst. 2, min 1)"
VARIANTS = (A, B, C, D)
PATHS = ("fit", "loop")
SIZES = (1024, 2048, 1024, 1024)
BATCH = 64
LR = 1e-3
INIT_SCALE = 1024.0
GROWTH_INTERVAL = 2000  # the default: the scale stays put unless a case takes 2000 steps
MARK = "BENCH_KERAS_JSON "
TARGETS = {"c/b": 1.03, "c/a": 1.10, "d/a": 1.10}


def rounds(cases: dict[str, Callable[[], list[float]]], repeats: int) -> dict[str, list[float]]:
    """Per round, each case's median seconds per step (each run returns its per-step
    times), from :func:`interleaved_rounds`."""
    return interleaved_rounds({name: lambda fn=fn: statistics.median(fn())
                               for name, fn in cases.items()}, repeats)


# ------------------------------------------------------------ the child: one Keras backend


def make_optimizer(keras: Any, ua: Any, variant: str) -> Any:
    sgd = keras.optimizers.SGD(LR)
    if variant == A:
        return sgd
    if variant == B:
        return keras.optimizers.LossScaleOptimizer(sgd, initial_scale=INIT_SCALE,
                                                   dynamic_growth_steps=GROWTH_INTERVAL)
    if variant == C:
        scaler = ua.GradScaler(INIT_SCALE, growth_interval=GROWTH_INTERVAL, backend="keras")
    else:
        scaler = ua.GradScaler(INIT_SCALE, growth_factor=1.5, backoff_factor=0.7,
                               growth_interval=GROWTH_INTERVAL, hysteresis=2, min_scale=1.0,
                               backend="keras")
    return scaler.wrap(sgd)


def make_model(keras: Any, policy: str) -> Any:
    keras.utils.set_random_seed(0)  # the same initial weights for every case
    layers: list[Any] = [keras.Input((SIZES[0],))]
    for i, n in enumerate(SIZES[1:]):
        layers.append(keras.layers.Dense(n, activation="relu" if i < len(SIZES) - 2 else None,
                                         dtype=policy))
    if policy != "float32":
        layers.append(keras.layers.Activation("linear", dtype="float32"))
    return keras.Sequential(layers)


def loop_step(keras: Any, model: Any, opt: Any) -> Callable[[list[Any], int], Callable[[], Any]]:
    """``runner(batches, passes)``: a function that runs one train step per batch, ``passes``
    times, and returns the seconds per step of each pass (waiting for its last step)."""
    from keras import ops

    backend = keras.backend.backend()
    tvs = model.trainable_variables
    opt.build(tvs)

    def loss_of(y: Any, y_pred: Any) -> Any:
        return ops.mean(ops.square(y - ops.cast(y_pred, "float32")))

    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=False)
        def tf_step(x: Any, y: Any) -> None:
            with tf.GradientTape() as tape:
                loss = opt.scale_loss(loss_of(y, model(x, training=True)))
            opt.apply(tape.gradient(loss, tvs), tvs)

        def tf_runner(batches: list[Any], passes: int) -> Callable[[], list[float]]:
            def go() -> list[float]:
                times = []
                for _ in range(passes):
                    t0 = time.perf_counter()
                    for x, y in batches:
                        tf_step(x, y)
                    ops.convert_to_numpy(opt.iterations)
                    times.append((time.perf_counter() - t0) / len(batches))
                return times
            return go
        return tf_runner

    if backend == "torch":
        import torch

        def torch_runner(batches: list[Any], passes: int) -> Callable[[], list[float]]:
            def go() -> list[float]:
                times = []
                for _ in range(passes):
                    t0 = time.perf_counter()
                    for x, y in batches:
                        model.zero_grad()
                        opt.scale_loss(loss_of(y, model(x, training=True))).backward()
                        with torch.no_grad():
                            opt.apply([v.value.grad for v in tvs], tvs)
                    ops.convert_to_numpy(opt.iterations)
                    times.append((time.perf_counter() - t0) / len(batches))
                return times
            return go
        return torch_runner

    if backend == "jax":
        import jax

        def scaled_loss(tv: Any, ntv: Any, ov: Any, x: Any, y: Any) -> Any:
            y_pred, ntv = model.stateless_call(tv, ntv, x, training=True)
            with keras.StatelessScope(state_mapping=list(zip(opt.variables, ov, strict=True))):
                loss = opt.scale_loss(loss_of(y, y_pred))
            return loss, ntv

        @partial(jax.jit, donate_argnums=0)  # donated, as Keras's fit does
        def jax_step(state: Any, x: Any, y: Any) -> Any:
            tv, ntv, ov = state
            grads, ntv = jax.grad(scaled_loss, has_aux=True)(tv, ntv, ov, x, y)
            tv, ov = opt.stateless_apply(ov, grads, tv)
            return tv, ntv, ov

        def jax_runner(batches: list[Any], passes: int) -> Callable[[], list[float]]:
            def go() -> list[float]:
                state = ([v.value for v in tvs], [v.value for v in model.non_trainable_variables],
                         [v.value for v in opt.variables])
                times = []
                for _ in range(passes):
                    t0 = time.perf_counter()
                    for x, y in batches:
                        state = jax_step(state, x, y)
                    jax.block_until_ready(state)
                    times.append((time.perf_counter() - t0) / len(batches))
                # Written back, as Keras's fit does at the end of an epoch.
                for var, value in zip([*tvs, *model.non_trainable_variables, *opt.variables],
                                      [*state[0], *state[1], *state[2]], strict=True):
                    var.assign(value)
                return times
            return go
        return jax_runner

    raise NotImplementedError(f"no custom loop for the {backend!r} Keras backend")


def check_state(name: str, opt: Any) -> str:
    """The scale and counters after the runs; that no step was skipped (float32 only)."""
    import numpy as np

    if not hasattr(opt, "dynamic_scale"):
        return f"{int(np.asarray(opt.iterations))} steps"
    scale = float(np.asarray(opt.dynamic_scale))
    counter, steps = int(np.asarray(opt.step_counter)), int(np.asarray(opt.iterations))
    return f"{steps} steps, scale {scale:g}, growth tracker {counter}" + (
        "" if (scale, counter) == (INIT_SCALE, steps % GROWTH_INTERVAL) else " (SKIPPED STEPS)")


def child(args: argparse.Namespace) -> dict[str, Any]:
    import keras
    import numpy as np
    from keras import ops

    import unifiedamp as ua

    backend = keras.backend.backend()
    if backend != args.keras_backend:
        raise RuntimeError(f"KERAS_BACKEND gave {backend!r}, expected {args.keras_backend!r}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * BATCH, SIZES[0]), dtype=np.float32)
    y = rng.standard_normal((args.steps * BATCH, SIZES[-1]), dtype=np.float32)
    batches = [(ops.convert_to_tensor(x[i:i + BATCH]), ops.convert_to_tensor(y[i:i + BATCH]))
               for i in range(0, len(x), BATCH)]

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            float(logs["loss"])  # waits for the last step (JAX dispatches asynchronously)
            self.times.append(time.perf_counter() - self.t0)

    opts: dict[str, dict[str, Any]] = {path: {} for path in PATHS}
    jit: list[bool] = []

    def fit_case(variant: str) -> Callable[[], list[float]]:
        model = make_model(keras, args.policy)
        opt = opts["fit"][variant] = make_optimizer(keras, ua, variant)
        model.compile(optimizer=opt, loss="mse")
        jit.append(bool(model.jit_compile))
        assert model.optimizer is opt, "compile wrapped the optimizer"

        def go() -> list[float]:
            timer = EpochTimes()
            model.fit(x, y, batch_size=BATCH, epochs=args.epochs + 1, shuffle=False,
                      verbose=0, callbacks=[timer])
            return [t / args.steps for t in timer.times[1:]]
        return go

    def loop_case(variant: str) -> Callable[[], list[float]]:
        model = make_model(keras, args.policy)
        opt = opts["loop"][variant] = make_optimizer(keras, ua, variant)
        return loop_step(keras, model, opt)(batches, args.epochs)

    t0, load = time.perf_counter(), os.getloadavg()[0]
    per_round = {"fit": rounds({v: fit_case(v) for v in VARIANTS}, args.repeats),
                 "loop": rounds({v: loop_case(v) for v in VARIANTS}, args.repeats)}
    states = {path: {v: check_state(v, opt) for v, opt in opts[path].items()} for path in PATHS}
    if args.policy == "float32":
        bad = [f"{path} {v}: {s}" for path in PATHS for v, s in states[path].items()
               if "SKIPPED" in s]
        assert not bad, bad
    if backend == "tensorflow":
        import tensorflow as tf

        version = (f"tensorflow {tf.__version__} (intra-op threads "
                   f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'})")
    elif backend == "jax":
        import jax

        version = f"jax {jax.__version__} on {jax.devices()[0]}"
    else:
        import torch

        version = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    n_params = sum(int(np.prod(v.shape)) for v in make_model(keras, "float32").trainable_variables)
    return {"backend": backend, "keras": keras.__version__, "version": version,
            "fit_jit_compile": all(jit), "params": n_params, "rounds": per_round, "states": states,
            "seconds": time.perf_counter() - t0, "load": [load, os.getloadavg()[0]]}


# ------------------------------------------------------------ the parent: one table


def run_child(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    env = child_env(not args.glibc_malloc, KERAS_BACKEND=backend)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cmd = [sys.executable, os.path.abspath(__file__), "--keras-backend", backend,
           "--repeats", str(args.repeats), "--steps", str(args.steps),
           "--epochs", str(args.epochs), "--policy", args.policy]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"the {backend} child failed (exit status {proc.returncode})")
    return json.loads(lines[-1][len(MARK):])


def ratios(per_round: dict[str, list[float]]) -> dict[str, float]:
    """The median over rounds of each round's ratio (:func:`round_ratio`)."""
    pairs = {"b/a": (B, A), "c/b": (C, B), "c/a": (C, A), "d/b": (D, B), "d/a": (D, A)}
    return {label: round_ratio(per_round, x, y) for label, (x, y) in pairs.items()}


def medians(per_round: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(times) for name, times in per_round.items()}


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    first = results[0]
    print(f"keras {first['keras']}; " + "; ".join(r["version"] for r in results)
          + f"; {os.cpu_count()} CPUs; malloc: "
          + ("glibc defaults" if args.glibc_malloc else "freed memory kept (STEADY_MALLOC)"))
    print(f"{first['params'] / 1e6:.2f}M-parameter MLP ({args.policy}), SGD, batch {BATCH}; "
          f"median ms/step of {args.repeats} x {args.epochs} passes of {args.steps} steps "
          f"(fit: epochs, the first of each fit call dropped)")
    missed = []
    for r in results:
        for path in PATHS:
            med, rat = medians(r["rounds"][path]), ratios(r["rounds"][path])
            jit = f", jit_compile={r['fit_jit_compile']}" if path == "fit" else ""
            print(f"{r['backend']} {path}{jit}")
            for v in VARIANTS:
                print(f"  {v:42s} {med[v] * 1e3:8.2f} ms")
            print("  " + "   ".join(f"ratio {k} = {x:.3f}" for k, x in rat.items()))
            missed += [f"{r['backend']} {path} {k} = {rat[k]:.3f} > {t}"
                       for k, t in TARGETS.items() if rat[k] > t]
    print("targets (c/b <= 1.03, c/a and d/a <= 1.10): "
          + ("all met" if not missed else "missed: " + "; ".join(missed)))
    for r in results:
        busy = max(r["load"]) > (os.cpu_count() or 1) + 1  # this benchmark alone: ~ the CPUs
        print(f"{r['backend']}: {r['seconds']:.0f} s timing, load average {r['load'][0]:.1f} "
              f"before, {r['load'][1]:.1f} after"
              + (" (other processes competed for the CPUs: unreliable)" if busy else "")
              + "; after the runs: "
              + "; ".join(f"{path} {v[:1]} {s}" for path in PATHS
                          for v, s in r["states"][path].items() if v != A))
    if args.markdown:
        print()
        print("| Keras backend | path | variant | ms/step | / native | / plain |")
        print("|---|---|---|---:|---:|---:|")
        for r in results:
            for path in PATHS:
                med, rat = medians(r["rounds"][path]), ratios(r["rounds"][path])
                for v in VARIANTS:
                    key = v[0]
                    native = {A: "", B: "1.000"}.get(v, f"{rat.get(key + '/b', 0):.3f}")
                    plain = "" if v == A else f"{rat[key + '/a']:.3f}"
                    print(f"| {r['backend']} | {path} | {v} | {med[v] * 1e3:.2f} | "
                          f"{native} | {plain} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated Keras backends, each in its own process")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=12, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=2,
                        help="timed epochs per fit call (and passes per loop run)")
    parser.add_argument("--policy", default="float32", choices=("float32", "mixed_float16"))
    parser.add_argument("--glibc-malloc", action="store_true",
                        help="glibc's default allocator settings in the children (noisier; "
                             "by default freed memory stays in the process: _timing.STEADY_MALLOC)")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument("--keras-backend", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.keras_backend:  # the child, under KERAS_BACKEND
        print(MARK + json.dumps(child(args)), flush=True)
        return
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {BACKENDS}")
    t0 = time.perf_counter()
    report([run_child(b, args) for b in backends], args)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
