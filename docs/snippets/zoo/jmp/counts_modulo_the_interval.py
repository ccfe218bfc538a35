"""jmp's DynamicLossScale counts finite steps modulo its period, so a counter at or past the
period (restored from a run with a longer period) wraps around and grows late.

loss_scale.py, DynamicLossScale.adjust: it grows when counter == period - 1, and sets
counter = ((counter + 1) % period) * grads_finite. Counter 7, period 5: 7 != 4, no growth,
(7 + 1) % 5 = 3; then 4; the third finite step grows. The spec grows on the first (tracker
7 + 1 >= 5): scales 2048, 2048, 2048.
"""

import jax.numpy as jnp
import jmp
import numpy as np

loss_scale = jmp.DynamicLossScale(jnp.asarray(1024.0), counter=np.asarray(7, np.int32),
                                  period=5)
scales, counters = [], []
for _ in range(3):
    loss_scale = loss_scale.adjust(jnp.asarray(True))
    scales.append(float(loss_scale.loss_scale))
    counters.append(int(loss_scale.counter))

spec = [2048.0, 2048.0, 2048.0]  # 7 + 1 >= 5: 1024 * 2, tracker 0; then trackers 1, 2
assert scales == [1024.0, 1024.0, 2048.0] != spec, scales
assert counters == [3, 4, 0], counters
print(f"jmp DynamicLossScale(counter=7, period=5), 3 finite steps: scales {scales}, "
      f"spec {spec}")
