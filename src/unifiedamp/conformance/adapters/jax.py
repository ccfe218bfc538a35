"""How the conformance suite drives the JAX backend: jax.grad of a scaled loss, optax.adam."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from unifiedamp.backends.jax import where_finite
from unifiedamp.conformance.interface import STEP_KINDS, FunctionalAdapter
from unifiedamp.spec import ScalerConfig, ScalerState

_TX = optax.adam(1e-3)


def loss(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    # |loss| < 1 and d(loss)/d(params) do not depend on the parameters, so a
    # finite step stays finite at every float32 scale.
    return (x @ params["w"] + params["b"]).sum() * 2.0**-4


def inputs(kind: str) -> jax.Array:
    return jnp.full((2, 4), 0.5).at[0, 1].set(STEP_KINDS[kind])


def train_step(scaler: Any, groups: list[Any], xs: list[jax.Array]) -> tuple[Any, list[Any]]:
    """One iteration over several parameter groups (optimizers): each skips on its own
    gradients; the scale sees an inf in any of them."""
    stepped, finites = [], []
    for (params, opt_state), x in zip(groups, xs, strict=True):
        grads = jax.grad(lambda p, x=x: scaler.scale(loss(p, x)))(params)
        grads, finite = scaler.unscale(grads)
        updates, new_state = _TX.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        stepped.append(where_finite(finite, (new_params, new_state), (params, opt_state)))
        finites.append(finite)
    return scaler.update(jnp.stack(finites).all()), stepped


_jitted_step = jax.jit(train_step)


class JaxAdapter(FunctionalAdapter):
    """Handles are ``(scaler, [(params, opt_state), ...])``, new at every step."""

    capabilities = frozenset({"multi_optimizer", "functional_unscale", "scale_tree",
                              "set_config", "disable", "state_dict", "jit", "distributed"})
    dtypes = ("float16", "float32")  # float64 needs jax_enable_x64

    def __init__(self, scaler_cls: Any):
        self.scaler_cls = scaler_cls
        self.name = "jax"

    def info(self) -> dict[str, Any]:
        return {"framework": "jax", "version": jax.__version__,
                "device": str(jax.devices()[0])}

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        params = {"w": jnp.full((4,), 0.1), "b": jnp.array(0.1)}
        return self.scaler_cls(**config.to_dict()), [(params, _TX.init(params))] * optimizers

    def iterate(self, handle: Any, kinds: str, step: Any = train_step) -> Any:
        scaler, groups = handle
        return step(scaler, groups, [inputs(k) for k in kinds])

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        """The whole step, every group, under one ``jax.jit``."""
        return self.iterate(handle, kinds, _jitted_step)

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        return [np.asarray(leaf) for leaf in jax.tree.leaves(handle[1])]

    def scale_tree(self, handle: Any, tree: Any) -> Any:
        return jax.tree.map(np.asarray, handle[0].scale(jax.tree.map(jnp.asarray, tree)))

    def unscale_tree(self, handle: Any, tree: Any) -> tuple[Any, bool]:
        out, finite = handle[0].unscale(jax.tree.map(jnp.asarray, tree))
        return jax.tree.map(np.asarray, out), bool(finite)

    def distributed_iterate(self, handle: Any, kinds_per_rank: list[str]) -> list[ScalerState]:
        """One step under ``shard_map`` over one host device per rank (a subprocess)."""
        return [ScalerState(*s) for s in
                run_devices(handle[0].config.to_dict(), kinds_per_rank)["states"]]


def run_devices(config: dict[str, Any], kinds: list[str], mode: str = "shard_map",
                devices: int | None = None) -> dict[str, Any]:
    """Runs one step on ``len(kinds)`` host devices in a fresh process (the device count
    is fixed when jax starts); device i trains on gradients of kind ``kinds[i]``."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count="
                                      f"{devices or len(kinds)}", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.conformance.adapters.jax_devices",
                           json.dumps([config, kinds, mode])],
                          capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
