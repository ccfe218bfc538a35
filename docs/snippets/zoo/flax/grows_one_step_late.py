"""Flax's DynamicScale grows on the (growth_interval + 1)-th finite step in a row.

dynamic_scale.py, DynamicScale.value_and_grad: grow = self.fin_steps == self.growth_interval,
where fin_steps counts the finite steps before this one. The spec grows on the
growth_interval-th: with growth_interval=2 from 1024, the scales 1024, 2048, 2048.
"""

import jax.numpy as jnp
from flax.training.dynamic_scale import DynamicScale

dynamic_scale = DynamicScale(growth_interval=2, scale=1024.0)
scales, fin_steps = [], []
for _ in range(3):
    dynamic_scale, is_fin, _, _ = dynamic_scale.value_and_grad(lambda p: p.sum() / 16)(
        jnp.ones(2))
    scales.append(float(dynamic_scale.scale))
    fin_steps.append(int(dynamic_scale.fin_steps))

spec = [1024.0, 2048.0, 2048.0]
assert scales == [1024.0, 1024.0, 2048.0] != spec, scales
assert fin_steps == [1, 2, 0], fin_steps
print(f"flax DynamicScale(growth_interval=2), 3 finite steps: scales {scales}, spec {spec}")
