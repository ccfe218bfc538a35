"""What the ``test_port_source.py`` files of the sessions share (``unifiedamp port``, the source
rewriter): the sources, each a snippet building one native scaler; the targets; the config
each source's call means; and the check that a rewritten source, run with the real
frameworks, builds a scaler whose config is the source's or differs only where a problem on
that line says so.

A rewritten source needs the frameworks of its source (the file's own imports and arguments
stay) and of its target: :func:`session_of` says which session runs each (source, target)
pair: one framework's session, ``cross`` for two (torch, paddle, jax), ``keras`` for any pair
with Keras (with paddle as well: in a process of its own, paddle imported first and Keras on
JAX, since paddle and TensorFlow cannot share a process).
"""

from __future__ import annotations

import ast
import contextlib
import sys
import textwrap
import warnings
from types import SimpleNamespace

from unifiedamp.porting import config_from_call, from_native, port_source
from unifiedamp.spec import ScalerConfig

# (snippet defining `scaler`, the call's qualname, args, kwargs, source version)
SOURCES = {
    "torch": ("import torch\nscaler = torch.amp.GradScaler('cpu', 1024.0, 3.0, 0.25, 10)\n",
              "torch.amp.GradScaler", ("cpu", 1024.0, 3.0, 0.25, 10), {}, None),
    "torch_kw": ("from torch.amp import GradScaler\n"
                 "scaler = GradScaler(device='cpu', growth_interval=7, init_scale=2 ** 12)\n",
                 "torch.amp.GradScaler", (), {"device": "cpu", "growth_interval": 7,
                                              "init_scale": 4096.0}, None),
    "torch_cuda": ("from torch.cuda.amp import GradScaler as S\nscaler = S(512.0)\n",
                   "torch.cuda.amp.GradScaler", (512.0,), {}, None),
    "sharded": ("from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler\n"
                "scaler = ShardedGradScaler('cpu', 1024.0, 0.25, 4.0, 5)\n",
                "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
                ("cpu", 1024.0, 0.25, 4.0, 5), {}, None),
    "paddle2": ("import paddle as pd\nscaler = pd.amp.GradScaler(True, 2048.0)\n",
                "paddle.amp.GradScaler", (True, 2048.0), {}, "2.6"),
    "paddle3": ("import paddle\nscaler = paddle.amp.GradScaler(incr_ratio=4.0, decr_ratio=0.25)\n",
                "paddle.amp.GradScaler", (), {"incr_ratio": 4.0, "decr_ratio": 0.25}, "3.3"),
    "amp_scaler": ("from paddle.amp import AmpScaler\nscaler = AmpScaler(incr_every_n_steps=3)\n",
                   "paddle.amp.AmpScaler", (), {"incr_every_n_steps": 3}, None),
    "keras": ("import keras\ninner = keras.optimizers.SGD()\n"
              "scaler = keras.optimizers.LossScaleOptimizer(inner, dynamic_growth_steps=50)\n",
              "keras.optimizers.LossScaleOptimizer", ("inner",), {"dynamic_growth_steps": 50},
              None),
    "jmp": ("import jmp, jax.numpy as jnp\n"
            "scaler = jmp.DynamicLossScale(jnp.float32(2 ** 10), period=4, factor=4)\n",
            "jmp.DynamicLossScale", (1024.0,), {"period": 4, "factor": 4}, None),
    "jmp_static": ("import jmp\nscaler = jmp.StaticLossScale(-(-128.0))\n",
                   "jmp.StaticLossScale", (128.0,), {}, None),
    # A TF2 recommendation model's static scale (tf-keras 2: Keras 3 refuses dynamic=False).
    "tf_keras_static": ("import tensorflow as tf\ninner = tf.keras.optimizers.SGD(0.1)\n"
                        "scaler = tf.keras.mixed_precision.LossScaleOptimizer("
                        "inner, initial_scale=1024, dynamic=False)\n",
                        "tf.keras.mixed_precision.LossScaleOptimizer", ("inner",),
                        {"initial_scale": 1024.0, "dynamic": False}, None),
    # TensorFlow 2.1-2.3's spelling: "dynamic", a number (static), a DynamicLossScale.
    "tf23_dynamic": ("import tensorflow as tf\ninner = tf.keras.optimizers.SGD()\n"
                     "scaler = tf.keras.mixed_precision.experimental.LossScaleOptimizer("
                     "inner, 'dynamic')\n",
                     "tf.keras.mixed_precision.experimental.LossScaleOptimizer",
                     ("inner", "dynamic"), {}, None),
    "tf23_static": ("import tensorflow as tf\ninner = tf.keras.optimizers.SGD()\n"
                    "scaler = tf.keras.mixed_precision.experimental.LossScaleOptimizer(inner, 128)"
                    "\n", "tf.keras.mixed_precision.experimental.LossScaleOptimizer",
                    ("inner", 128.0), {}, None),
    "tf23_object": ("import tensorflow as tf\nfrom tensorflow.keras import mixed_precision\n"
                    "inner = tf.keras.optimizers.SGD()\n"
                    "scaler = mixed_precision.experimental.LossScaleOptimizer("
                    "inner, loss_scale=tf.mixed_precision.experimental.DynamicLossScale("
                    "initial_loss_scale=2 ** 12, increment_period=50, multiplier=4.))\n",
                    "tf.keras.mixed_precision.experimental.LossScaleOptimizer", ("inner",),
                    {"loss_scale": {"initial_loss_scale": 4096, "increment_period": 50,
                                    "multiplier": 4.0}}, None),
    # tf.keras with what the file says about its Keras: tf.compat.v1 (tf-keras 2's floor of
    # 1), keras.ops (Keras 3, whose second positional argument is initial_scale).
    "tf_compat_v1": ("import tensorflow as tf\ntf.compat.v1.logging.set_verbosity("
                     "tf.compat.v1.logging.ERROR)\ninner = tf.keras.optimizers.SGD()\n"
                     "scaler = tf.keras.mixed_precision.LossScaleOptimizer("
                     "inner, dynamic_growth_steps=100)\n",
                     "tf.keras.mixed_precision.LossScaleOptimizer", ("inner",),
                     {"dynamic_growth_steps": 100}, None),
    "tf_keras3": ("import keras\nimport tensorflow as tf\ninner = tf.keras.optimizers.SGD()\n"
                  "ones = keras.ops.ones(2)\n"
                  "scaler = tf.keras.mixed_precision.LossScaleOptimizer(inner, 2 ** 10)\n",
                  "tf.keras.mixed_precision.LossScaleOptimizer", ("inner", 1024.0), {}, None),
}
#: The Keras each tf.keras source's file says it is (read by port from the file; expected()
#: needs it said).
EVIDENCE = {"tf_compat_v1": "keras=2", "tf_keras3": "keras=3"}

#: TensorFlow/Keras snippets port must flag (exit 1) for every target, with words of the
#: problem (target -> words, "*" for the others), for code that cannot run here (tf_keras is
#: not installed) or that port does not rewrite.
TF_FLAGGED = {
    # tf-models-official's shape: a tf_keras (Keras 2) optimizer, which Keras 3 refuses.
    "tf_keras_package": ("import tf_keras\nopt = tf_keras.optimizers.SGD(0.1)\n"
                         "scaler = tf_keras.mixed_precision.LossScaleOptimizer(opt)\n",
                         {"unifiedamp": "build the optimizer from keras.optimizers (Keras 3",
                          "keras": "build the optimizer from keras.optimizers (Keras 3",
                          "*": "used differently"}),
    "legacy_env": ("import os\nos.environ['TF_USE_LEGACY_KERAS'] = '1'\nimport tensorflow as tf\n"
                   "scaler = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n",
                   {"unifiedamp": "takes a Keras 3 optimizer only", "keras": "Keras 3 optimizer",
                    "*": "used differently"}),
    "graph_rewrite_v1": ("import tensorflow as tf\nopt = tf.compat.v1.train.AdamOptimizer()\n"
                         "opt = tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite("
                         "\n    opt, loss_scale=128)\n", {"*": "graph-rewrite mixed precision"}),
    "graph_rewrite_train": ("from tensorflow.train.experimental import "
                            "enable_mixed_precision_graph_rewrite\n"
                            "opt = enable_mixed_precision_graph_rewrite(opt)\n",
                            {"*": "graph-rewrite mixed precision"}),
    "tf23_variable": ("import tensorflow as tf\n"
                      "scaler = tf.keras.mixed_precision.experimental.LossScaleOptimizer(\n"
                      "    opt, loss_scale=flags.loss_scale)\n", {"*": "may be 'dynamic' or a"}),
    # Nothing says tf-keras 2 or Keras 3, and their defaults differ (the floor of 1).
    "tf_keras_guess": ("import tensorflow as tf\n"
                       "scaler = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n",
                       {"*": "--from-version tensorflow="}),
    "tf_keras2_static_no_scale": ("import tf_keras\nscaler = tf_keras.mixed_precision."
                                  "LossScaleOptimizer(opt, dynamic=False)\n",
                                  {"*": "without initial_scale"}),
    "keras3_static": ("import keras\n"
                      "scaler = keras.optimizers.LossScaleOptimizer(opt, dynamic=False)\n",
                      {"*": "Keras 3 has no static LossScaleOptimizer"}),
}
TARGETS = ("unifiedamp", "torch", "paddle", "keras", "jmp")
_DYNAMIC_ONLY = ("growth_factor", "backoff_factor", "growth_interval", "hysteresis",
                 "min_scale", "max_scale")

# A module-level scaler built before a later top-level import (nanoGPT-like scripts).
LATE_IMPORT = textwrap.dedent("""\
    \"\"\"Train.\"\"\"
    from __future__ import annotations
    import torch
    scaler = torch.amp.GradScaler("cpu", 1024.0)
    import numpy as np
    import paddle as pd
""")


#: The framework (its session's name) each source imports, and each target's.
SOURCE_FRAMEWORK = {"torch": "torch", "torch_kw": "torch", "torch_cuda": "torch",
                    "sharded": "torch", "paddle2": "paddle", "paddle3": "paddle",
                    "amp_scaler": "paddle", "keras": "keras", "jmp": "jax", "jmp_static": "jax",
                    "tf_keras_static": "keras", "tf23_dynamic": "keras", "tf23_static": "keras",
                    "tf23_object": "keras", "tf_compat_v1": "keras", "tf_keras3": "keras"}
TARGET_FRAMEWORK = {"torch": "torch", "paddle": "paddle", "keras": "keras", "jmp": "jax"}

#: The classes a rewritten source may build, per target.
BUILT_CLASSES = {"unifiedamp": ("TorchGradScaler", "PaddleGradScaler", "JaxGradScaler",
                                "KerasGradScaler", "SpecLossScaleOptimizer"),
                 "torch": ("GradScaler", "ShardedGradScaler"),
                 "paddle": ("GradScaler",),
                 "keras": ("LossScaleOptimizer", "KerasGradScaler"),
                 "jmp": ("DynamicLossScale", "StaticLossScale")}


def expected(key: str) -> ScalerConfig:
    _, qualname, args, kwargs, version = SOURCES[key]
    return config_from_call(qualname, args, kwargs, version=version or EVIDENCE.get(key))[0]


def ported(key: str, to: str):
    code, *_, version = SOURCES[key]
    return port_source(code, to, from_version=version)


def read_back(code: str, version=None) -> ScalerConfig:
    """The config the (rewritten) source's first scaler builds: ported once more to
    unifiedamp, whose call holds every value as a literal keyword, read with ``ast``."""
    tree = ast.parse(port_source(code, "unifiedamp", from_version=version).code)
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and ast.unparse(node.func) == "ua.GradScaler")
    return ScalerConfig(**{k.arg: ast.literal_eval(k.value) for k in call.keywords
                           if k.arg not in ("backend", "device", "process_group")})


def keys(to: str) -> list[str]:
    """The sources ported to ``to`` (FSDP's class has no counterpart but torch's)."""
    return [k for k in SOURCES if not (k == "sharded" and to not in ("torch", "unifiedamp"))]


def frameworks(key: str, to: str) -> frozenset[str]:
    """What the rewritten source imports: its source's framework and its target's."""
    return frozenset({SOURCE_FRAMEWORK[key], TARGET_FRAMEWORK.get(to, SOURCE_FRAMEWORK[key])})


def session_of(key: str, to: str) -> str:
    """The session that builds ``key`` ported to ``to``: its one framework's, ``keras`` for a
    pair with Keras, else ``cross``."""
    needs = frameworks(key, to)
    if len(needs) == 1:
        return next(iter(needs))
    return "keras" if "keras" in needs else "cross"


def pairs(session: str, paddle_with_keras: bool = False) -> dict[str, list[str]]:
    """Target -> the sources ``session`` builds for it (keras: those with paddle beside
    Keras when ``paddle_with_keras``, the others when not)."""
    out: dict[str, list[str]] = {}
    for to in TARGETS:
        chosen = [k for k in keys(to) if session_of(k, to) == session
                  and (session != "keras" or ("paddle" in frameworks(k, to)) == paddle_with_keras)]
        if chosen:
            out[to] = chosen
    return out


def code(key: str, to: str) -> str:
    # torch's default device "cuda" disables the scaler on a CPU-only machine.
    return ported(key, to).code.replace('"cuda"', '"cpu"')


class _GpuPlace:
    def is_gpu_place(self):
        return True


@contextlib.contextmanager
def _paddle_enabled_on_cpu():
    """Paddle's scaler disables itself on a CPU place: its constructor is shown a GPU place
    (as tests/paddle/conftest.py's ``native_scaler``), if paddle is imported."""
    grad_scaler = sys.modules.get("paddle.amp.grad_scaler")
    if grad_scaler is None:
        yield
        return
    saved = grad_scaler._dygraph_tracer
    grad_scaler._dygraph_tracer = lambda: SimpleNamespace(_expected_place=_GpuPlace())
    try:
        yield
    finally:
        grad_scaler._dygraph_tracer = saved


def build(codes: list[str]) -> list[tuple[str, dict]]:
    """Runs each rewritten source in this process: the scaler's class name and the config
    from_native reads (a native scaler, a unifiedamp one, or the optimizer unifiedamp's keras
    backend wraps)."""
    out = []
    for source in codes:
        namespace: dict = {}
        with warnings.catch_warnings(), _paddle_enabled_on_cpu():
            warnings.simplefilter("ignore")
            exec(source, namespace)
        scaler = namespace["scaler"]
        out.append((type(scaler).__name__, from_native(scaler).config.to_dict()))
    return out


def build_pairs(chosen: dict[str, list[str]]) -> dict[str, list[tuple[str, dict]]]:
    """:func:`build` over ``pairs(...)``: target -> (class name, config) per source."""
    if "paddle" in {SOURCE_FRAMEWORK[k] for ks in chosen.values() for k in ks} | set(chosen):
        import paddle  # noqa: F401  (its grad_scaler module, for the GPU place)
    flat = [code(k, to) for to, ks in chosen.items() for k in ks]
    built = iter(build(flat))
    return {to: [next(built) for _ in ks] for to, ks in chosen.items()}


#: The same in a new interpreter, paddle imported first (for paddle beside Keras, on JAX).
CHILD = """
import json, sys
import paddle
sys.path.insert(0, sys.argv[2])
import port_sources
chosen = json.loads(sys.argv[1])
print(json.dumps(port_sources.build_pairs(chosen)))
"""


def check_built(to: str, chosen: list[str], built: list[tuple[str, dict]]) -> None:
    """Each source's rewritten code built a scaler of a class of ``to``, whose config equals
    the source's where the port reports no problem, and where it differs a problem names
    the field."""
    results = {k: ported(k, to) for k in chosen}
    for key, (cls, values) in zip(chosen, built, strict=True):
        source, live = expected(key), ScalerConfig(**values)
        problems = " ".join(results[key].problems)
        assert cls in BUILT_CLASSES[to], (key, cls)
        for name, value in source.to_dict().items():
            if not source.dynamic and name in _DYNAMIC_ONLY:
                continue  # a static source never uses them: only dynamic= must be named
            if getattr(live, name) != value:
                assert f"{name}=" in problems, (key, name, value, getattr(live, name), problems)
        if results[key].ok:
            assert live == source, (key, live, source)


# ---------------------------------------------------------------- Flax, Paddle static, wrappers
# Written as Flax's own examples write them (examples/imagenet/train.py and examples/wmt/
# train.py in google/flax: the module imported as dynamic_scale_lib, the scaler in a
# TrainState field, the value_and_grad / is_fin loop, the jnp.where selects), with a small
# model; growth_interval=2 so that a few steps grow. Each defines create_train_state(params)
# and train_step(state, batch) -> (state, metrics), run under jax.pmap(axis_name="batch").
FLAX_IMAGENET = textwrap.dedent("""\
    import functools

    import jax
    import jax.numpy as jnp
    import optax
    from flax.training import dynamic_scale as dynamic_scale_lib
    from flax.training import train_state


    class TrainState(train_state.TrainState):
      dynamic_scale: dynamic_scale_lib.DynamicScale


    def train_step(state, batch):
      \"\"\"Perform a single training step.\"\"\"

      def loss_fn(params):
        logits = batch @ params['w']
        loss = jnp.mean(logits**2) * 2.0**-4
        return loss, (logits,)

      dynamic_scale = state.dynamic_scale

      if dynamic_scale:
        grad_fn = dynamic_scale.value_and_grad(
            loss_fn, has_aux=True, axis_name='batch'
        )
        dynamic_scale, is_fin, aux, grads = grad_fn(state.params)
        # dynamic loss takes care of averaging gradients across replicas
      else:
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        aux, grads = grad_fn(state.params)
        grads = jax.lax.pmean(grads, axis_name='batch')
      metrics = {'loss': aux[0]}
      new_state = state.apply_gradients(grads=grads)
      if dynamic_scale:
        # if is_fin == False the gradients contain Inf/NaNs and optimizer state and
        # params should be restored (= skip this step).
        new_state = new_state.replace(
            opt_state=jax.tree_util.tree_map(
                functools.partial(jnp.where, is_fin),
                new_state.opt_state,
                state.opt_state,
            ),
            params=jax.tree_util.tree_map(
                functools.partial(jnp.where, is_fin), new_state.params, state.params
            ),
            dynamic_scale=dynamic_scale,
        )
        metrics['scale'] = dynamic_scale.scale
      return new_state, metrics


    def create_train_state(params, half_precision=True):
      \"\"\"Create initial training state.\"\"\"
      dynamic_scale = None
      if half_precision:
        dynamic_scale = dynamic_scale_lib.DynamicScale(growth_interval=2)
      return TrainState.create(apply_fn=None, params=params,
                               tx=optax.sgd(0.1, momentum=0.9), dynamic_scale=dynamic_scale)
""")

FLAX_WMT = textwrap.dedent("""\
    import functools

    import jax
    import jax.numpy as jnp
    import optax
    from flax.training import dynamic_scale as dynamic_scale_lib
    from flax.training import train_state


    class TrainState(train_state.TrainState):
      dynamic_scale: dynamic_scale_lib.DynamicScale


    def train_step(state, batch):
      def loss_fn(params):
        logits = batch @ params['w']
        return jnp.mean(logits**2) * 2.0**-4, logits

      if state.dynamic_scale:
        # dynamic scale takes care of averaging gradients across replicas
        grad_fn = state.dynamic_scale.value_and_grad(
            loss_fn, has_aux=True, axis_name="batch"
        )
        dynamic_scale, is_fin, (_, logits), grads = grad_fn(state.params)
        state = state.replace(dynamic_scale=dynamic_scale)
      else:
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (_, logits), grads = grad_fn(state.params)
        grads = jax.lax.pmean(grads, axis_name="batch")

      new_state = state.apply_gradients(grads=grads)
      metrics = {"denominator": jnp.float32(2.0)}

      if state.dynamic_scale:
        # if is_fin == False the gradients contain Inf/NaNs and optimizer state and
        # params should be restored (= skip this step).
        select_fn = functools.partial(jnp.where, is_fin)
        new_state = new_state.replace(
            opt_state=jax.tree_util.tree_map(
                select_fn, new_state.opt_state, state.opt_state
            ),
            params=jax.tree_util.tree_map(
                select_fn, new_state.params, state.params
            ),
        )
        metrics["loss_scale"] = dynamic_scale.scale * metrics["denominator"]
      return new_state, metrics


    def create_train_state(params, dtype=jnp.float16):
      dynamic_scale = None
      if dtype == jnp.float16:
        dynamic_scale = dynamic_scale_lib.DynamicScale(growth_interval=2)
      return TrainState.create(apply_fn=None, params=params,
                               tx=optax.adamw(1e-3, b1=0.9, b2=0.98, eps=1e-9),
                               dynamic_scale=dynamic_scale)
""")

#: Sources port flags (exit 1): key -> (source, the words its problem must hold).
FLAGGED = {
    # DynamicScale's docstring: value_and_grad inside a lambda, on the lambda's parameter.
    "flax_docstring": (textwrap.dedent("""\
        import jax
        import jax.numpy as jnp
        from flax.training.dynamic_scale import DynamicScale

        def loss_fn(p):
          return jnp.asarray(p, jnp.float16) ** 2
        p = jnp.array(1., jnp.float32)

        dyn_scale = DynamicScale(growth_interval=10)
        compute_grad = jax.jit(lambda ds, p: ds.value_and_grad(loss_fn)(p))
        for _ in range(100):
          dyn_scale, is_fin, loss, grad = compute_grad(dyn_scale, p)
          p += jnp.where(is_fin, 0.01 * grad, 0.)
    """), ("no value_and_grad call on this scaler",)),
    # PaddlePaddle's static-graph AMP (PaddleClas/PaddleDetection static trainers).
    "paddle_static": (textwrap.dedent("""\
        import paddle

        paddle.enable_static()
        optimizer = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9)
        optimizer = paddle.static.amp.decorate(
            optimizer,
            init_loss_scaling=128.0,
            use_dynamic_loss_scaling=True,
            use_pure_fp16=False)
    """), ("static-graph AMP", "init_loss_scaling=128.0", "use_dynamic_loss_scaling=True",
           "paddle.amp.GradScaler")),
    # PaddleNLP's auto-parallel trainer.
    "shard_scaler": (textwrap.dedent("""\
        import paddle
        import paddle.distributed as dist

        scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
        scaler = dist.shard_scaler(scaler)
    """), ("paddle.distributed.shard_scaler(scaler)", "_unscale", "process_group")),
    # PaddleNLP's hybrid-parallel trainer.
    "distributed_scaler": (textwrap.dedent("""\
        import paddle
        from paddle.distributed import fleet

        class Trainer:
            def __init__(self):
                self.scaler = paddle.amp.GradScaler(init_loss_scaling=2 ** 15)
                self.scaler = fleet.distributed_scaler(self.scaler)
    """), ("paddle.distributed.fleet.distributed_scaler(self.scaler)", "_unscale")),
}
