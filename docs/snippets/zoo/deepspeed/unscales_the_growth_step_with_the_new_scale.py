"""DeepSpeed's ZeRO step unscales the step that grows the scale with the grown scale: its
gradients are growth_factor (2) times too small.

deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.step: self._update_scale(
self.overflow) runs before unscale_and_clip_grads, which multiplies each gradient by
1. / self.loss_scale, the scale after the update. With scale_window 1, the second finite step
grows 1024 -> 2048 (the first finite step never grows), so its gradients, scaled by 1024, are
divided by 2048. The spec unscales a step with the scale that scaled its loss: the gradient of
sum(w . x + b) with x = (1, 1) is 1 for every parameter.
"""

import torch
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
from deepspeed.runtime.utils import has_inf_or_nan

# As DeepSpeed's ZeRO optimizer builds it from the fp16 section of its config.
scaler = CreateLossScaler(torch.half, 0, True, {
    "init_scale": 1024.0, "scale_window": 1, "delayed_shift": 1,
    "consecutive_hysteresis": False, "min_scale": 1})
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
unscaled = []
for _ in range(2):
    # One ZeRO step, in its order: backward of the scaled loss, overflow check, update,
    # unscale, optimizer step.
    optimizer.zero_grad()
    scaler.backward(model(torch.ones(1, 2)).sum())
    overflow = any(has_inf_or_nan(p.grad) for p in model.parameters())
    scaler.update_scale(overflow)
    for p in model.parameters():
        p.grad.mul_(1.0 / scaler.loss_scale)
    unscaled.append([g.item() for p in model.parameters() for g in p.grad.flatten()])
    optimizer.step()

spec = [[1.0, 1.0, 1.0]] * 2  # d sum(w . x + b) / d(w, b) = (1, 1, 1), at every scale
assert scaler.cur_scale == 2048.0, scaler.cur_scale
assert unscaled == [[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]] != spec, unscaled
print(f"deepspeed ZeRO step, scale_window=1 from 1024: the growth step (1024 -> 2048) stepped with "
      f"gradients {unscaled[1]}, spec {spec[1]}")
