"""The zoo: conformance adapters for loss scalers this project did not write.

Each entry drives one third-party scaler (DeepSpeed's, Megatron-core's, jmp's,
Keras 3's, native torch's and Paddle's...) through the shipped suite, so that
``unifiedamp conformance --zoo`` prints how each differs from the spec and
``docs/scalers.md`` explains every difference. An adapter is a plain class
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
    """A difference from the spec that the zoo's matrix reports, explained by hand.

    Attributes:
        sentence: What the scaler does instead, in one sentence.
        matters: Whether it changes real fp16 training, and when.
        checked: The hand check: the scaler's code that does it (file, function)
            and the steps computed by hand.
    """

    sentence: str
    matters: str
    checked: str


_ZOO = "pip install 'unifiedamp[zoo]'"

ZOO: dict[str, ZooEntry] = {e.name: e for e in (
    ZooEntry("torch", "torch.amp.GradScaler",
             "unifiedamp.conformance.zoo.torch_grad_scaler:TorchAmpGradScaler",
             ("torch",), _ZOO),
    ZooEntry("torch-sharded", "torch.distributed.fsdp.ShardedGradScaler (one process)",
             "unifiedamp.conformance.zoo.torch_grad_scaler:ShardedGradScaler",
             ("torch",), _ZOO),
    ZooEntry("paddle", "paddle.amp.GradScaler (native)",
             "unifiedamp.conformance.zoo.paddle_grad_scaler:PaddleGradScaler",
             ("paddle",), _ZOO),
    *(ZooEntry(f"keras-{backend}", f"keras.optimizers.LossScaleOptimizer on {backend}",
               "unifiedamp.conformance.zoo.keras_loss_scale_optimizer:KerasLossScaleOptimizer",
               ("keras", backend), _ZOO, {"KERAS_BACKEND": backend})
      for backend in ("tensorflow", "jax", "torch")),
    ZooEntry("jmp", "jmp.DynamicLossScale",
             "unifiedamp.conformance.zoo.jmp_loss_scale:JmpDynamicLossScale",
             ("jmp", "jax"), _ZOO),
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
)}
