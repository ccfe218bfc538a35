"""MindSpore's DynamicLossScaler never backs off below 1.

mindspore/amp.py, DynamicLossScaler.adjust: ops.maximum(one, self.scale_value /
self.scale_factor) on a non-finite step (and __init__ raises for a scale_value below 1).
The spec without min_scale halves on: from 2, three overflows give 1, 0.5, 0.25.
"""

import mindspore
from mindspore import amp

loss_scaler = amp.DynamicLossScaler(scale_value=2.0, scale_factor=2, scale_window=2000)
scales = []
for _ in range(3):
    loss_scaler.adjust(mindspore.Tensor(False))  # all_finite(grads) found an inf
    scales.append(float(loss_scaler.scale_value.asnumpy()))

spec = [1.0, 0.5, 0.25]
assert scales == [1.0, 1.0, 1.0] != spec, scales
print(f"mindspore DynamicLossScaler from 2.0, three overflows: scales {scales}, spec {spec}")
