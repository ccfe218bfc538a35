"""Colossal-AI's DynamicGradScaler without max_scale grows past float32's maximum to inf, for
good.

colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py, DynamicGradScaler._grow_scale:
`self._scale = self._scale * self._growth_factor` on a float32 tensor, clamped only `if
self._max_scale` (MixedPrecisionOptimizer's default max_scale is 2**32; max_scale=None leaves
no ceiling), with no check that the product is finite. From 2**127, a growth gives inf, and a
backoff keeps it (inf * 0.5). The spec keeps the scale when its growth overflows: 2**127.
"""

import colossalai.accelerator as accelerator
from colossalai.amp.naive_amp.grad_scaler import DynamicGradScaler


class CpuAccelerator(accelerator.CpuAccelerator):
    # DynamicGradScaler.__init__ calls get_accelerator().device_count() and drops the answer;
    # Colossal-AI 0.3.6's CPU accelerator raises there (on a GPU nothing of this is needed).
    def device_count(self):
        return 1


if type(accelerator.get_accelerator()) is accelerator.CpuAccelerator:
    accelerator.set_accelerator(CpuAccelerator())

scaler = DynamicGradScaler(initial_scale=2.0**127, growth_interval=1, max_scale=None)
scales = []
for overflow in (False, True):  # a finite step, then an overflow
    scaler.update(overflow)
    scales.append(scaler.scale.item())

# spec: 2**127 * 2 overflows float32, so the finite step keeps 2**127; the overflow halves it
spec = [2.0**127, 2.0**126]
assert scales == [float("inf"), float("inf")] != spec, scales
print(f"colossalai DynamicGradScaler(initial_scale=2**127, max_scale=None), a growth then an "
      f"overflow: scales {scales}, spec {spec}")
