"""torch.amp.GradScaler multiplies its float32 scale by the factor as a float64.

torch/amp/grad_scaler.py, GradScaler.update passes the Python float growth_factor to
torch._amp_update_scale_, whose CPU kernel multiplies the float32 scale by it in double and
rounds the product to float32 once. The spec rounds the factor to float32 first:
f32(77 * f32(1.1)).
"""

import numpy as np
import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=77.0, growth_factor=1.1, growth_interval=1)
scaler.scale(model(torch.ones(1, 2)).sum() / 16).backward()
scaler.step(optimizer)
scaler.update()  # a finite step: grows
scale = scaler.get_scale()

# spec: f32(1.1) = 1.10000002384...; 77 * 1.10000002384 = 84.7000018358..., whose float32
# is 84.70000457763672 (0x42a96667)
spec = float(np.float32(77.0) * np.float32(1.1))
assert spec == 84.70000457763672
# torch: 77 * 1.1 = 84.700000000000003 in float64, whose float32 is 84.69999694824219
# (0x42a96666), one float32 step below the spec's
assert scale == float(np.float32(77.0 * 1.1)) == 84.69999694824219 != spec, scale
print(f"torch.amp.GradScaler(init_scale=77.0, growth_factor=1.1), one growth: {scale!r}, "
      f"spec {spec!r}")
