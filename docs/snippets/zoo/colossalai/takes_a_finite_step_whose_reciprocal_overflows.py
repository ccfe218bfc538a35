"""Colossal-AI's fp16 optimizer takes a finite step whose 1/scale overflows float32, with inf
gradients, and grows the scale.

colossalai/amp/naive_amp/mixed_precision_optimizer.py, MixedPrecisionOptimizer.step:
should_skip_step() checks the scaled gradients with torch.isfinite and updates the scaler; then
_unscale_and_clip_grads does p.grad.data.mul_(1.0 / div_scale), div_scale being scale.item().
At a scale of 2**-130 the scaled gradients (2**-130 / 2) are finite, the scale grows (growth
interval 1) to 2**-129, and 1.0 / 2**-130 = 2**130 is inf once it multiplies float32 gradients:
SGD writes -inf into the weights. The spec counts a step whose 1/scale overflows as an overflow:
it skips it and backs off to 2**-131.
"""

import math

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
optimizer = MixedPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                    initial_scale=2.0**-130, growth_interval=1, min_scale=None)
optimizer.zero_grad()
optimizer.backward(model(torch.ones(1, 2)).sum() / 2)  # gradients 2**-130 / 2: finite
optimizer.step()
scale = optimizer.mixed_precision.grad_scaler.scale.item()
dist.destroy_process_group()

weights = [w.item() for p in model.parameters() for w in p.flatten()]
spec = 2.0**-131  # 1 / 2**-130 overflows float32: skipped, 2**-130 * 0.5
assert scale == 2.0**-129 != spec, scale  # grew: 2**-130 * 2
assert not any(math.isfinite(w) for w in weights), weights  # w - 0.01 * inf = -inf
print(f"colossalai MixedPrecisionOptimizer at scale 2**-130, a finite step: taken, weights "
      f"{weights}, scale {scale!r} (spec: skipped, scale {spec!r})")
