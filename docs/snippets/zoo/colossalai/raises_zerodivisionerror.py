"""Colossal-AI's fp16 optimizer raises ZeroDivisionError on a finite step once backoffs have
taken the scale to 0.

colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py, DynamicGradScaler._backoff_scale:
`self._scale * self._backoff_factor`, floored only `if self._min_scale` (min_scale=None leaves
no floor; MixedPrecisionOptimizer's default is 1). From 2**-148, two overflows give 2**-149,
then 2**-150, which rounds to 0 in float32. The next finite step's gradients are 0 (finite), the
update keeps 0 (0 * 2), and MixedPrecisionOptimizer._unscale_and_clip_grads computes
1.0 / div_scale with div_scale = scale.item() = 0.0. The spec, at a scale of 0, counts the step
as an overflow (1/0 is inf), skips it and stays at 0.
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
optimizer = MixedPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                    initial_scale=2.0**-148, growth_interval=1000,
                                    hysteresis=1, min_scale=None)
scales = []
raised = None
for x in (float("inf"), float("inf"), 1.0):  # two inf steps, then a finite one
    optimizer.zero_grad()
    optimizer.backward(model(torch.tensor([[x, 1.0]])).sum())
    try:
        optimizer.step()
    except ZeroDivisionError as exc:
        raised = exc
    scales.append(optimizer.mixed_precision.grad_scaler.scale.item())
dist.destroy_process_group()

# spec: 2**-148 * 0.5 = 2**-149; 2**-149 * 0.5 rounds to 0; at 0 a finite step is skipped
spec = [2.0**-149, 0.0, 0.0]
assert scales == spec, scales
assert isinstance(raised, ZeroDivisionError), raised
print(f"colossalai MixedPrecisionOptimizer(min_scale=None) from 2**-148, inf, inf, finite: "
      f"scales {scales}, the finite step raised ZeroDivisionError({raised}); spec {spec}, "
      f"skipped")
