"""jmp's loop checks the gradients after unscaling them, so finite gradients that 1 / scale
takes past float32's maximum count as non-finite.

jmp's README and the DynamicLossScale docstring: grads = loss_scale.unscale(grads), then
grads_finite = jmp.all_finite(grads). At scale 2**-10, 3e38 * 1024 = 3.07e41 is inf in
float32. The spec checks the gradients as computed (scaled): 3e38 is finite, the step
counts as finite.
"""

import jax.numpy as jnp
import jmp
import numpy as np

loss_scale = jmp.DynamicLossScale(jnp.asarray(2.0**-10), min_loss_scale=jnp.asarray(0.0))
grads = {"w": jnp.full(4, 3e38, jnp.float32)}
finite = jmp.all_finite(loss_scale.unscale(grads))

spec_finite = bool(np.isfinite(np.float32(3e38)))  # the spec checks the scaled value
assert spec_finite and not bool(finite)
print(f"jmp at scale 2**-10, gradients 3e38: all_finite(unscale(grads)) is {bool(finite)}, "
      f"spec finite {spec_finite}")
