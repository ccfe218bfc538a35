"""Keras's LossScaleOptimizer lets a growth past float32's maximum make the scale inf, and
then skips every step.

keras/src/optimizers/loss_scale_optimizer.py: a growth assigns ops.multiply(dynamic_scale,
2.0) with no finiteness check: 2**127 * 2 is inf in float32. From then on scale_loss gives
an inf loss, every gradient is inf or NaN, each step is skipped and inf * 0.5 stays inf.
The spec keeps 2**127 when the growth overflows, and takes the next finite step.
"""

import keras
import numpy as np

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="zeros")])
optimizer = keras.optimizers.LossScaleOptimizer(
    keras.optimizers.Adam(1e-3), initial_scale=2.0**127, dynamic_growth_steps=1)
model.compile(optimizer=optimizer, loss="mse")
x, y = np.full((1, 2), 0.5, np.float32), np.full((1, 1), 0.1, np.float32)

model.train_on_batch(x, y)  # finite scaled gradients (-0.1 and -0.2 times 2**127): a growth
scale = float(optimizer.dynamic_scale)
before = [keras.ops.copy(w) for w in model.weights]
model.train_on_batch(x, y)  # finite gradients again
skipped = all(bool(keras.ops.all(keras.ops.equal(w, b)))
              for w, b in zip(model.weights, before, strict=True))

spec = 2.0**127  # f32(2**127 * 2) is inf: the spec keeps 2**127 and takes the next step
assert scale == float(optimizer.dynamic_scale) == float("inf") != spec, scale
assert skipped
print(f"keras LossScaleOptimizer ({keras.backend.backend()}) at 2**127, a growth: scale {scale!r}"
      f", the next finite step skipped; spec {spec!r}, the next step taken")
