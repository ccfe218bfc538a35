"""Keras's LossScaleOptimizer never grows while its step_counter is past
dynamic_growth_steps - 1, until an overflow resets it.

keras/src/optimizers/loss_scale_optimizer.py: ops.cond(ops.equal(step_counter,
dynamic_growth_steps - 1), upscale, increment). Variables saved after 7 finite steps with
dynamic_growth_steps=10 (save_own_variables, as a .keras checkpoint does) and loaded into
one with dynamic_growth_steps=5: 7 != 4, the counter goes on to 8, 9, 10. The spec grows on
the next finite step (tracker 7 + 1 >= 5).
"""

import warnings

import keras
import numpy as np

x, y = np.full((1, 2), 0.5, np.float32), np.full((1, 1), 0.1, np.float32)


def compiled(growth_steps):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(1e-3), initial_scale=1024.0, dynamic_growth_steps=growth_steps)
    model.compile(optimizer=optimizer, loss="mse")
    optimizer.build(model.trainable_variables)
    return model, optimizer


model, optimizer = compiled(10)
for _ in range(7):
    model.train_on_batch(x, y)
store = {}
with warnings.catch_warnings():  # NumPy 2 warns on the Variable.numpy() Keras calls here
    warnings.simplefilter("ignore", DeprecationWarning)
    optimizer.save_own_variables(store)
model, optimizer = compiled(5)
optimizer.load_own_variables(store)
scales, counters = [], []
for _ in range(3):
    model.train_on_batch(x, y)
    scales.append(float(optimizer.dynamic_scale))
    counters.append(int(optimizer.step_counter))

spec = [2048.0, 2048.0, 2048.0]  # 7 + 1 >= 5: 1024 * 2, tracker 0; then trackers 1, 2
assert scales == [1024.0, 1024.0, 1024.0] != spec, scales
assert counters == [8, 9, 10], counters
print(f"keras LossScaleOptimizer ({keras.backend.backend()}), step_counter 7 loaded with "
      f"dynamic_growth_steps=5, 3 finite steps: scales {scales}, spec {spec}")
