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
        # A float32 scale, as the class docstring builds it: the README's
        # jmp.half_dtype()(2 ** 15) makes adjust() raise (lax.select of float16 and the
        # float32 min_loss_scale; jmp 0.0.4, jax 0.10). jmp annotates counter jnp.ndarray
        # and factor int; it takes a NumPy array and a float.
        return jmp.DynamicLossScale(
            loss_scale=jnp.asarray(scale, jnp.float32),
            counter=np.asarray(counter, np.int32),  # pyright: ignore[reportArgumentType]
            period=config.growth_interval,
            factor=config.growth_factor,  # pyright: ignore[reportArgumentType]
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


_SOURCE = "jmp/_src/loss_scale.py (jmp 0.0.4)"
_SNIPPETS = "docs/snippets/zoo/jmp"

DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="flushes subnormals to zero",
        sentence="Its arithmetic runs as XLA ops, which on CPU read a subnormal float32 scale "
                 "as 0: at a scale below 2**-126, 1 / loss_scale is inf, so the finite "
                 "gradients unscale to inf or NaN, the step is skipped and the backoff "
                 "(loss_scale / factor) gives 0, where the spec takes the step whenever "
                 "1 / scale is finite and backs off to half the subnormal scale.",
        matters="No: jmp's default min_loss_scale=1.0 keeps the scale at 1 or above; only a "
                "min_loss_scale below 2**-126 lets it get there, after 142 overflows in a row "
                "from 2**15.",
        checked=f"{_SOURCE}: DynamicLossScale.unscale multiplies by inv_loss_scale = 1 / "
                "self.loss_scale (line 135); adjust backs off with jnp.maximum("
                "self.min_loss_scale, self.loss_scale / self.factor) (line 165). On CPU, eager "
                "and under jax.jit (jax 0.10.2): 1 / jnp.asarray(2.0**-130) is inf and "
                "jnp.asarray(2.0**-130) / 2 is 0.0. reciprocal_overflow_skips_finite_steps "
                "(2**-130, interval 1, FFF): the step is skipped as in the spec, but the scale "
                "is 0.0 where the spec halves it to 2**-131 (0x00020000). "
                "backoff_reaches_zero_and_stays (2**-148, IIFF): 0.0 at step 1, the spec "
                "2**-149. At 2**-127 a finite step is skipped and the scale becomes 0; the "
                "spec takes it (1 / 2**-127 = 2**127 is finite).",
        snippet=f"{_SNIPPETS}/flushes_subnormals_to_zero.py"),
    Difference(
        cause="floor of 1",
        sentence="Under jax.jit it never backs off below 1.0, whatever min_loss_scale was "
                 "given: DynamicLossScale.tree_flatten keeps (loss_scale, counter) and "
                 "(period, factor) only, so every scaler that crosses a jit boundary is "
                 "rebuilt with the default min_loss_scale=1.0.",
        matters="Yes, for a model whose scale must go below 1 (large gradients) or a user who "
                "set min_loss_scale: a jitted train step, the way JAX training runs, ignores "
                "the floor given and never backs off below 1; eagerly the floor holds.",
        checked=f"{_SOURCE}: tree_flatten returns data=(loss_scale, counter), meta=(period, "
                "factor) (line 138); tree_unflatten calls cls(loss_scale, counter, period, "
                "factor) (line 144), so min_loss_scale takes its default, np.ones([], "
                "np.float32). min_scale_clamp (4, min 1.5, IIIF): eager 2, 1.5, 1.5; jitted "
                "max(1.0, 4 / 2) = 2, then max(1.0, 2 / 2) = 1.0 (the spec 1.5). "
                "backoff_below_one (2, no floor, i.e. min_loss_scale 0): jitted 1, then "
                "max(1.0, 0.5) = 1.0 (the spec 0.5). The two subnormal vectors give 1.0 under "
                "jit for the same reason.",
        snippet=f"{_SNIPPETS}/floor_of_1.py"),
    Difference(
        cause="counts modulo the interval",
        sentence="It grows when counter == period - 1 and counts modulo period, so a counter "
                 "at or past the period (restored from a run with a longer period) wraps "
                 "around and grows up to period steps late.",
        matters="Rarely: only after restoring a counter into a scaler with a shorter period; "
                "one growth comes at most period steps late.",
        checked=f"{_SOURCE}, DynamicLossScale.adjust (lines 149-167): select(self.counter == "
                "(self.period - 1), ...) and counter = ((self.counter + 1) % self.period) * "
                "grads_finite. Counter 7, period 5: 7 != 4, no growth, counter (7 + 1) % 5 = 3 "
                "(seen: 1024.0, counter 3); then 4; the third finite step grows to 2048. The "
                "spec grows on the first (7 + 1 >= 5).",
        snippet=f"{_SNIPPETS}/counts_modulo_the_interval.py"),
    Difference(
        cause="scale() changes a leaf's dtype",
        sentence="scale() and unscale() multiply each leaf by the float32 scale, and the scale "
                 "that adjust() returns is a float32 array that is not weakly typed (it comes "
                 "out of jnp.maximum with the float32 min_loss_scale), so from the first "
                 "adjust() on, float16 leaves come back float32.",
        matters="Little: with jmp's usual policies (float32 parameters and output) the loss "
                "and gradients are float32 anyway; with float16 parameters, unscale() returns "
                "float32 gradients, twice their memory, until cast back "
                "(jmp.Policy.cast_to_param).",
        checked=f"{_SOURCE}: scale is tree_map(lambda x: x * self.loss_scale, tree) (line "
                "130), unscale multiplies by 1 / self.loss_scale (line 135). "
                "DynamicLossScale(jnp.asarray(2.0**15)), as its docstring builds it, is weakly "
                "typed and keeps float16; after one adjust(), finite or not, weak_type is "
                "False and a float16 leaf comes back float32. The adapter's scale is a float32 "
                "array from the start: the failing example is scale 1.0, tree "
                "[array([0.], float16)] -> float32.",
        snippet=f"{_SNIPPETS}/scale_changes_a_leafs_dtype.py"),
    Difference(
        cause="counts finite gradients that unscaling overflows as inf",
        sentence="jmp's loop checks the gradients after unscaling them (all_finite(unscale("
                 "grads))), so finite gradients that 1 / scale takes past float32's maximum "
                 "count as non-finite: the step is skipped and the scale backs off.",
        matters="Rarely: only with a scale below 1 (jmp's default min_loss_scale=1.0 keeps it "
                "at 1 or above) and gradients above 3.4e38 times the scale, whose unscaled "
                "values are inf either way.",
        checked="jmp's README and the DynamicLossScale docstring: grads = "
                "loss_scale.unscale(grads); grads_finite = jmp.all_finite(grads). Scale "
                "2**-10: 3e38 * 1024 = 3.07e41, inf in float32, all_finite is False; the "
                "spec checks the gradients as computed, 3e38, finite.",
        snippet=f"{_SNIPPETS}/counts_finite_gradients_that_unscaling_overflows_as_inf.py"),
)
