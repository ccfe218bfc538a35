"""The zoo's adapter of Flax's ``flax.training.dynamic_scale.DynamicScale``, driven by the
loop Flax's examples use.

Each iteration calls ``dynamic_scale.value_and_grad(loss_fn)(params)``, which returns the
new scaler, ``is_fin``, the loss and the unscaled gradients, takes an optax Adam step and
keeps it only where ``is_fin`` (``jax.tree.map(functools.partial(jnp.where, is_fin), new,
old)`` over parameters and optimizer state, as Flax's ImageNet example does). The compiled
step is the same function under ``jax.jit``, the scaler passed in and returned as a pytree,
as ``DynamicScale``'s docstring does.

Fields: ``growth_factor``, ``backoff_factor`` and ``growth_interval`` are the spec's;
``scale`` is ``init_scale`` rounded to float32 (where the spec starts), given as a Python
float like Flax's default ``65536.0``; ``fin_steps`` is the growth tracker;
``minimum_scale`` is ``min_scale``, and ``min_scale=None`` leaves Flax's default,
``jnp.finfo(jnp.float32).tiny``, which is what a user who sets no floor gets (Flax's
docstring calls it "the smallest positive number representable in floating point"). There
is no hysteresis, ceiling, static or disabled mode. A config change rebuilds the scaler
around its two leaves; checkpoints go through ``flax.serialization``.

Example:
    >>> from unifiedamp.spec import ScalerConfig
    >>> flax = FlaxDynamicScale()
    >>> flax.expresses(ScalerConfig(growth_factor=1.5, backoff_factor=0.3)) is None
    True
    >>> print(flax.expresses(ScalerConfig(hysteresis=2)))
    flax has no hysteresis=2 (it behaves as hysteresis=1)
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from unifiedamp.conformance.interface import STEP_KINDS, Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import ScalerConfig, ScalerState, f32, parse_state_dict, to_state_dict

__all__ = ["DIFFERENCES", "FlaxDynamicScale"]

_STEPS: dict[str, Any] = {}

#: Config fields and the ``DynamicScale`` fields they set.
_FIELDS = {"growth_factor": "growth_factor", "backoff_factor": "backoff_factor",
           "growth_interval": "growth_interval", "min_scale": "minimum_scale"}


def _steps() -> tuple[Any, Any]:
    """The eager train step and its ``jax.jit`` (built once: they import jax)."""
    if not _STEPS:
        import jax
        import jax.numpy as jnp
        import optax

        tx = optax.adam(1e-3)

        def loss(params: dict[str, Any], x: Any) -> Any:
            # |loss| < 1 and d(loss)/d(params) do not depend on the parameters: a finite
            # step stays finite at every float32 scale.
            return (x @ params["w"] + params["b"]).sum() * 2.0**-4

        def train_step(dynamic_scale: Any, groups: list[Any], xs: list[Any]) -> tuple[Any, Any]:
            # Several optimizers share the one scaler: one loss, one finiteness check.
            def loss_fn(all_params: list[Any]) -> Any:
                return sum(loss(p, x) for p, x in zip(all_params, xs, strict=True))

            dynamic_scale, is_fin, _, grads = dynamic_scale.value_and_grad(loss_fn)(
                [params for params, _ in groups])
            keep = functools.partial(jnp.where, is_fin)
            stepped = []
            for (params, opt_state), g in zip(groups, grads, strict=True):
                updates, new_state = tx.update(g, opt_state, params)
                new_params = optax.apply_updates(params, updates)
                stepped.append((jax.tree.map(keep, new_params, params),
                                jax.tree.map(keep, new_state, opt_state)))
            return dynamic_scale, stepped

        _STEPS.update(eager=train_step, jit=jax.jit(train_step), init=tx.init)
    return _STEPS["eager"], _STEPS["jit"]


def _inputs(kind: str) -> Any:
    import jax.numpy as jnp

    return jnp.full((2, 4), 0.5).at[0, 1].set(STEP_KINDS[kind])


def _native(config: ScalerConfig) -> dict[str, Any]:
    """``DynamicScale``'s keyword arguments for ``config`` (``minimum_scale`` left to its
    default where the config has no floor)."""
    kwargs = {native: getattr(config, field) for field, native in _FIELDS.items()}
    if kwargs["minimum_scale"] is None:
        del kwargs["minimum_scale"]
    return kwargs


class FlaxDynamicScale(Adapter):
    """``flax.training.dynamic_scale.DynamicScale`` with optax Adam, eager and under
    ``jax.jit``.

    Handles are ``(dynamic_scale, [(params, opt_state), ...], config)``, new at every step
    (the scaler is an immutable ``flax.struct`` pytree). ``save``/``load`` carry its two
    pytree leaves, ``scale`` and ``fin_steps`` (its whole state, as
    ``flax.serialization.to_state_dict`` writes it), and rebuild the scaler from the
    config, as restoring a checkpoint into a freshly built train state does.
    """

    name = "flax"
    capabilities = frozenset({"multi_optimizer", "set_config", "state_dict", "jit"})
    fixed = {"hysteresis": 1, "max_scale": None, "dynamic": True, "enabled": True}

    def info(self) -> dict[str, Any]:
        import flax
        import jax

        return {"framework": "flax", "version": f"{flax.__version__} (jax {jax.__version__})",
                "device": str(jax.devices()[0])}

    def _scaler(self, config: ScalerConfig, **state: Any) -> Any:
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"flax DynamicScale cannot run {config.to_dict()}: {reason}")
        from flax.training.dynamic_scale import DynamicScale

        return DynamicScale(**_native(config), **state)

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        import jax.numpy as jnp

        _steps()
        params = {"w": jnp.full((4,), 0.1), "b": jnp.array(0.1)}
        groups = [(params, _STEPS["init"](params))] * optimizers
        # A Python float, as Flax's default scale is; the spec starts from f32(init_scale).
        return self._scaler(config, scale=f32(config.init_scale)), groups, config

    def iterate(self, handle: Any, kinds: str, compiled: bool = False) -> Any:
        dynamic_scale, groups, config = handle
        if len(kinds) != len(groups):
            raise ValueError(f"{len(kinds)} kinds for {len(groups)} optimizers")
        step = _steps()[1 if compiled else 0]
        dynamic_scale, groups = step(dynamic_scale, groups, [_inputs(k) for k in kinds])
        return dynamic_scale, groups, config

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        return self.iterate(handle, kinds, compiled=True)

    def reconfigure(self, handle: Any, changes: dict[str, Any]) -> Any:
        dynamic_scale, groups, config = handle
        unknown = sorted(set(changes) - set(_FIELDS))
        if unknown:
            raise ValueError(f"flax DynamicScale has no field for {unknown}: it can change "
                             f"{sorted(_FIELDS)}")
        config = config.replace(**changes)
        # DynamicScale(**fields).replace(...) with the leaves it holds: a missing floor
        # falls back to Flax's default, as in a scaler built without one.
        scaler = self._scaler(config, scale=dynamic_scale.scale, fin_steps=dynamic_scale.fin_steps)
        return scaler, groups, config

    def read(self, handle: Any) -> ScalerState:
        dynamic_scale = handle[0]
        return ScalerState(float(dynamic_scale.scale), int(dynamic_scale.fin_steps), 0)

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        import jax

        return [np.asarray(leaf) for leaf in jax.tree.leaves(handle[1])]

    def save(self, handle: Any) -> dict[str, Any]:
        from flax import serialization

        dynamic_scale, _, config = handle
        saved = serialization.to_state_dict(dynamic_scale)
        state = ScalerState(float(saved["scale"]), int(saved["fin_steps"]), 0)
        return to_state_dict(config, state, "flax")

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        import jax.numpy as jnp
        from flax import serialization

        config, state = parse_state_dict(state_dict)
        if state.hysteresis_tracker:
            raise ValueError("flax DynamicScale has no hysteresis tracker: cannot load "
                             f"hysteresis_tracker={state.hysteresis_tracker}")
        # The arrays a restored checkpoint holds: float32 scale, int32 fin_steps.
        restored = serialization.from_state_dict(self._scaler(config), {
            "scale": jnp.asarray(state.scale, jnp.float32),
            "fin_steps": jnp.asarray(state.growth_tracker, jnp.int32)})
        return restored, handle[1], config


_SOURCE = "flax/training/dynamic_scale.py (flax 0.12.8), DynamicScale.value_and_grad"
_SNIPPETS = "docs/snippets/zoo/flax"

DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="grows one step late",
        sentence="It grows when fin_steps == growth_interval, where fin_steps counts the "
                 "finite steps before this one, so the growth comes on the "
                 "(growth_interval + 1)-th finite step in a row and every growth period is one "
                 "step longer than the spec's.",
        matters="Barely: with the default growth_interval=2000 the scale grows every 2001 "
                "finite steps instead of 2000; with growth_interval=1, every other step. Backoffs, "
                "the float32 products after the first step and the step skipping match the spec.",
        checked=f"{_SOURCE}, lines 146-158: grow = self.fin_steps == self.growth_interval; "
                "new_fin_steps = jnp.where(grow | (~finite), 0, self.fin_steps + 1). "
                "growth_on_nth_finite (1024, interval 3, FFFFFF): fin_steps 1, 2, 3, then "
                "3 == 3 grows to 2048 on step 4 with fin_steps 0; the spec grows on step 3. "
                "Seen on jax 0.10.2, eager and under jax.jit.",
        snippet=f"{_SNIPPETS}/grows_one_step_late.py"),
    Difference(
        cause="grows only when the tracker equals the interval",
        sentence="The growth test is fin_steps == growth_interval, so a fin_steps past the "
                 "interval (after lowering growth_interval with DynamicScale.replace, or "
                 "restoring fin_steps saved under a longer interval) never grows again until a "
                 "non-finite step resets it.",
        matters="Only after a config change or a restored checkpoint with a shorter "
                "growth_interval: the scale then stops growing until the next overflow, which "
                "with a well-chosen scale may be thousands of steps away.",
        checked=f"{_SOURCE}, line 146: grow = self.fin_steps == self.growth_interval. "
                "lowered_interval_grows_next_finite (1024, interval 5 lowered to 2 before step "
                "4, FFFFF): fin_steps 3 at the change, then 4, 5: 4 != 2 and 5 != 2, no growth; "
                "the spec grows on step 4. A loaded fin_steps of 7 with interval 5: 7 != 5, "
                "fin_steps 8, scale 1024 (the spec: 2048).",
        snippet=f"{_SNIPPETS}/grows_only_when_the_tracker_equals_the_interval.py"),
    Difference(
        cause="clamps growth at float32's maximum",
        sentence="A growth past float32's maximum is clamped to it (jnp.minimum(scale * "
                 "growth_factor, jnp.finfo(jnp.float32).max)) where the spec keeps the scale "
                 "it had.",
        matters="No: only a scale above 1.7e38 can overflow on growth, far past anything an "
                "fp16 model's loss can be multiplied by; its next step overflows and backs "
                "off to 1.7e38 (0x7effffff, the spec's 2**127 is 0x7f000000).",
        checked=f"{_SOURCE}, lines 147-153: fin_scale = jnp.where(grow & finite, "
                "jnp.minimum(self.scale * self.growth_factor, jnp.finfo(jnp.float32).max), "
                "self.scale). growth_overflow_keeps_scale (2**127, interval 1, FFIF): step 2 "
                "grows (one step late), 2**127 * 2 = inf in float32, minimum(inf, 3.4028235e38) "
                "= 3.4028235e38; the spec keeps 2**127.",
        snippet=f"{_SNIPPETS}/clamps_growth_at_float32s_maximum.py"),
    Difference(
        cause="floor at the smallest normal float32",
        sentence="Its default minimum_scale is jnp.finfo(jnp.float32).tiny (2**-126, the "
                 "smallest normal float32, which its docstring calls the smallest positive "
                 "number), so without a floor of the user's it never backs off below 2**-126 "
                 "where the spec goes on to subnormal scales and 0.",
        matters="No: a scale of 1.2e-38 already means a loss that overflows even unscaled; it "
                "only stops the collapse to 0 earlier than the spec. minimum_scale=None gives "
                "no floor.",
        checked=f"{_SOURCE}: minimum_scale = struct.field(pytree_node=False, "
                "default=jnp.finfo(jnp.float32).tiny) (lines 87-89) and inf_scale = "
                "jnp.maximum(inf_scale, self.minimum_scale) (lines 154-156). "
                "subnormal_products_round_to_nearest (3 * 2**-140, backoff 0.7, II): "
                "max(1075 * 2**-149, 2**-126) = 2**-126; the spec 1075 * 2**-149. "
                "backoff_reaches_zero_and_stays (2**-148): 2**-126 from step 1. "
                "reciprocal_overflow_skips_finite_steps (2**-130, FFF): the step is skipped as in "
                "the spec (XLA on CPU flushes subnormals: the scaled gradients are 0 and "
                "0 / scale is NaN), then max(2**-131, 2**-126) = 2**-126.",
        snippet=f"{_SNIPPETS}/floor_at_the_smallest_normal_float32.py"),
    Difference(
        cause="first update in float64",
        sentence="Its scale starts as a Python float (default 65536.0), so the first update "
                 "multiplies two Python floats in float64 and rounds the product to float32 "
                 "once; every later update runs on the float32 array that step returned.",
        matters="Only with a non-power-of-two factor, on the first step, outside jax.jit: the "
                "scale then differs from the spec's by about one float32 ulp (77 * 0.7 gives "
                "53.900001525878906, the spec 53.89999771118164). Under jax.jit, the scale "
                "enters as a float32 array and the step matches.",
        checked=f"{_SOURCE}, lines 147-157: self.scale * self.growth_factor and self.scale * "
                "self.backoff_factor are Python float products while scale is the float given "
                "to the constructor; jnp.where rounds them to float32. DynamicScale(scale=77.0, "
                "backoff_factor=0.7), an inf step: f32(77 * 0.7) = 53.900001525878906 eagerly, "
                "f32(77) * f32(0.7) = 53.89999771118164 under jax.jit. The suite's vectors do "
                "not show it: each vector whose first update has such a factor grows one step "
                "late first.",
        snippet=f"{_SNIPPETS}/first_update_in_float64.py"),
)
