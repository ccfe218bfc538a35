"""The JAX backend: the scaler as an immutable pytree value, with an optax wrapper.

The scale and both trackers are leaves (arrays); the config is static aux
data, so it survives ``jax.jit``, ``tree_flatten``/``tree_unflatten``,
``lax.scan`` carries and checkpoints intact. Every verb is pure and traceable:
``scale(tree)``, ``unscale(grads) -> (grads, finite)``, ``update(finite) -> scaler``.

XLA flushes float32 subnormals to zero (inputs and results, on CPU and by
default on GPU). The update therefore multiplies the scale by a factor with
integer and float ops that never see a subnormal, so the scale follows the
spec bit for bit also below float32's smallest normal number. ``scale`` and
``unscale`` multiply by the scale and by ``f32(1 / scale)`` split into two
normal float32 factors, so neither multiplier is flushed at any scale: their
results are NumPy's (and torch's, MLX's) bits wherever those are normal
numbers, zeros, infs or NaNs (:mod:`unifiedamp.backends._float32_bits`).

The package's modules: ``_scaler`` (:class:`JaxGradScaler` and the helpers of a
jitted step), ``_optax`` (:func:`loss_scaled`, :func:`loss_scaled_accumulate`),
``_diagnostics`` (:func:`overflow_counts`, the report, history ring and collapse
check), ``_agreement`` (the mesh axes the finite flag is summed over, and the trace-time
check that the devices sharing a scale agree on it: a missing ``axis_name``), ``_flax``
(the scaler registered with ``flax.serialization``, now or when Flax is imported, so msgpack
checkpoints take it) and ``_compat`` (the JAX internals they rely on).
``praxis`` and ``paxml`` (imported only when named: they import Praxis and PaxML) wrap the
scaler for Praxis optimizers and PaxML's Learner.
"""

from __future__ import annotations

from unifiedamp.backends import show_as_public
from unifiedamp.backends._functional_diagnostics import LeafCounts
from unifiedamp.backends.jax._diagnostics import (
    check_collapse,
    collapse_message,
    history_init,
    history_record,
    overflow_counts,
    overflow_report,
    scale_history,
)
from unifiedamp.backends.jax._flax import register_with_flax
from unifiedamp.backends.jax._optax import (
    LossScaledAccumulateState,
    LossScaledState,
    find_scaler,
    loss_scaled,
    loss_scaled_accumulate,
    replace_scaler,
)
from unifiedamp.backends.jax._scaler import (
    JaxGradScaler,
    all_finite,
    step_if_finite,
    where_finite,
)

__all__ = ["JaxGradScaler", "LeafCounts", "LossScaledAccumulateState", "LossScaledState",
           "all_finite", "check_collapse", "collapse_message",
           "find_scaler", "history_init", "history_record", "loss_scaled",
           "loss_scaled_accumulate", "overflow_counts", "overflow_report", "replace_scaler",
           "scale_history", "step_if_finite", "where_finite"]


# Flax's msgpack (to_bytes, from_bytes) writes only registered types; this does not import Flax.
register_with_flax()


def _show_public() -> None:
    for name in __all__:
        if globals()[name].__module__.startswith(__name__ + "."):
            show_as_public(globals()[name], __name__)


_show_public()
del _show_public


def __getattr__(name: str) -> object:
    # LossScaledTransformation (loss_scaled's former return type, whose Praxis
    # init_partition_spec PaxML could not use) is now optax's own type.
    if name == "LossScaledTransformation":
        import warnings

        import optax

        warnings.warn("unifiedamp.backends.jax.LossScaledTransformation is deprecated: "
                      "loss_scaled returns an optax.GradientTransformationExtraArgs; for "
                      "Praxis use unifiedamp.backends.jax.praxis.loss_scaled",
                      DeprecationWarning, stacklevel=2)
        return optax.GradientTransformationExtraArgs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
