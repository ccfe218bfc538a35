"""Colossal-AI's fp16 optimizer unscales the step that grows the scale with the grown scale: its
gradients are growth_factor (2) times too small.

colossalai/amp/naive_amp/mixed_precision_optimizer.py, MixedPrecisionOptimizer.step:
self.mixed_precision.should_skip_step() calls grad_scaler.update(found_inf) first, then
_unscale_and_clip_grads divides by get_grad_div_scale(), the scale after that update. With
growth_interval 1, the first finite step grows 1024 -> 2048, so its gradients, scaled by 1024,
are divided by 2048. The spec unscales a step with the scale that scaled its loss: the gradient
of sum(w . x + b) with x = (1, 1) is 1 for every parameter.
"""

import colossalai.accelerator as accelerator
import torch
import torch.distributed as dist
from colossalai.amp.naive_amp.mixed_precision_optimizer import MixedPrecisionOptimizer


class CpuAccelerator(accelerator.CpuAccelerator):
    # DynamicGradScaler.__init__ calls get_accelerator().device_count() and drops the answer;
    # Colossal-AI 0.3.6's CPU accelerator raises there (on a GPU nothing of this is needed).
    def device_count(self):
        return 1


if type(accelerator.get_accelerator()) is accelerator.CpuAccelerator:
    accelerator.set_accelerator(CpuAccelerator())
# step() all-reduces the overflow flag across ranks: a one-process group.
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

model = torch.nn.Linear(2, 1)
sgd = torch.optim.SGD(model.parameters(), lr=0.01)
optimizer = MixedPrecisionOptimizer(sgd, initial_scale=1024.0, growth_interval=1)
optimizer.zero_grad()
optimizer.backward(model(torch.ones(1, 2)).sum())
optimizer.step()
unscaled = [g.item() for p in model.parameters() for g in p.grad.flatten()]
scale = optimizer.mixed_precision.grad_scaler.scale.item()
dist.destroy_process_group()

spec = [1.0, 1.0, 1.0]  # d sum(w . x + b) / d(w, b) = (1, 1, 1), at every scale
assert scale == 2048.0, scale
assert unscaled == [0.5, 0.5, 0.5] != spec, unscaled
print(f"colossalai growth_interval=1 from 1024: the growth step (1024 -> 2048) stepped with "
      f"gradients {unscaled}, spec {spec}")
