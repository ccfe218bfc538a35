"""TensorFlow's tf.compat.v1 MixedPrecisionLossScaleOptimizer unscales by a 1/scale that
TensorFlow flushes to 0 on CPU once the scale is above 2**126.

tensorflow/python/training/experimental/loss_scale_optimizer.py,
MixedPrecisionLossScaleOptimizer._unscale_grads: loss_scale_reciprocal = 1 / loss_scale,
then grad * loss_scale_reciprocal. 1 / 2**127 = 2**-127 is a subnormal float32, which
TensorFlow's CPU kernels flush to 0: the finite gradients come back 0 and the step moves
no parameter. The spec multiplies by the float32 reciprocal: 2**123 * 2**-127 = 2**-4.
"""

import numpy as np
import tensorflow as tf

w = tf.Variable([1.0, 1.0])
optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
    tf.compat.v1.train.AdamOptimizer(1e-3),
    tf.compat.v1.mixed_precision.DynamicLossScale(initial_loss_scale=2.0**127))
(grad, _), = optimizer.compute_gradients(lambda: tf.reduce_sum(w) * 2.0**-4, var_list=[w])

# d(2**127 * sum(w) / 16)/dw = 2**123, times the float32 reciprocal 2**-127.
spec = np.float32(2.0**123) * (np.float32(1.0) / np.float32(2.0**127))
assert spec == 2.0**-4
assert grad.numpy().tolist() == [0.0, 0.0], grad.numpy()
print(f"tf.compat.v1 MixedPrecisionLossScaleOptimizer at scale 2**127: gradients "
      f"{grad.numpy().tolist()}, spec {[float(spec)] * 2}")
