"""Flax's DynamicScale never grows while fin_steps is past growth_interval.

dynamic_scale.py, DynamicScale.value_and_grad: grow = self.fin_steps == self.growth_interval.
Lowering growth_interval from 5 to 2 after 3 finite steps (DynamicScale.replace) leaves
fin_steps at 3: it only counts up from there. The spec grows on the next finite step
(tracker 3 + 1 >= 2): scale 2048.
"""

import jax.numpy as jnp
from flax.training.dynamic_scale import DynamicScale


def finite_step(dynamic_scale):
    return dynamic_scale.value_and_grad(lambda p: p.sum() / 16)(jnp.ones(2))[0]


dynamic_scale = DynamicScale(growth_interval=5, scale=1024.0)
for _ in range(3):
    dynamic_scale = finite_step(dynamic_scale)
dynamic_scale = dynamic_scale.replace(growth_interval=2)
scales = []
for _ in range(3):
    dynamic_scale = finite_step(dynamic_scale)
    scales.append(float(dynamic_scale.scale))

spec = [2048.0, 2048.0, 4096.0]
assert scales == [1024.0, 1024.0, 1024.0] != spec, scales
assert int(dynamic_scale.fin_steps) == 6
print(f"flax DynamicScale, growth_interval 5 -> 2 after 3 finite steps, 3 more: scales {scales}, "
      f"spec {spec}")
