"""Colossal-AI's DynamicGradScaler.state_dict carries no counter: a scaler that loads it counts
its growth interval from 0 again.

colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py: state_dict() holds scale,
growth_factor, backoff_factor and hysteresis; load_state_dict sets those four and leaves
`_growth_step` (and `_hysteresis_step`) as the new scaler was built, 0. After 2 finite steps
of growth_interval 3, the uninterrupted scaler grows on the next one; the reloaded one needs 3
more. The spec's state holds the growth tracker (2): the next finite step grows to 2048.
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

saved = DynamicGradScaler(initial_scale=1024.0, growth_interval=3)
for _ in range(2):
    saved.update(False)
state_dict = saved.state_dict()
loaded = DynamicGradScaler(initial_scale=1024.0, growth_interval=3)
loaded.load_state_dict(state_dict)
saved.update(False)
loaded.update(False)

# spec: the state holds growth tracker 2; the 3rd finite step grows, 1024 * 2 = 2048
spec = 2048.0
assert sorted(state_dict) == ["backoff_factor", "growth_factor", "hysteresis", "scale"]
assert saved.scale.item() == spec and loaded.scale.item() == 1024.0, loaded.scale
print(f"colossalai DynamicGradScaler(growth_interval=3), 2 finite steps, state_dict reloaded, "
      f"1 more: scale {loaded.scale.item()} (uninterrupted {saved.scale.item()}), spec {spec}")
