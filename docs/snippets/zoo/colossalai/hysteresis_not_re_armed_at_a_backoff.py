"""Colossal-AI's DynamicGradScaler backs off at every overflow after its first backoff, until
the scale grows again.

colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py, DynamicGradScaler.update: an
overflow does `_hysteresis_step += 1` and backs off while `_hysteresis_step >= hysteresis`; a
backoff leaves the counter where it is (only a growth sets it to 0). With hysteresis=2, four
overflows in a row back off three times. The spec re-arms the hysteresis at each backoff:
1024, 512, 512, 256.
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
for _ in range(4):
    scaler.update(True)
    scales.append(scaler.scale.item())

# spec, hysteresis 2: the 2nd overflow backs off (1024 * 0.5 = 512) and restarts the count,
# the 4th backs off again (512 * 0.5 = 256)
spec = [1024.0, 512.0, 512.0, 256.0]
assert scales == [1024.0, 512.0, 256.0, 128.0] != spec, scales
print(f"colossalai DynamicGradScaler(hysteresis=2), four overflows: scales {scales}, "
      f"spec {spec}")
