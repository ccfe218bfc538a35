"""Flax's DynamicScale computes its first update in float64 when ``scale`` is a Python float.

dynamic_scale.py, DynamicScale.value_and_grad: inf_scale = self.scale * self.backoff_factor
multiplies two Python floats (``scale`` defaults to the float 65536.0), and jnp.where rounds
the product to float32 once. The spec multiplies in float32: f32(77) * f32(0.7). Under
jax.jit the scale enters as a float32 array and the step matches the spec.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax.training.dynamic_scale import DynamicScale


def inf_step(dynamic_scale):
    loss = lambda p: (p * jnp.array([1.0, jnp.inf])).sum()  # noqa: E731
    return dynamic_scale.value_and_grad(loss)(jnp.ones(2))[0]


eager = float(inf_step(DynamicScale(scale=77.0, backoff_factor=0.7)).scale)
jitted = float(jax.jit(inf_step)(DynamicScale(scale=77.0, backoff_factor=0.7)).scale)

spec = float(np.float32(77.0) * np.float32(0.7))  # 53.89999771118164
assert eager == float(np.float32(77.0 * 0.7)) == 53.900001525878906 != spec, eager
assert jitted == spec, jitted
print(f"flax DynamicScale(scale=77.0, backoff_factor=0.7), one inf step: eager {eager!r}, "
      f"jitted {jitted!r}, spec {spec!r}")
