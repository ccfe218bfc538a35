"""Flax's DynamicScale never backs off below 2**-126 unless given ``minimum_scale=None``.

dynamic_scale.py: minimum_scale defaults to jnp.finfo(jnp.float32).tiny (2**-126, the smallest
normal float32; the docstring calls it "the smallest positive number"), and
DynamicScale.value_and_grad takes jnp.maximum(inf_scale, self.minimum_scale). The spec
without min_scale halves on: from 2**-125, two overflows give 2**-126, then 2**-127.
"""

import jax.numpy as jnp
import numpy as np
from flax.training.dynamic_scale import DynamicScale

loss = lambda p: (p * jnp.array([1.0, jnp.inf])).sum()  # noqa: E731
dynamic_scale = DynamicScale(scale=2.0**-125)
scales = []
for _ in range(2):
    dynamic_scale = dynamic_scale.value_and_grad(loss)(jnp.ones(2))[0]
    scales.append(float(dynamic_scale.scale))

spec = [2.0**-126, 2.0**-127]
assert DynamicScale().minimum_scale == np.finfo(np.float32).tiny == 2.0**-126
assert scales == [2.0**-126, 2.0**-126] != spec, scales
print(f"flax DynamicScale() from 2**-125, two overflows: scales {scales}, spec {spec}")
