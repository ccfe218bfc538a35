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
}
TARGETS = ("unifiedamp", "torch", "paddle", "keras", "jmp")

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
                    "amp_scaler": "paddle", "keras": "keras", "jmp": "jax", "jmp_static": "jax"}
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
    return config_from_call(qualname, args, kwargs, version=version)[0]


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
            if getattr(live, name) != value:
                assert f"{name}=" in problems, (key, name, value, getattr(live, name), problems)
        if results[key].ok:
            assert live == source, (key, live, source)
