"""TensorFlow's tf.compat.v1 DynamicLossScale never backs off below 1.

tensorflow/python/training/experimental/loss_scale.py, DynamicLossScale.update: on
non-finite gradients, math_ops.maximum(self._current_loss_scale / self._multiplier, 1).
The spec without min_scale halves on: from 2, three overflows give 1, 0.5, 0.25.
"""

import numpy as np
import tensorflow as tf

loss_scale = tf.compat.v1.mixed_precision.DynamicLossScale(initial_loss_scale=2.0)
scales = []
for _ in range(3):
    loss_scale.update([tf.constant([np.inf, 1.0])])
    scales.append(float(loss_scale().numpy()))

spec = [1.0, 0.5, 0.25]
assert scales == [1.0, 1.0, 1.0] != spec, scales
print(f"tf.compat.v1 DynamicLossScale from 2.0, three overflows: scales {scales}, spec {spec}")
