"""Megatron-core's DynamicGradScaler backs off at every overflow after its first backoff, until
the scale grows again.

megatron/core/optimizer/grad_scaler.py, DynamicGradScaler.update: an overflow does
`self._hysteresis_tracker -= 1` and backs off while it is <= 0; a backoff leaves it there (0,
-1, ...), and only a growth sets it back to hysteresis. With hysteresis 2, four overflows in a
row back off three times. The spec re-arms the hysteresis at each backoff: 1024, 512, 512, 256.
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
for _ in range(4):
    scaler.update(True)
    scales.append(scaler.scale.item())

# spec, hysteresis 2: the 2nd overflow backs off (1024 * 0.5 = 512) and restarts the count,
# the 4th backs off again (512 * 0.5 = 256)
spec = [1024.0, 512.0, 512.0, 256.0]
assert scales == [1024.0, 512.0, 256.0, 128.0] != spec, scales
print(f"megatron DynamicGradScaler(hysteresis=2), four overflows: scales {scales}, spec {spec}")
