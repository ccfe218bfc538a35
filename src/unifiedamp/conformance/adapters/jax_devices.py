"""One JAX training step on several host devices; run as a program of its own.

``python -m unifiedamp.conformance.adapters.jax_devices '[CONFIG, KINDS, MODE]'``
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set before it
starts (the device count is fixed when jax starts; :func:`run_devices` in
:mod:`unifiedamp.conformance.adapters.jax` does both). Device ``i`` trains on
gradients of kind ``KINDS[i]`` under ``MODE`` (``"shard_map"`` or ``"pmap"``);
prints one JSON line: each device's scaler state and whether it stepped.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from unifiedamp.backends.jax import JaxGradScaler, where_finite
from unifiedamp.conformance.adapters.jax import inputs, loss


def run(config: dict[str, Any], kinds: list[str], mode: str) -> dict[str, Any]:
    """The step on ``len(kinds)`` devices; per device: ``states`` and ``stepped``."""
    n = len(kinds)
    scaler = JaxGradScaler(**config)
    params = {"w": jnp.full((4,), 0.1), "b": jnp.array(0.1)}
    xs = jnp.stack([inputs(k) for k in kinds])  # one batch shard per device

    def step(scaler: JaxGradScaler, params: Any, x: jax.Array) -> Any:
        grads = jax.grad(lambda p: scaler.scale(loss(p, x[0])))(params)
        grads, finite = scaler.unscale(grads, axis_name="d")
        new = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        new = where_finite(finite, new, params)
        s = scaler.update(finite)
        state = jnp.stack([s.loss_scale, s.growth_tracker.astype(jnp.float32),
                           s.hysteresis_tracker.astype(jnp.float32)])
        return state[None], new["w"][None]

    if mode == "shard_map":
        mesh = Mesh(np.array(jax.devices()[:n]), ("d",))
        fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), P("d")),
                                   out_specs=(P("d"), P("d"))))
    else:
        fn = jax.pmap(lambda s, p, x: jax.tree.map(lambda a: a[0], step(s, p, x[None])),
                      axis_name="d", in_axes=(None, None, 0))
    states, ws = fn(scaler, params, xs)
    return {"states": [[float(s[0]), int(s[1]), int(s[2])] for s in np.asarray(states)],
            "stepped": [bool((w != 0.1).any()) for w in np.asarray(ws)]}


if __name__ == "__main__":
    print(json.dumps(run(*json.loads(sys.argv[1]))))
