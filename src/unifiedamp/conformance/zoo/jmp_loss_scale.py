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
    >>> jmp = JmpDynamicLossScale()
    >>> jmp.expresses(ScalerConfig(growth_factor=4.0, backoff_factor=0.25)) is None
    True
    >>> print(jmp.expresses(ScalerConfig(growth_factor=3.0, backoff_factor=1 / 3)))
    jmp divides by factor=3.0 on a backoff: that equals multiplying by f32(1 / factor) only for \
a power of two
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from unifiedamp.conformance.interface import STEP_KINDS, Adapter
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


_FTZ = Difference(
    sentence="Its arithmetic runs as XLA ops, which flush subnormal float32 values to zero: "
             "at a scale below 2**-126, 1 / loss_scale is inf, so every step is skipped, and "
             "the next backoff (loss_scale / factor) gives 0 instead of half the scale.",
    matters="No: a scale below 1.2e-38 takes 141 non-finite steps in a row from 2**15, "
            "after which the spec's scale also reaches 0 within 24 more.",
    checked="jmp/_src/loss_scale.py, DynamicLossScale.adjust: jnp.maximum(min_loss_scale, "
            "loss_scale / factor). reciprocal_overflow_skips_finite_steps: scale 2**-130 "
            "(0x00040000); a finite step unscales by 1 / 2**-130 = inf, all_finite is False, "
            "2**-130 / 2 gives 0.0 where IEEE float32 gives 2**-131 (0x00020000). "
            "backoff_reaches_zero_and_stays: 2**-148 / 2 gives 0.0, not 2**-149. Seen directly: "
            "jnp.asarray(2.0**-130, jnp.float32) / 2 and jnp.asarray(2.0**-126, jnp.float32) / 2 "
            "are 0.0 on CPU, eager and under jax.jit, and 1 / jnp.asarray(2.0**-127, "
            "jnp.float32) is inf, not 2**127 (jax 0.10.2).")

_MIN_DROPPED = Difference(
    sentence="Under jax.jit the floor is always 1.0: DynamicLossScale.tree_flatten keeps "
             "(loss_scale, counter) and (period, factor) only, so every scaler that crosses a "
             "jit boundary is rebuilt with the default min_loss_scale=1.0.",
    matters="Yes, for a model whose scale must go below 1 (large gradients) or a user who set "
            "min_loss_scale: the jitted train step, jmp's documented use, ignores the floor "
            "given and never backs off below 1.",
    checked="jmp/_src/loss_scale.py: tree_flatten returns data=(loss_scale, counter), "
            "meta=(period, factor); tree_unflatten calls cls(loss_scale, counter, period, "
            "factor). min_scale_clamp (init 4, min 1.5, IIIF): eager 2, 1.5, 1.5, 1.5; jitted "
            "max(1.0, 4/2)=2, then max(1.0, 2/2)=1.0 (spec 1.5). backoff_below_one (init 2, no "
            "floor = min_loss_scale 0): jitted 1, then max(1.0, 0.5)=1.0 (spec 0.5). The two "
            "subnormal vectors get 1.0 for the same reason.")

DIFFERENCES: dict[str, Difference] = {
    "test_vector[reciprocal_overflow_skips_finite_steps]": _FTZ,
    "test_vector[backoff_reaches_zero_and_stays]": _FTZ,
    "test_random_configs_and_steps_match_reference": Difference(
        sentence="Random sequences meet the flush of subnormal scales to zero (above): a "
                 "finite step at a subnormal scale is skipped and backs off to 0.",
        matters="No, as for reciprocal_overflow_skips_finite_steps: only scales below "
                "1.2e-38.",
        checked="The first failing example seen (200 examples): init 2**-127 (0x00400000), growth "
                "factor 1, steps 'F'. The spec takes the step (1 / 2**-127 = 2**127 is finite) "
                "and keeps 2**-127; jmp's unscale multiplies by 1 / loss_scale = inf under "
                "XLA's flush, all_finite is False, and 2**-127 / 1 flushes to 0.0."),
    "test_vector_compiled[min_scale_clamp]": _MIN_DROPPED,
    "test_vector_compiled[backoff_below_one]": _MIN_DROPPED,
    "test_vector_compiled[reciprocal_overflow_skips_finite_steps]": _MIN_DROPPED,
    "test_vector_compiled[backoff_reaches_zero_and_stays]": _MIN_DROPPED,
    "test_scale_then_unscale_is_identity_and_keeps_dtype": Difference(
        sentence="scale() and unscale() multiply each leaf by a float32 array, so float16 "
                 "leaves come back float32 (JAX promotes float16 * float32 to float32).",
        matters="Little: jmp's policies compute the loss in float32; the float32 gradients "
                "unscale() returns for float16 parameters need a cast back "
                "(jmp.Policy.cast_to_param) or take twice the memory.",
        checked="jmp/_src/loss_scale.py, DynamicLossScale.scale: tree_map(lambda x: x * "
                "self.loss_scale, tree), loss_scale a float32 jnp array (not weakly typed). "
                "The failing example: scale 1.0, tree [array([0.], float16)] -> float32."),
    "test_large_finite_gradients_are_finite": Difference(
        sentence="jmp's loop checks the gradients after unscaling them (all_finite(unscale("
                 "grads))), so finite gradients that 1/scale takes past float32's maximum "
                 "count as non-finite: the step is skipped and the scale backs off.",
        matters="Only with a scale below 1 and gradients above 3.4e38 * scale; jmp then skips "
                "a step whose unscaled gradients are inf anyway.",
        checked="jmp's README and the DynamicLossScale docstring: grads = "
                "loss_scale.unscale(grads); grads_finite = jmp.all_finite(grads). Scale "
                "2**-10: 3e38 * 1024 = 3.07e41, inf in float32, all_finite is False."),
    "test_a_loaded_tracker_past_the_interval_grows_on_the_next_finite_step": Difference(
        sentence="It grows when counter == period - 1 and counts modulo period, so a counter "
                 "at or past the period (a state saved under a longer period) wraps around "
                 "and grows up to period steps late.",
        matters="Rarely: only after restoring a counter with a shorter period; one growth "
                "comes at most period steps late.",
        checked="jmp/_src/loss_scale.py, DynamicLossScale.adjust: select(counter == period - "
                "1, ...) and counter = ((counter + 1) % period) * grads_finite. Loaded counter "
                "7, period 5: 7 != 4, no growth, counter (7 + 1) % 5 = 3 (seen: 1024.0, "
                "tracker 3); then 4; the third finite step grows to 2048."),
}
