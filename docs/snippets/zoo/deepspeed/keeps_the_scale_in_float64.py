"""DeepSpeed's DynamicLossScaler keeps its scale as a Python float (float64): it grows past
float32's maximum, to a value no float32 holds.

deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale: `self.cur_scale *=
self.scale_factor` on a Python float, with no float32 rounding and no bound. From 2**127 with
scale_window 1, the second finite step grows (it grows one step late) to 2**128 =
3.4028236692093846e+38, which rounds to inf in float32. The spec multiplies in float32 and
keeps the scale when the product overflows: 2**127.
"""

import numpy as np
import torch
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

# As DeepSpeed's ZeRO optimizer builds it from the fp16 section of its config.
scaler = CreateLossScaler(torch.half, 0, True, {
    "init_scale": 2.0**127, "scale_window": 1, "delayed_shift": 1,
    "consecutive_hysteresis": False, "min_scale": 1})
scales = []
for _ in range(2):
    scaler.update_scale(False)
    scales.append(scaler.cur_scale)

# spec: 2**127 * 2 = 2**128 is past float32's maximum (3.4028235e+38): the scale stays 2**127
spec = [2.0**127, 2.0**127]
assert scales == [2.0**127, 2.0**128] != spec, scales
assert scales[1] > float(np.finfo(np.float32).max)  # no float32 value: it rounds to inf
print(f"deepspeed DynamicLossScaler(init_scale=2**127, scale_window=1), 2 finite steps: scales "
      f"{scales}, spec {spec}")
