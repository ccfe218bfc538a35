"""DeepSpeed's DynamicLossScaler grows on the (scale_window + 1)-th finite step after the start
or an overflow; later growths come every scale_window finite steps.

deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale: on a finite step,
stable_interval = (cur_iter - last_overflow_iter) - 1 and the scale grows if stable_interval > 0
and stable_interval % scale_window == 0; last_overflow_iter starts at -1 and becomes cur_iter at
each overflow, so the first finite step after either has stable_interval 0. With scale_window 2,
finite steps give stable intervals 0, 1, 2 (grows), 3, 4 (grows). The spec grows on every
growth_interval-th finite step: steps 2 and 4.
"""

import torch
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

# As DeepSpeed's ZeRO optimizer builds it from the fp16 section of its config.
scaler = CreateLossScaler(torch.half, 0, True, {
    "init_scale": 1024.0, "scale_window": 2, "delayed_shift": 1,
    "consecutive_hysteresis": False, "min_scale": 1})
scales = []
for _ in range(5):
    scaler.update_scale(False)  # what ZeRO's step passes on a step without overflow
    scales.append(scaler.cur_scale)

# spec, growth_interval 2: finite steps 2 and 4 grow, 1024 * 2 = 2048, 2048 * 2 = 4096
spec = [1024.0, 2048.0, 2048.0, 4096.0, 4096.0]
assert scales == [1024.0, 1024.0, 2048.0, 2048.0, 4096.0] != spec, scales
print(f"deepspeed DynamicLossScaler(scale_window=2), 5 finite steps: scales {scales}, "
      f"spec {spec}")
