"""Megatron-core's DynamicGradScaler has no scaling without a floor: the smallest min_scale its
float32 tensor holds is 2**-149, so the scale never reaches 0.

megatron/core/optimizer/grad_scaler.py, DynamicGradScaler.__init__ asserts min_scale > 0.0 and
keeps it as a float32 tensor; update backs off to torch.max(scale * backoff_factor, min_scale).
With min_scale 2**-149, the smallest float32 above 0, two overflows from 2**-148 give 2**-149
twice. The spec without min_scale goes on to 0: 2**-149 * 0.5 rounds to 0 in float32.
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
    scaler = DynamicGradScaler(initial_scale=2.0**-148, min_scale=2.0**-149, growth_factor=2.0,
                               backoff_factor=0.5, growth_interval=1000, hysteresis=1)
scales = []
for _ in range(2):
    scaler.update(True)
    scales.append(scaler.scale.item())

# spec, no min_scale: 2**-148 * 0.5 = 2**-149, then 2**-149 * 0.5 = 2**-150, a tie that
# rounds to the even 0
spec = [2.0**-149, 0.0]
assert scales == [2.0**-149, 2.0**-149] != spec, scales
print(f"megatron DynamicGradScaler(min_scale=2**-149) from 2**-148, two overflows: scales "
      f"{scales}, spec {spec}")
