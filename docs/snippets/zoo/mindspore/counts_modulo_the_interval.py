"""MindSpore's DynamicLossScaler counts finite steps modulo scale_window.

mindspore/amp.py, DynamicLossScaler.adjust: it grows when counter == scale_window - 1 and
sets counter = ((counter + 1) % scale_window) * grads_finite. A counter of 7 restored
under scale_window=5 wraps to 3, then 4, and grows on the third finite step. The spec
grows on the first (tracker 7 + 1 >= 5): 2048, then 2048, 2048.
"""

import mindspore
import numpy as np
from mindspore import amp

loss_scaler = amp.DynamicLossScaler(scale_value=1024.0, scale_factor=2, scale_window=5)
loss_scaler.counter.set_data(mindspore.Tensor(np.int32(7)))  # as a restored checkpoint
scales, counters = [], []
for _ in range(3):
    loss_scaler.adjust(mindspore.Tensor(True))
    scales.append(float(loss_scaler.scale_value.asnumpy()))
    counters.append(int(loss_scaler.counter.asnumpy()))

spec = [2048.0, 2048.0, 2048.0]
assert scales == [1024.0, 1024.0, 2048.0] != spec, scales
assert counters == [3, 4, 0], counters
print(f"mindspore DynamicLossScaler, counter 7 with scale_window 5, three finite steps: "
      f"scales {scales}, spec {spec}")
