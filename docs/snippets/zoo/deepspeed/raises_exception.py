"""DeepSpeed's DynamicLossScaler raises at an overflow when its scale is already min_scale.

deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale: `if (self.cur_scale ==
self.min_scale) and self.raise_error_at_min_scale: raise Exception("Current loss scale already
at minimum - cannot decrease scale anymore. Exiting run.")`; raise_error_at_min_scale defaults to
True and CreateLossScaler, which ZeRO calls, does not set it. From 2 with min_scale 1 (DeepSpeed's
default min_loss_scale), the first overflow backs off to max(2 / 2, 1) = 1, the second raises.
The spec keeps the scale at min_scale and skips the step: 1, 1.
"""

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

# update_scale logs each overflow with deepspeed.comm.get_rank(): DeepSpeed's communication
# backend, over a one-process group here (deepspeed.initialize starts it in a training run).
# On CPU its constructor would first compile a shared-memory all-reduce op, for minutes, that
# one rank does not use: the op is marked as not available on this machine.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
deepspeed.init_distributed("gloo")

# As DeepSpeed's ZeRO optimizer builds it from the fp16 section of its config.
scaler = CreateLossScaler(torch.half, 0, True, {
    "init_scale": 2.0, "scale_window": 1000, "delayed_shift": 1,
    "consecutive_hysteresis": False, "min_scale": 1})
scaler.update_scale(True)
first = scaler.cur_scale
try:
    scaler.update_scale(True)
    raised = None
except Exception as exc:  # DeepSpeed raises a bare Exception
    raised = str(exc)
dist.destroy_process_group()

spec = [1.0, 1.0]  # max(2 * 0.5, 1) = 1, then max(1 * 0.5, 1) = 1
assert first == spec[0], first
assert raised == ("Current loss scale already at minimum - cannot decrease scale anymore. "
                  "Exiting run."), raised
print(f"deepspeed DynamicLossScaler(min_scale=1) from 2, two overflows: {first}, then it raised "
      f"Exception({raised!r}); spec {spec}")
