"""jmp's DynamicLossScale loses its min_loss_scale at every jax.jit boundary: under jit it
never backs off below 1.0.

loss_scale.py: tree_flatten keeps (loss_scale, counter) and (period, factor) only, and
tree_unflatten calls cls(loss_scale, counter, period, factor), so the scaler a jitted step
sees has the default min_loss_scale of 1.0. With min_loss_scale=0.25, from 2, three
overflows: max(0.25, 2 / 2) = 1, then 0.5, then 0.25, as the spec with min_scale=0.25.
"""

import jax
import jax.numpy as jnp
import jmp


def overflow(loss_scale):
    return loss_scale.adjust(jnp.asarray(False))


eager = jitted = jmp.DynamicLossScale(jnp.asarray(2.0), min_loss_scale=jnp.asarray(0.25))
eager_scales, jitted_scales = [], []
for _ in range(3):
    eager, jitted = overflow(eager), jax.jit(overflow)(jitted)
    eager_scales.append(float(eager.loss_scale))
    jitted_scales.append(float(jitted.loss_scale))

spec = [1.0, 0.5, 0.25]  # 2 * 0.5, 1 * 0.5, 0.5 * 0.5, none below min_scale 0.25
assert eager_scales == spec, eager_scales
assert jitted_scales == [1.0, 1.0, 1.0] != spec, jitted_scales
assert float(jitted.min_loss_scale) == 1.0
print(f"jmp DynamicLossScale(min_loss_scale=0.25) from 2, three overflows: eager {eager_scales}, "
      f"under jax.jit {jitted_scales}, spec {spec}")
