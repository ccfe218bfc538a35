"""Keras's LossScaleOptimizer on TensorFlow and JAX: their CPU kernels flush subnormal
float32 values to 0, so a backoff below 2**-126 gives 0.

keras/src/optimizers/loss_scale_optimizer.py: a backoff assigns ops.multiply(dynamic_scale,
0.5). 2**-126 * 0.5 = 2**-127 is a subnormal float32, which TensorFlow's and XLA's CPU
kernels flush to 0 (on torch the product is 2**-127). The spec halves to 2**-127.
"""

import keras
import numpy as np

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="zeros")])
optimizer = keras.optimizers.LossScaleOptimizer(
    keras.optimizers.Adam(1e-3), initial_scale=2.0**-126, dynamic_growth_steps=1)
model.compile(optimizer=optimizer, loss="mse")
model.train_on_batch(np.array([[np.inf, 0.5]], np.float32), np.zeros((1, 1), np.float32))

spec = 2.0**-127  # f32(2**-126 * 0.5), the subnormal 0x00400000
scale = float(optimizer.dynamic_scale)
assert scale == 0.0 != spec, scale
print(f"keras LossScaleOptimizer ({keras.backend.backend()}) at 2**-126, an overflow: scale "
      f"{scale!r}; spec {spec!r}")
