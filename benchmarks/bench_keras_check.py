"""Where the Keras wrapper's time goes on TensorFlow and JAX: the finiteness test.

Run: python benchmarks/bench_keras_check.py [--backend jax|tensorflow]
     [--policy float32|mixed_float16] [--rounds R] [--steps N]

Times one compiled train step of bench_keras.py's 5.25M-parameter MLP (SGD, batch 64)
in one process, interleaved in a rotating order, medians of per-round ratios:
  a       plain SGD
  b       keras.optimizers.LossScaleOptimizer
  c       unifiedamp's wrapper as shipped (JAX: min(int8(isfinite(g))) > 0 per
          gradient; TensorFlow: a float32 sum per gradient, the exact test if one
          is not finite)
  c_isf   the wrapper with all(isfinite(g)) per gradient as the test
  c_sum0  the wrapper with isfinite(sum(g * 0)) per gradient as the test
  c_none  the wrapper with no test at all (not a valid scaler: a lower bound)
The variants replace the Keras backend's all_finite (unifiedamp/backends/keras/_jax.py,
_tensorflow.py) while their step is traced;
the step is traced once, so each keeps its own. JAX: Keras's own train_step under
jax.jit with the state donated (what fit runs); TensorFlow: tf.GradientTape and
opt.apply in a tf.function (the custom loop). The gap between c_none and a is the
rest of the wrapper (the unscale, the scalar rule); the gap between c and c_none is
the test. Keras picks its backend at import, so the script re-runs itself under
KERAS_BACKEND=<backend>.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _timing import child_env, interleaved_rounds, round_ratio  # benchmarks/_timing.py

SIZES = (1024, 2048, 1024, 1024, 1024)
BATCH = 64


def variants(ops: Any) -> dict[str, Any]:
    def isf(grads: list[Any]) -> Any:
        finite = ops.convert_to_tensor(True)
        for g in grads:
            if g is not None:
                finite = ops.logical_and(finite, ops.all(ops.isfinite(g)))
        return finite

    def sum0(grads: list[Any]) -> Any:
        finite = ops.convert_to_tensor(True)
        for g in grads:
            if g is not None:
                finite = ops.logical_and(
                    finite, ops.isfinite(ops.sum(ops.cast(g, "float32") * 0.0)))
        return finite

    return {"c_isf": isf, "c_sum0": sum0,
            "c_none": lambda grads: ops.convert_to_tensor(True)}


def child(args: argparse.Namespace) -> None:
    import keras
    import numpy as np
    from keras import ops

    import unifiedamp as ua
    from unifiedamp.backends.keras._optimizer import paths_for

    backend = keras.backend.backend()
    paths = paths_for(backend)
    shipped = paths.all_finite
    replaced = variants(ops)

    def model() -> Any:
        keras.utils.set_random_seed(0)
        layers: list[Any] = [keras.Input((SIZES[0],))]
        for i, n in enumerate(SIZES[1:]):
            last = i == len(SIZES) - 2
            layers.append(keras.layers.Dense(n, activation=None if last else "relu",
                                             dtype=args.policy))
        return keras.Sequential(layers)

    def optimizer(name: str) -> Any:
        sgd = keras.optimizers.SGD(1e-3)
        if name == "a":
            return sgd
        if name == "b":
            return keras.optimizers.LossScaleOptimizer(sgd, initial_scale=1024.0)
        return ua.GradScaler(1024.0, growth_interval=2000, backend="keras").wrap(sgd)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0]), dtype=np.float32)
    y = rng.standard_normal((BATCH, SIZES[-1]), dtype=np.float32)
    runs: dict[str, Any] = {}
    for name in ["a", "b", "c", *replaced]:
        paths.all_finite = staticmethod(replaced.get(name, shipped))
        try:
            runs[name] = (jax_run if backend == "jax" else tf_run)(model(), optimizer(name),
                                                                   x, y, name != "a")
        finally:
            paths.all_finite = staticmethod(shipped)
    per = interleaved_rounds({name: lambda run=run: run(args.steps) for name, run in runs.items()},
                             args.rounds)
    print(f"keras {keras.__version__} on {backend}, policy {args.policy}, {args.rounds} rounds "
          f"x {args.steps} steps; ms/step and medians of per-round ratios; malloc: "
          + ("glibc defaults" if args.glibc_malloc else "freed memory kept"))
    for name in per:
        print(f"  {name:7s} {statistics.median(per[name]) * 1e3:8.2f} ms"
              f"   / a {round_ratio(per, name, 'a'):.3f}   / b {round_ratio(per, name, 'b'):.3f}")


def jax_run(model: Any, opt: Any, x: Any, y: Any, scaled: bool) -> Any:
    import jax

    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # builds everything
    state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                 optimizer_variables=True, metrics_variables=True)
    state = jax.tree.map(jax.numpy.array, state)  # owned copies: they are donated
    step = jax.jit(model.train_step, donate_argnums=0)
    data = (jax.numpy.asarray(x), jax.numpy.asarray(y))
    box = [jax.block_until_ready(step(state, data)[1])]  # traced here, once

    def run(steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            box[0] = step(box[0], data)[1]
        jax.block_until_ready(box[0])
        return (time.perf_counter() - t0) / steps
    return run


def tf_run(model: Any, opt: Any, x: Any, y: Any, scaled: bool) -> Any:
    import tensorflow as tf

    opt.build(model.trainable_variables)
    x, y = tf.constant(x), tf.constant(y)

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(model(x), "float32") - y))
            if scaled:
                loss = opt.scale_loss(loss)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss
    step()  # traced here, once

    def run(steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            out = step()
        float(out)
        return (time.perf_counter() - t0) / steps
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="jax", choices=("jax", "tensorflow"))
    parser.add_argument("--policy", default="float32", choices=("float32", "mixed_float16"))
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--steps", type=int, default=10, help="steps per round and case")
    parser.add_argument("--glibc-malloc", action="store_true",
                        help="glibc's default allocator settings (noisier; by default freed "
                             "memory stays in the process: _timing.STEADY_MALLOC)")
    args = parser.parse_args()
    if os.environ.get("KERAS_BACKEND") == args.backend and "keras" not in sys.modules:
        child(args)
        return
    env = child_env(not args.glibc_malloc, KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="3")
    sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)


if __name__ == "__main__":
    main()
