"""Megatron-core's DynamicGradScaler never grows while its growth tracker is past
growth_interval.

megatron/core/optimizer/grad_scaler.py, DynamicGradScaler.update: a finite step does
`self._growth_tracker += 1` and grows `if self._growth_tracker == self.growth_interval`. A
tracker past the interval (a checkpoint's growth_tracker loaded into a run with a smaller
--loss-scale-window, or growth_interval lowered) only counts up. After 3 finite steps at
growth_interval 5, lowered to 2: the trackers 4, 5, 6 never equal 2. The spec grows on the
next finite step (tracker 3 + 1 >= 2): 2048.
"""

import torch
from megatron.core.optimizer.grad_scaler import DynamicGradScaler
from torch.overrides import TorchFunctionMode


class CudaOnCpu(TorchFunctionMode):
    # DynamicGradScaler allocates its tensors with device='cuda': without a GPU they go to the
    # CPU (on a GPU nothing changes).
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("device") == "cuda" and not torch.cuda.is_available():
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


with CudaOnCpu():
    scaler = DynamicGradScaler(initial_scale=1024.0, min_scale=1.0, growth_factor=2.0,
                               backoff_factor=0.5, growth_interval=5, hysteresis=1)
for _ in range(3):
    scaler.update(False)
scaler.growth_interval = 2
scales = []
for _ in range(3):
    scaler.update(False)
    scales.append(scaler.scale.item())

# spec: tracker 4 >= 2 grows (1024 * 2 = 2048, tracker 0), then 1, then 2 >= 2 grows (4096)
spec = [2048.0, 2048.0, 4096.0]
assert scales == [1024.0, 1024.0, 1024.0] != spec, scales
assert scaler._growth_tracker == 6  # what its state_dict() saves as growth_tracker
print(f"megatron DynamicGradScaler, growth_interval 5 -> 2 after 3 finite steps, 3 more: scales "
      f"{scales}, spec {spec}")
