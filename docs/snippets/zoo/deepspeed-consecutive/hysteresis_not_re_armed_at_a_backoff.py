"""DeepSpeed's DynamicLossScaler(consecutive_hysteresis=True) backs off at every overflow after
its first backoff, until a finite step refills the hysteresis.

deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale: an overflow backs off
`if self.delayed_shift == 1 or self.cur_hysteresis == 1`, else does cur_hysteresis -= 1; the
backoff leaves cur_hysteresis at 1, and with consecutive_hysteresis=True only a finite step (or
a growth) sets it back to delayed_shift. With delayed_shift 2, four overflows in a row back off
three times. The spec re-arms the hysteresis at each backoff: 1024, 512, 512, 256.
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
    "consecutive_hysteresis": True, "min_scale": 1})
scales = []
for _ in range(4):
    scaler.update_scale(True)
    scales.append(scaler.cur_scale)
dist.destroy_process_group()

# spec, hysteresis 2: the 2nd overflow backs off (1024 * 0.5 = 512) and restarts the count,
# the 4th backs off again (512 * 0.5 = 256)
spec = [1024.0, 512.0, 512.0, 256.0]
assert scales == [1024.0, 512.0, 256.0, 128.0] != spec, scales
print(f"deepspeed DynamicLossScaler(delayed_shift=2, consecutive_hysteresis=True), four "
      f"overflows: scales {scales}, spec {spec}")
