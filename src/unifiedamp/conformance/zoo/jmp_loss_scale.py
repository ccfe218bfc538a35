"""The zoo's adapter of jmp's ``DynamicLossScale``, driven by the loop jmp's README gives.

Each iteration takes ``jax.grad`` of ``loss_scale.scale(loss)``, then
``grads = loss_scale.unscale(grads)``, ``finite = jmp.all_finite(grads)``, an optax
Adam update kept only where ``finite`` (``jmp.select_tree``) and
``loss_scale = loss_scale.adjust(finite)``. The compiled step is the same function
under ``jax.jit``, the scaler passed in and returned as a pytree, as jmp's README does.

jmp has one ``factor``: it grows by ``factor`` and backs off by dividing by it, so
the adapter runs ``backoff_factor = 1 / growth_factor`` only, and only for powers of
two, where dividing by the factor gives the bits of multiplying by the float32
reciprocal (the spec's rule); with any other factor the two round differently.
``min_scale=None`` is ``min_loss_scale=0`` (jmp's own default floor is 1.0).

Example:
    >>> from unifiedamp.spec import ScalerConfig
    >>> JmpDynamicLossScale().expresses(ScalerConfig(growth_factor=3.0, backoff_factor=1 / 3))
    'jmp divides by factor=3.0 on a backoff: that equals multiplying by f32(1 / factor) only for a power of two'
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from unifiedamp.conformance.adapters import STEP_KINDS, Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import ScalerConfig, ScalerState, f32, parse_state_dict, to_state_dict

__all__ = ["DIFFERENCES", "JmpDynamicLossScale"]

_STEPS: dict[str, Any] = {}


def _steps() -> tuple[Any, Any]:
    """The eager train step and its ``jax.jit`` (built once: they import jax)."""
    if not _STEPS:
        import jax
        import jmp
        import optax

        tx = optax.adam(1e-3)

        def loss(params: dict[str, Any], x: Any) -> Any:
            # |loss| < 1 and d(loss)/d(params) do not depend on the parameters: a finite
            # step stays finite at every float32 scale.
            return (x @ params["w"] + params["b"]).sum() * 2.0**-4

        def train_step(loss_scale: Any, groups: list[Any], xs: list[Any]) -> tuple[Any, Any]:
            # Several optimizers share the one loss scale: one loss, one finiteness check.
            def scaled_loss(all_params: list[Any]) -> Any:
                total = sum(loss(p, x) for p, x in zip(all_params, xs, strict=True))
                return loss_scale.scale(total)

            grads = jax.grad(scaled_loss)([params for params, _ in groups])
            grads = loss_scale.unscale(grads)
            finite = jmp.all_finite(grads)
            stepped = []
            for (params, opt_state), g in zip(groups, grads, strict=True):
                updates, new_state = tx.update(g, opt_state, params)
                new_params = optax.apply_updates(params, updates)
                stepped.append(jmp.select_tree(finite, (new_params, new_state),
                                               (params, opt_state)))
            return loss_scale.adjust(finite), stepped

        _STEPS.update(eager=train_step, jit=jax.jit(train_step), init=tx.init)
    return _STEPS["eager"], _STEPS["jit"]


def _inputs(kind: str) -> Any:
    import jax.numpy as jnp

    return jnp.full((2, 4), 0.5).at[0, 1].set(STEP_KINDS[kind])


def _is_power_of_two(x: float) -> bool:
    return math.frexp(x)[0] == 0.5


class JmpDynamicLossScale(Adapter):
    """``jmp.DynamicLossScale`` with optax Adam, eager and under ``jax.jit``.

    Handles are ``(loss_scale, [(params, opt_state), ...], config)``, new at every step
    (jmp's scaler is an immutable pytree). ``save``/``load`` carry jmp's two leaves,
    ``loss_scale`` and ``counter`` (its whole state: the counter is the growth tracker),
    and rebuild the scaler from the config, as restoring a checkpoint of the pytree does.
    jmp has no setters, no static or disabled mode in this class, no hysteresis and no
    ceiling: those tests and configs are skipped.
    """

    name = "jmp"
    capabilities = frozenset({"multi_optimizer", "functional_unscale", "scale_tree",
                              "state_dict", "jit"})
    dtypes = ("float16", "float32")  # float64 needs jax_enable_x64
    fixed = {"backoff_factor": lambda c: 1.0 / c.growth_factor, "hysteresis": 1,
             "max_scale": None, "dynamic": True, "enabled": True}

    def expresses(self, config: ScalerConfig) -> str | None:
        reason = super().expresses(config)
        if reason is None and not (_is_power_of_two(config.growth_factor)
                                   and config.growth_factor <= 2.0**126):
            reason = (f"jmp divides by factor={config.growth_factor!r} on a backoff: that equals "
                      "multiplying by f32(1 / factor) only for a power of two")
        return reason

    def info(self) -> dict[str, Any]:
        import jax
        import jmp

        return {"framework": "jmp", "version": f"{jmp.__version__} (jax {jax.__version__})",
                "device": str(jax.devices()[0])}

    def _scaler(self, config: ScalerConfig, scale: float, counter: int) -> Any:
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"jmp.DynamicLossScale cannot run {config.to_dict()}: {reason}")
        import jax.numpy as jnp
        import jmp

        floor = 0.0 if config.min_scale is None else f32(config.min_scale)
        return jmp.DynamicLossScale(
            loss_scale=jnp.asarray(scale, jnp.float32),
            counter=np.asarray(counter, np.int32),
            period=config.growth_interval, factor=config.growth_factor,
            min_loss_scale=jnp.asarray(floor, jnp.float32))

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        import jax.numpy as jnp

        _steps()
        params = {"w": jnp.full((4,), 0.1), "b": jnp.array(0.1)}
        groups = [(params, _STEPS["init"](params))] * optimizers
        return self._scaler(config, config.init_scale, 0), groups, config

    def iterate(self, handle: Any, kinds: str, compiled: bool = False) -> Any:
        loss_scale, groups, config = handle
        if len(kinds) != len(groups):
            raise ValueError(f"{len(kinds)} kinds for {len(groups)} optimizers")
        step = _steps()[1 if compiled else 0]
        loss_scale, groups = step(loss_scale, groups, [_inputs(k) for k in kinds])
        return loss_scale, groups, config

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        return self.iterate(handle, kinds, compiled=True)

    def read(self, handle: Any) -> ScalerState:
        loss_scale = handle[0]
        return ScalerState(float(loss_scale.loss_scale), int(loss_scale.counter), 0)

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        import jax

        return [np.asarray(leaf) for leaf in jax.tree.leaves(handle[1])]

    def save(self, handle: Any) -> dict[str, Any]:
        loss_scale, _, config = handle
        # The config as the scaler holds it now (a jit boundary resets min_loss_scale).
        floor = float(loss_scale.min_loss_scale)
        config = config.replace(growth_factor=float(loss_scale.factor),
                                backoff_factor=1.0 / float(loss_scale.factor),
                                growth_interval=int(loss_scale.period),
                                min_scale=floor or None)
        return to_state_dict(config, self.read(handle), "jmp")

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        config, state = parse_state_dict(state_dict)
        if state.hysteresis_tracker:
            raise ValueError("jmp.DynamicLossScale has no hysteresis tracker: cannot load "
                             f"hysteresis_tracker={state.hysteresis_tracker}")
        return self._scaler(config, state.scale, state.growth_tracker), handle[1], config

    def scale_tree(self, handle: Any, tree: Any) -> Any:
        import jax
        import jax.numpy as jnp

        return jax.tree.map(np.asarray, handle[0].scale(jax.tree.map(jnp.asarray, tree)))

    def unscale_tree(self, handle: Any, tree: Any) -> tuple[Any, bool]:
        import jax
        import jax.numpy as jnp
        import jmp

        out = handle[0].unscale(jax.tree.map(jnp.asarray, tree))
        # jmp's README checks the unscaled gradients.
        return jax.tree.map(np.asarray, out), bool(jmp.all_finite(out))


DIFFERENCES: dict[str, Difference] = {}
