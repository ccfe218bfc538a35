"""Colossal-AI's DynamicGradScaler counts overflows since the last growth: finite steps between
two overflows do not reset its hysteresis counter.

colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py, DynamicGradScaler.update: an
overflow does `_hysteresis_step += 1` and backs off once `_hysteresis_step >= hysteresis`;
`_hysteresis_step = 0` only where the scale grows. With hysteresis=2 (MixedPrecisionOptimizer's
default), overflow, finite step, overflow backs off on the second overflow. The spec counts
consecutive overflows: the finite step resets the count, so the second overflow is the first
of a new run and the scale stays 1024.
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

scaler = DynamicGradScaler(initial_scale=1024.0, hysteresis=2, growth_interval=1000)
scales = []
for overflow in (True, False, True):  # what MixedPrecisionOptimizer.step passes it
    scaler.update(overflow)
    scales.append(scaler.scale.item())

# spec, hysteresis 2: I -> 1 overflow in a row (1024); F -> 0; I -> 1 (1024)
spec = [1024.0, 1024.0, 1024.0]
assert scales == [1024.0, 1024.0, 512.0] != spec, scales
print(f"colossalai DynamicGradScaler(hysteresis=2), overflow, finite, overflow: scales {scales}, "
      f"spec {spec}")
