"""Flax's DynamicScale clamps a growth past float32's maximum to that maximum.

dynamic_scale.py, DynamicScale.value_and_grad: jnp.minimum(self.scale * self.growth_factor,
jnp.finfo(jnp.float32).max). The spec keeps the scale when its growth overflows:
2**127 * 2 is inf in float32, so the scale stays 2**127.
"""

import jax.numpy as jnp
import numpy as np
from flax.training.dynamic_scale import DynamicScale

# The scale as every step leaves it, a float32 array (a Python float would first
# overflow in NumPy's cast of the float64 product, with a warning).
dynamic_scale = DynamicScale(growth_interval=1, scale=jnp.asarray(2.0**127, jnp.float32))
for _ in range(2):  # it grows on the second finite step (one step late)
    dynamic_scale, is_fin, _, _ = dynamic_scale.value_and_grad(lambda p: p.sum() / 16)(
        jnp.ones(2))

spec = 2.0**127
maximum = float(np.finfo(np.float32).max)
assert float(dynamic_scale.scale) == maximum != spec, float(dynamic_scale.scale)
print(f"flax DynamicScale at 2**127, a growth: scale {maximum!r} (float32's maximum), "
      f"spec {spec!r}")
