"""The zoo: conformance adapters for loss scalers this project did not write.

Each entry drives one third-party scaler (DeepSpeed's, Megatron-core's, jmp's, Flax's,
Keras 3's, TensorFlow 1's, MindSpore's, native torch's and Paddle's...) through the
shipped suite, so that ``unifiedamp conformance --zoo`` prints how each differs from the
spec and ``docs/scalers.md`` explains every cause. An adapter is a plain class
(``module:Class``) that imports its framework only when it is built.

Example:
    >>> from unifiedamp.conformance.zoo import ZOO
    >>> ZOO["jmp"].target
    'unifiedamp.conformance.zoo.jmp_loss_scale:JmpDynamicLossScale'
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ZOO", "Difference", "ZooEntry"]


class ZooEntry(NamedTuple):
    """One column of the zoo's matrix.

    Attributes:
        name: The column's name.
        title: What it is, in words (the class, the mode).
        target: ``"module:Class"`` of its adapter, a plain class built with no arguments.
        requires: Modules that must be importable; otherwise the column is
            ``not installed`` and ``install`` says how to get them.
        install: The command that installs what it needs.
        env: Environment variables of its worker process (``KERAS_BACKEND``...).
    """

    name: str
    title: str
    target: str
    requires: tuple[str, ...]
    install: str
    env: dict[str, str] = {}


class Difference(NamedTuple):
    """One cause of a scaler's departures from the spec, explained and shown by hand.

    Attributes:
        cause: The cause as the suite names it (a departure of
            :data:`unifiedamp.conformance._causes.DEPARTURES`, or the ``[cause]`` a
            contract test's message gives).
        sentence: What the scaler does instead, in one sentence, and why (its code).
        matters: Whether it changes real fp16 training, and when.
        checked: The hand check: the scaler's code that does it (file, function) and
            the steps computed by hand.
        snippet: A standalone script (path from the project's root, under
            ``docs/snippets/zoo/``) that shows the cause with the scaler alone: no
            unifiedamp, a few lines, asserting what the scaler does against the spec's
            values computed by hand.
        columns: The zoo columns it applies to; empty: every column of its module.
    """

    cause: str
    sentence: str
    matters: str
    checked: str
    snippet: str
    columns: tuple[str, ...] = ()


_ZOO = "pip install 'unifiedamp[zoo]'"

ZOO: dict[str, ZooEntry] = {e.name: e for e in (
    ZooEntry("torch", "torch.amp.GradScaler",
             "unifiedamp.conformance.zoo.torch_grad_scaler:TorchAmpGradScaler",
             ("torch",), _ZOO),
    ZooEntry("torch-sharded", "torch.distributed.fsdp.ShardedGradScaler (one process)",
             "unifiedamp.conformance.zoo.torch_grad_scaler:ShardedGradScaler",
             ("torch",), _ZOO),
    ZooEntry("paddle", "paddle.amp.GradScaler (Paddle's CPU build: it disables itself off "
             "GPU/XPU, so only its disabled behaviour is compared here)",
             "unifiedamp.conformance.zoo.paddle_grad_scaler:PaddleGradScaler",
             ("paddle",), _ZOO),
    *(ZooEntry(f"keras-{backend}", f"keras.optimizers.LossScaleOptimizer on {backend}",
               "unifiedamp.conformance.zoo.keras_loss_scale_optimizer:KerasLossScaleOptimizer",
               ("keras", backend), _ZOO, {"KERAS_BACKEND": backend})
      for backend in ("tensorflow", "jax", "torch")),
    ZooEntry("tensorflow-v1",
             "tf.compat.v1.mixed_precision.DynamicLossScale (MixedPrecisionLossScaleOptimizer)",
             "unifiedamp.conformance.zoo.tensorflow_loss_scale:TensorFlowV1DynamicLossScale",
             ("tensorflow",), _ZOO),
    ZooEntry("jmp", "jmp.DynamicLossScale",
             "unifiedamp.conformance.zoo.jmp_loss_scale:JmpDynamicLossScale",
             ("jmp", "jax"), _ZOO),
    ZooEntry("flax", "flax.training.dynamic_scale.DynamicScale",
             "unifiedamp.conformance.zoo.flax_dynamic_scale:FlaxDynamicScale",
             ("flax", "optax", "jax"), _ZOO),
    ZooEntry("deepspeed", "DeepSpeed DynamicLossScaler, driven by ZeRO's step",
             "unifiedamp.conformance.zoo.deepspeed_loss_scaler:DeepSpeedLossScaler",
             ("deepspeed", "torch"), _ZOO),
    ZooEntry("deepspeed-consecutive",
             "DeepSpeed DynamicLossScaler(consecutive_hysteresis=True), driven by ZeRO's step",
             "unifiedamp.conformance.zoo.deepspeed_loss_scaler:DeepSpeedConsecutiveLossScaler",
             ("deepspeed", "torch"), _ZOO),
    ZooEntry("megatron", "Megatron-core DynamicGradScaler, driven by MixedPrecisionOptimizer",
             "unifiedamp.conformance.zoo.megatron_grad_scaler:MegatronDynamicGradScaler",
             ("megatron.core", "torch"), _ZOO),
    ZooEntry("colossalai", "Colossal-AI DynamicGradScaler (MixedPrecisionOptimizer, fp16)",
             "unifiedamp.conformance.zoo.colossalai_grad_scaler:ColossalAIDynamicGradScaler",
             ("colossalai", "torch"), _ZOO),
    ZooEntry("mindspore", "mindspore.amp.DynamicLossScaler (functional loop, PyNative)",
             "unifiedamp.conformance.zoo.mindspore_loss_scaler:MindSporeDynamicLossScaler",
             ("mindspore",), _ZOO),
)}
