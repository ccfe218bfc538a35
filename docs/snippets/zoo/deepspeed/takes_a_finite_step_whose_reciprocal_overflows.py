"""DeepSpeed's ZeRO step takes a finite step whose 1/scale overflows float32, with inf
gradients.

deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.step: has_overflow tests the
scaled gradients with has_inf_or_nan, then _update_scale(overflow), then unscale_and_clip_grads
multiplies each gradient by 1. / self.loss_scale. At a scale of 2**-130 the scaled gradients
(2**-130 * 1) are finite, so nothing overflows, the scale stays 2**-130 (the first finite step
never grows), and 1. / 2**-130 = 2**130 is inf once it multiplies float32 gradients: SGD writes
-inf into the weights. The spec counts a step whose 1/scale overflows as an overflow: it skips
it and backs off to 2**-131.
"""

import math

import torch
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
from deepspeed.runtime.utils import has_inf_or_nan

# As DeepSpeed's ZeRO optimizer builds it from the fp16 section of its config; min_scale 0 is
# no floor, the spec's min_scale=None (DeepSpeed's JSON config asks for an integer >= 1).
scaler = CreateLossScaler(torch.half, 0, True, {
    "init_scale": 2.0**-130, "scale_window": 1, "delayed_shift": 1,
    "consecutive_hysteresis": False, "min_scale": 0})
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

# One ZeRO step, in its order: backward of the scaled loss, overflow check, update, unscale.
scaler.backward(model(torch.ones(1, 2)).sum())  # gradients 2**-130 * 1: finite
overflow = any(has_inf_or_nan(p.grad) for p in model.parameters())
scaler.update_scale(overflow)
for p in model.parameters():
    p.grad.mul_(1.0 / scaler.loss_scale)
optimizer.step()

weights = [w.item() for p in model.parameters() for w in p.flatten()]
spec = 2.0**-131  # 1 / 2**-130 overflows float32: skipped, 2**-130 * 0.5
assert not overflow and scaler.cur_scale == 2.0**-130 != spec, scaler.cur_scale
assert not any(math.isfinite(w) for w in weights), weights  # w - 0.01 * inf = -inf
print(f"deepspeed ZeRO step at scale 2**-130, a finite step: taken, weights {weights}, scale "
      f"{scaler.cur_scale!r} (spec: skipped, scale {spec!r})")
