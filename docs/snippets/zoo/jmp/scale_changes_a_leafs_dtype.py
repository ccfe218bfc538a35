"""jmp's DynamicLossScale returns float32 from scale() and unscale() of float16 values once
it has adjusted.

loss_scale.py: scale() is x * self.loss_scale and unscale() x * (1 / self.loss_scale).
adjust() computes jnp.maximum(self.min_loss_scale, ...) with min_loss_scale a float32
NumPy array, so the scale it returns is a float32 array that is not weakly typed, and JAX
promotes float16 * float32 to float32. (The jnp.asarray(2.0 ** 15) of its docstring is
weakly typed: before the first adjust() float16 stays float16.) The spec keeps each
leaf's dtype.
"""

import jax.numpy as jnp
import jmp

loss_scale = jmp.DynamicLossScale(jnp.asarray(2.0**15))
half = jnp.ones(2, jnp.float16)
assert loss_scale.scale(half).dtype == jnp.float16

loss_scale = loss_scale.adjust(jnp.asarray(True))
scaled, unscaled = loss_scale.scale(half), loss_scale.unscale(half)
assert scaled.dtype == unscaled.dtype == jnp.float32 != half.dtype, (scaled, unscaled)
print(f"jmp DynamicLossScale after one adjust(): scale() and unscale() of float16 give "
      f"{scaled.dtype}, spec float16")
