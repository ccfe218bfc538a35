"""jmp's DynamicLossScale runs its arithmetic as XLA ops, which on CPU read a subnormal
float32 scale as 0.

loss_scale.py, DynamicLossScale.unscale multiplies by 1 / loss_scale, and
DynamicLossScale.adjust backs off with loss_scale / factor. At loss_scale 2**-127 (a
subnormal) 1 / loss_scale is inf, not 2**127: the finite gradients unscale to NaN, the step
is skipped and 2**-127 / 2 gives 0. The spec takes the step (2**127 is a finite float32, so
the gradients unscale to finite values) and keeps 2**-127 (no growth before period steps).
"""

import jax
import jax.numpy as jnp
import jmp

loss_scale = jmp.DynamicLossScale(jnp.asarray(2.0**-127), min_loss_scale=jnp.asarray(0.0))
params = jnp.ones(2)
grads = jax.grad(lambda p: loss_scale.scale(p.sum() / 16))(params)
grads = loss_scale.unscale(grads)
finite = jmp.all_finite(grads)
loss_scale = loss_scale.adjust(finite)

# The spec: 1 / 2**-127 = 2**127 is finite, the step is taken, tracker 1 < 2000 keeps 2**-127.
spec_scale = 2.0**-127
assert not bool(finite), grads
assert float(loss_scale.loss_scale) == 0.0 != spec_scale, loss_scale.loss_scale
print(f"jmp DynamicLossScale at 2**-127, a finite step: skipped, scale "
      f"{float(loss_scale.loss_scale)!r}; spec: taken, scale {spec_scale!r}")
