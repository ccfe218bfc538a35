"""Megatron-core's DynamicGradScaler counts overflows since the last growth: finite steps
between two overflows do not refill its hysteresis.

megatron/core/optimizer/grad_scaler.py, DynamicGradScaler.update: an overflow does
`self._hysteresis_tracker -= 1` and backs off once it is <= 0; a finite step only counts
_growth_tracker up, and `self._hysteresis_tracker = self.hysteresis` happens only where the
scale grows. With hysteresis 2 (Megatron's default), overflow, finite step, overflow backs off
on the second overflow. The spec counts consecutive overflows: the finite step resets the
count, so the scale stays 1024.
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
                               backoff_factor=0.5, growth_interval=1000, hysteresis=2)
scales = []
for found_inf in (True, False, True):  # what MixedPrecisionOptimizer.step passes it
    scaler.update(found_inf)
    scales.append(scaler.scale.item())

# spec, hysteresis 2: I -> 1 overflow in a row (1024); F -> 0; I -> 1 (1024)
spec = [1024.0, 1024.0, 1024.0]
assert scales == [1024.0, 1024.0, 512.0] != spec, scales
print(f"megatron DynamicGradScaler(hysteresis=2), overflow, finite, overflow: scales {scales}, "
      f"spec {spec}")
