"""Megatron-core's optimizer takes a finite step whose 1/scale overflows float32, with inf
gradients, and grows the scale.

megatron/core/optimizer/optimizer.py, MixedPrecisionOptimizer.prepare_grads: its
_unscale_main_grads_and_check_for_nan runs torch._amp_foreach_non_finite_check_and_unscale_(
main_grads, found_inf, grad_scaler.inv_scale), which checks the scaled gradients for inf/NaN
before it multiplies them by inv_scale = scale.double().reciprocal().float(); then
grad_scaler.update(found_inf_flag), and with no inf found, step() steps the inner optimizer. At
a scale of 2**-130, inv_scale = 2**130 is inf in float32: the scaled gradients (2**-130,
finite) pass the check and become inf, SGD writes -inf into the weights and the scale grows to
2**-129. The spec counts a step whose 1/scale overflows as an overflow: it skips it and backs
off to 2**-131.
"""

import math

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
    scaler = DynamicGradScaler(initial_scale=2.0**-130, min_scale=2.0**-149, growth_factor=2.0,
                               backoff_factor=0.5, growth_interval=1, hysteresis=1)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

# One step of MixedPrecisionOptimizer: scaled loss, check-and-unscale, update, step.
(model(torch.ones(1, 2)).sum() * scaler.scale.to("cpu")).backward()  # gradients 2**-130
grads = [p.grad for p in model.parameters()]
found_inf = torch.zeros(1)
torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, scaler.inv_scale.to("cpu"))
scaler.update(found_inf.item() > 0)
if found_inf.item() == 0:
    optimizer.step()

weights = [w.item() for p in model.parameters() for w in p.flatten()]
spec = 2.0**-131  # 1 / 2**-130 overflows float32: skipped, 2**-130 * 0.5
assert found_inf.item() == 0 and scaler.scale.item() == 2.0**-129 != spec, scaler.scale
assert not any(math.isfinite(w) for w in weights), weights  # w - 0.01 * inf = -inf
print(f"megatron at scale 2**-130, a finite step: taken, weights {weights}, scale "
      f"{scaler.scale.item()!r} (spec: skipped, scale {spec!r})")
