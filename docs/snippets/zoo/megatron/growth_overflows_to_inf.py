"""Megatron-core's DynamicGradScaler grows past float32's maximum to inf, for good.

megatron/core/optimizer/grad_scaler.py, DynamicGradScaler.update: a growth does `self._scale =
self._scale * self.growth_factor` on float32 tensors with no check that the product is finite
(there is no max_scale). From 2**127 a growth gives inf; every later scaled loss is inf, and a
backoff keeps it: torch.max(inf * 0.5, min_scale) = inf. The spec keeps the scale when its
growth overflows: 2**127, then an overflow halves it.
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
    scaler = DynamicGradScaler(initial_scale=2.0**127, min_scale=1.0, growth_factor=2.0,
                               backoff_factor=0.5, growth_interval=1, hysteresis=1)
scales = []
for found_inf in (False, True):  # a finite step, then an overflow
    scaler.update(found_inf)
    scales.append(scaler.scale.item())

# spec: 2**127 * 2 overflows float32, so the finite step keeps 2**127; the overflow halves it
spec = [2.0**127, 2.0**126]
assert scales == [float("inf"), float("inf")] != spec, scales
print(f"megatron DynamicGradScaler(initial_scale=2**127), a growth then an overflow: scales "
      f"{scales}, spec {spec}")
