"""Keras's LossScaleOptimizer checks the scaled gradients before dividing them by the scale,
so at a scale of 0 (or a subnormal one) it takes a finite step and divides by it: every
weight becomes NaN.

keras/src/optimizers/loss_scale_optimizer.py: _common_apply (and _tf_apply, and
stateless_apply on JAX) checks check_finite(grads) on the scaled gradients, then the
finite branch unscales with ops.divide(g, scale). A run of overflows halves the scale to 0
(2**-149 * 0.5 rounds to 0 in float32); then scale_loss gives 0, the gradients are 0,
finite, and 0 / 0 = NaN goes to Adam. The spec skips a step whose 1 / scale overflows
(1 / 0 is inf): the weights stay as they were.
"""

import keras
import numpy as np

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="zeros")])
optimizer = keras.optimizers.LossScaleOptimizer(
    keras.optimizers.Adam(1e-3), initial_scale=2.0**-148, dynamic_growth_steps=1)
model.compile(optimizer=optimizer, loss="mse")
y = np.zeros((1, 1), np.float32)
for _ in range(2):  # two overflows: 2**-148 * 0.5 * 0.5 = 2**-150, which rounds to 0
    model.train_on_batch(np.array([[np.inf, 0.5]], np.float32), y)
assert float(optimizer.dynamic_scale) == 0.0
model.train_on_batch(np.full((1, 2), 0.5, np.float32), y)  # finite gradients

nan = [bool(keras.ops.all(keras.ops.isnan(w))) for w in model.weights]
assert all(nan), nan  # the spec skips the step: the weights stay 0
print(f"keras LossScaleOptimizer ({keras.backend.backend()}) at scale 0, a finite step: taken, "
      "every weight NaN; spec: skipped, the weights unchanged (0)")
