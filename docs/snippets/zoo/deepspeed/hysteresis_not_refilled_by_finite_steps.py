"""DeepSpeed's DynamicLossScaler (consecutive_hysteresis=False, its default) counts overflows
since the last growth: finite steps between two overflows do not refill its hysteresis.

deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale: an overflow backs off
if delayed_shift == 1 or cur_hysteresis == 1, else does cur_hysteresis -= 1; a finite step sets
cur_hysteresis = delayed_shift only if consecutive_hysteresis, or where the scale grows. With
delayed_shift 2 (DeepSpeed's default hysteresis), overflow, finite step, overflow backs off on
the second overflow. The spec counts consecutive overflows: the finite step resets the count,
so the scale stays 1024.
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
    "init_scale": 1024.0, "scale_window": 1000, "delayed_shift": 2,
    "consecutive_hysteresis": False, "min_scale": 1})
scales = []
for overflow in (True, False, True):  # what ZeRO's step passes it
    scaler.update_scale(overflow)
    scales.append(scaler.cur_scale)
dist.destroy_process_group()

# spec, hysteresis 2: I -> 1 overflow in a row (1024); F -> 0; I -> 1 (1024)
spec = [1024.0, 1024.0, 1024.0]
assert scales == [1024.0, 1024.0, 512.0] != spec, scales
print(f"deepspeed DynamicLossScaler(delayed_shift=2), overflow, finite, overflow: scales "
      f"{scales}, spec {spec}")
