"""The JAX scaler (:class:`JaxGradScaler`) and the helpers of a jitted step.

The scale and both trackers are leaves (arrays); the config is static aux data, so it
survives ``jax.jit``, ``tree_flatten``/``tree_unflatten``, ``lax.scan`` carries and
checkpoints intact. XLA flushes float32 subnormals, so the update and the scale's
reciprocal are computed on bit patterns (:mod:`unifiedamp.backends._float32_bits`), and
``scale``/``unscale`` multiply by two normal factors whose product is the multiplier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from unifiedamp._tree import refuse_foreign
from unifiedamp.backends._float32_bits import Float32Bits, factor_parts
from unifiedamp.backends._functional import LEAVES, FunctionalGradScaler
from unifiedamp.backends.jax._agreement import (
    reduction_axes,
    require_agreed,
    warn_if_unagreed,
)
from unifiedamp.backends.jax._compat import is_tracer, optimization_barrier
from unifiedamp.spec import MIN_UNSCALABLE, ScalerConfig, f32_bits

#: Float32 arithmetic on bit patterns, in ``jax.numpy``.
F32 = Float32Bits.for_jax()

# The float32 helpers are a few dozen small integer and float ops each: run eagerly (a step
# outside jit) each op is dispatched on its own, compiled together they are one dispatch.
# Under an outer jit they are inlined. A factor's exponent is static and its significand an
# array: another factor compiles again only where its exponent is new.
# The two factors of a split come as one float32[2] array, computed in one kernel before
# the kernels that multiply by them: XLA's CPU compiles a scalar computation with two
# results into two kernels (it makes no multi-output fusions there), and without the
# barrier fuses the whole computation into every kernel that multiplies by it, where a
# GPU would run it once per thread.
_mul_bits = jax.jit(F32.mul_bits, static_argnums=2)
_split = jax.jit(lambda bits: optimization_barrier(jnp.stack(F32.split(bits))))
_reciprocal_split = jax.jit(lambda bits: optimization_barrier(
    jnp.stack(F32.split(F32.reciprocal_bits(bits)))))


def _multiply(tree: Any, factors: jax.Array) -> Any:
    """Every leaf times ``hi * lo``, the two factors of a split (:meth:`Float32Bits.split`,
    as :data:`_split` stacks them), in the leaf's dtype."""
    hi, lo = factors[0], factors[1]
    return jax.tree.map(lambda x: ((x * hi) * lo).astype(jnp.result_type(x)), tree)


def all_finite(tree: Any, axis_name: Any = None) -> jax.Array:
    """True (a 0-d bool array) when every element of every leaf is finite.

    With ``axis_name`` (inside ``shard_map``/``pmap``: a mesh axis name or a tuple of
    them), true only if it holds on every device of those axes, so all of them skip
    together; ``axis_name=()`` says the gradients already agree (no collective). In a
    default ``shard_map`` the flag is summed over the named axes it varies over only (on
    the others it is already equal), so a tuple also works where the gradients vary over
    some of its axes and not others (a 2-D mesh with parameters sharded over one axis).
    Without ``axis_name``, or with one that leaves out a mesh axis in scope, a check that
    devices may not agree on warns under ``pmap`` and ``shard_map(check_vma=False)``;
    without it, also on one process's arrays of a multi-process run
    (``docs/backends/jax.md``, Devices).

    Example:
        >>> import jax.numpy as jnp
        >>> bool(all_finite({"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf])}))
        False
    """
    return _all_finite(tree, axis_name, "all_finite")


def _all_finite(tree: Any, axis_name: Any, caller: str) -> jax.Array:
    warn_if_unagreed(tree, axis_name, caller)
    finite = jnp.array(True)
    for leaf in jax.tree.leaves(tree):
        # The least of isfinite(g) as int8 (1 for an empty leaf): every dtype in one form.
        # XLA's CPU reduces it as a byte per element in one vectorised pass, and in a train
        # step it reads the gradient as the optimizer's update does, where a float sum
        # (sum(g * 0)) made XLA write each weight's gradient a second time, transposed
        # (docs/backends/jax.md, Performance).
        finite = finite & (jnp.min(jnp.isfinite(jnp.asarray(leaf)).astype(jnp.int8),
                                   initial=1) > 0)
    if axis_name is not None:
        axes = reduction_axes(finite, axis_name)
        if axes:
            finite = lax.psum((~finite).astype(jnp.int32), axes) == 0
    return finite


def _skips_by_select() -> bool:
    """Whether :func:`step_if_finite` skips with a select rather than a ``lax.cond``: on
    GPUs, where a select over the parameters and optimizer state measured faster (XLA's GPU
    runtime may read a ``lax.cond``'s predicate on the host); not on the CPU, where XLA
    copies every optimizer moment before the select overwrites it in place, nor on TPUs
    (not measured). Read from ``jax.default_backend()`` at trace time: no cost in a step."""
    return jax.default_backend() == "gpu"


def step_if_finite(finite: jax.Array, step: Callable[[Any], Any], state: Any) -> Any:
    """``step(state)`` if ``finite`` else ``state``, in the form that is fastest on the
    default device (``jax.default_backend()``): a ``lax.cond`` on the CPU (a skipped step costs
    nothing, a taken one updates parameters and optimizer state in place), a select of
    every leaf on a GPU (:func:`where_finite` of ``step(state)``). Both skip the same steps;
    a taken step's values are ``step(state)`` as XLA compiles it in each program (a
    reduction inside ``step`` may be summed in another order: an ulp apart).

    Unscale the gradients *inside* ``step`` (``scaler.unscale(grads)[0]``) and take the
    flag from a call outside (``scaler.unscale(grads)[1]``): XLA drops each call's unused
    half, and the product fuses into the optimizer's update instead of being a pass
    of its own (``docs/backends/jax.md``, Performance).

    Inside a default ``shard_map``, a ``finite`` that varies over a mesh axis over which
    ``state`` does not raises ``ValueError`` naming ``axis_name`` (each device would
    step or skip on its own, and JAX types the result as still replicated).

    Example:
        >>> import jax.numpy as jnp
        >>> step_if_finite(jnp.array(False), lambda w: w - 1.0, jnp.ones(2))
        Array([1., 1.], dtype=float32)
    """
    require_agreed(finite, state, "step_if_finite",
                   "the state does not, so each device would step or keep its own replica")
    if _skips_by_select():
        return where_finite(finite, step(state), state)
    return lax.cond(finite, step, lambda s: s, state)


def where_finite(finite: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old``, leaf by leaf: keeps parameters and optimizer
    state of a skipped step without a host sync.

    For a whole optimizer step prefer :func:`step_if_finite`, which is this select on a GPU
    but a ``lax.cond`` on the CPU: there XLA fuses the optimizer's new moments into both the
    select and the parameter update, so it copies every moment first
    (``docs/backends/jax.md``, Performance); a select on a few leaves, or outside ``jit``,
    is cheap.

    Inside a default ``shard_map``, a ``finite`` that varies over a mesh axis over which
    ``old`` does not raises ``ValueError`` naming ``axis_name``.

    Example:
        >>> import jax.numpy as jnp
        >>> where_finite(jnp.array(False), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})["w"]
        Array([0., 0.], dtype=float32)
    """
    require_agreed(finite, old, "where_finite",
                   "the old state does not, so each device would keep or replace its own "
                   "replica")
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def _refuse_foreign(tree: Any, what: str) -> None:
    # jax.tree.leaves sees into registered pytrees (optax states, flax structs); NumPy arrays
    # are JAX inputs. Under jit this runs once, at tracing.
    refuse_foreign(jax.tree.leaves(tree), what=what, own=("jax", "jaxlib", "numpy"),
                   expected="JAX arrays, NumPy arrays or numbers",
                   convert="jnp.asarray (a torch tensor: through NumPy)")


@jax.tree_util.register_pytree_with_keys_class
class JaxGradScaler(FunctionalGradScaler):
    """A dynamic loss scaler for JAX, as an immutable value.

    Args:
        *args: ``init_scale, growth_factor, backoff_factor, growth_interval, enabled``.
        **kwargs: The other config parameters, by canonical name or alias.

    Attributes:
        loss_scale: The scale, a float32 0-d array (a pytree leaf).
        growth_tracker: An int32 0-d array (a leaf).
        hysteresis_tracker: An int32 0-d array (a leaf).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import unifiedamp as ua
        >>> scaler = ua.GradScaler(1024.0, growth_interval=2, backend="jax")
        >>> def loss(w):
        ...     return (w ** 2).sum()
        >>> @jax.jit
        ... def step(w, scaler):
        ...     grads = jax.grad(lambda w: scaler.scale(loss(w)))(w)
        ...     grads, finite = scaler.unscale(grads)
        ...     w = jax.tree.map(lambda w, g: jnp.where(finite, w - 0.1 * g, w), w, grads)
        ...     return w, scaler.update(finite)
        >>> w, scaler = step(jnp.ones(3), scaler)
        >>> w, scaler = step(w, scaler)
        >>> scaler.get_scale(), w
        (2048.0, Array([0.64, 0.64, 0.64], dtype=float32))
    """

    backend = "jax"
    xp: ClassVar[Any] = jnp

    @classmethod
    def _array(cls, value: Any, dtype: Any) -> jax.Array:
        return jnp.asarray(value, dtype)

    # Pytree: arrays are leaves, the (hashable) config is static aux data, so no
    # jit, scan or flatten/unflatten round trip can drop an option.
    def tree_flatten_with_keys(self) -> tuple[Any, ScalerConfig]:
        key = jax.tree_util.GetAttrKey
        return tuple((key(name), getattr(self, name)) for name in LEAVES), self._config

    @classmethod
    def tree_unflatten(cls, config: ScalerConfig, children: Any) -> JaxGradScaler:
        return cls._make(config, *children)

    # The update works on the scale's bit pattern (an int32): XLA flushes float32
    # subnormals, but integer ops and selects keep every bit, and positive
    # floats order like their bit patterns (so maximum/minimum clamp correctly).
    def _encode(self, scale: jax.Array) -> jax.Array:
        return F32.bits(scale)

    def _decode(self, encoded: jax.Array) -> jax.Array:
        return F32.from_bits(encoded)

    def _constant(self, value: float) -> int:
        return f32_bits(value)

    def _multiply(self, scale: jax.Array, factor: float) -> jax.Array:
        cn, ec = factor_parts(factor)
        return _mul_bits(F32.bits(scale), F32.float32(cn), ec)

    def _is_finite(self, encoded: jax.Array) -> jax.Array:
        return F32.is_finite(encoded)

    def _materialised(self, *arrays: jax.Array) -> tuple[jax.Array, ...]:
        # Else XLA recomputes the new trackers inside the new scale's kernel from the old
        # ones, which the trackers' own kernels overwrite in place: it copies them first.
        return tuple(optimization_barrier(arrays))

    @classmethod
    def _overflow_reductions(cls, grad: jax.Array) -> tuple[jax.Array, ...]:
        # One variadic reduce: XLA fuses it with its inputs into one pass over the gradient,
        # where three reductions each write their input to memory first (docs/diagnostics.md
        # has the figures). float16/bfloat16 magnitudes are compared in float32 (exact);
        # float64 ones in float64, rounded at the end.
        magnitude = jnp.abs(grad)
        if jnp.dtype(magnitude.dtype).itemsize < 4:
            magnitude = magnitude.astype(jnp.float32)
        zero = jnp.zeros((), magnitude.dtype)
        operands = (jnp.isinf(grad).astype(jnp.int32), jnp.isnan(grad).astype(jnp.int32),
                    jnp.where(jnp.isfinite(grad), magnitude, zero))

        def combine(a: tuple[jax.Array, ...], b: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            return a[0] + b[0], a[1] + b[1], jnp.maximum(a[2], b[2])

        return tuple(lax.reduce(operands, (jnp.int32(0), jnp.int32(0), zero), combine,
                                tuple(range(grad.ndim))))

    # ------------------------------------------------------------ the verbs

    def scale(self, outputs: Any) -> Any:
        """Multiplies every leaf (a loss, or a tree of outputs) by the scale; each leaf
        keeps its dtype.

        The product is NumPy's ``f32(x * scale)`` at every scale, subnormal scales
        included, wherever that is a normal number, zero, inf or NaN; a product
        below 2**-126 is flushed to zero, as XLA does for every float32 op.

        Example:
            >>> import jax.numpy as jnp
            >>> JaxGradScaler(2.0**-149).scale(jnp.float32(2.0**100))
            Array(1.7763568e-15, dtype=float32)
        """
        self._check_current("scale")
        _refuse_foreign(outputs, "scale()")
        if not self._config.enabled:
            return outputs
        # F32.bits reads the leaf with jnp.asarray: in a flax nnx optimizer state it is a
        # Variable, not an array.
        return _multiply(outputs, _split(F32.bits(self.loss_scale)))

    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` where ``finite``, else ``old``: pytrees of the same structure, selected
        leaf by leaf (module-level :func:`where_finite`; traceable, no host sync).

        Example:
            >>> import jax.numpy as jnp, unifiedamp as ua
            >>> s = ua.GradScaler(backend="jax")
            >>> s.where_finite(jnp.array(False), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})["w"]
            Array([0., 0.], dtype=float32)
        """
        _refuse_foreign((new, old), "where_finite()")
        return where_finite(finite, new, old)

    def unscale(self, grads: Any, axis_name: Any = None) -> tuple[Any, jax.Array]:
        """Divides every leaf by the scale; returns ``(grads, all finite)`` in one pass.

        Each leaf is multiplied by ``f32(1 / scale)`` (the float64 reciprocal rounded
        once, like torch, NumPy and MLX), giving their bits at every scale wherever
        the result is a normal number, zero, inf or NaN; a result below 2**-126 is
        flushed to zero, as XLA does for every float32 op. ``all finite`` is
        decided on the gradients as given (scaled), like every backend, and is
        false at a scale whose reciprocal overflows (``spec.unscale_overflows``);
        with ``axis_name`` it is agreed across that mapped axis (:func:`all_finite`:
        without one, a check devices may disagree on warns, and :meth:`update`
        refuses a flag that varies across a default ``shard_map``'s devices).

        Example:
            >>> import jax.numpy as jnp
            >>> grads, finite = JaxGradScaler(2.0**127).unscale(jnp.float32(1.7e8))
            >>> grads, bool(finite)
            (Array(9.991702e-31, dtype=float32), True)
        """
        return self._unscale(grads, axis_name, "unscale")

    def _unscale(self, grads: Any, axis_name: Any, caller: str) -> tuple[Any, jax.Array]:
        self._check_current(caller)
        _refuse_foreign(grads, f"{caller}()")
        if not self._config.enabled:
            return grads, jnp.array(True)
        inverse = _reciprocal_split(F32.bits(self.loss_scale))
        finite = _all_finite(grads, axis_name, caller) & self._reciprocal_finite()
        return _multiply(grads, inverse), finite

    def update(self, finite: Any = None, *, new_scale: Any = None) -> JaxGradScaler:
        """The scaler after one iteration whose gradients were all ``finite`` (or not).

        Args:
            finite: One flag: the 0-d bool array ``unscale`` returns, a Python bool
                or a 0-d NumPy bool. Anything else (a string, a float, an array of
                flags) raises ``TypeError``/``ValueError`` rather than being read as
                true or reshaping the scaler's arrays; the check reads only static
                type, dtype and shape, so it costs nothing under jit.
            new_scale: Instead, a scaler whose scale is this host number (finite
                and > 0 in float32), trackers and counters kept, as torch's
                ``update(new_scale)``; not counted as an update.

        Raises:
            RuntimeError: An eager ``update``, ``restore`` or setter already replaced this
                scaler (``scaler.update(finite)`` without ``scaler =``): keep the result.
            ValueError: Inside a default ``jax.shard_map``, ``finite`` varies over a mesh
                axis over which the scale does not: it was decided on each device's own
                gradients, and the scale would differ across devices. The message names
                the ``axis_name`` to pass to ``unscale``. Read from the flag's type at
                trace time: no cost.

        Example:
            >>> import unifiedamp as ua
            >>> ua.GradScaler(8.0, backend="jax").update(False).get_scale()
            4.0
        """
        try:
            if finite is not None and new_scale is None and self._config.enabled:
                require_agreed(finite, self.loss_scale, "update",
                               "the scale does not, so each device would update its own copy")
            return super().update(finite, new_scale=new_scale)
        except (RuntimeError, ValueError):  # JAX's "deleted or donated": why, and what to use
            deleted = [array for array in self._leaves() if _deleted(array)]
            if deleted:
                raise ValueError(f"this JaxGradScaler cannot be updated: "
                                 f"{self._unreadable(deleted[0])}") from None
            raise

    def _reciprocal_finite(self) -> jax.Array:
        # spec.unscale_overflows: below MIN_UNSCALABLE (a subnormal) 1/scale is inf, and
        # every check finds inf. Compared on bit patterns: XLA flushes subnormal operands.
        return F32.bits(self.loss_scale) >= f32_bits(MIN_UNSCALABLE)

    def _traced(self, array: Any) -> bool:
        try:
            return is_tracer(jnp.asarray(array))
        except (TypeError, RuntimeError):  # not an array, or a deleted one: not traced
            return False

    def _unreadable(self, array: Any) -> str:
        if _deleted(array):
            return ("its arrays were deleted: the scaler was donated to a jitted call "
                    "(donate_argnums/donate_argnames), which took their buffers; use the "
                    "scaler that call returned")
        if not hasattr(array, "shape") or not hasattr(array, "item"):
            return (f"a leaf is a {type(array).__name__} {array!r:.40}, not an array: the "
                    "scaler was rebuilt (jax.tree_util.tree_unflatten) from other values; "
                    "unflatten it from leaves like those tree_flatten gives")
        if array.shape != ():
            return (f"its arrays have shape {tuple(array.shape)}, a value per device: "
                    "jax.pmap returned the scaler stacked over its devices (out_axes=0); "
                    "give the scaler out_axes=None (with unscale(grads, axis_name=...) every "
                    "device holds the same one), or take one copy: "
                    "jax.tree.map(lambda x: x[0], scaler)")
        return ""

    # ------------------------------------------------------------ tooling

    @classmethod
    def devices(cls) -> list[str]:
        """The devices JAX sees."""
        return [str(d) for d in jax.devices()]


def _deleted(array: Any) -> bool:
    """Whether ``array`` is a concrete JAX array whose buffer was donated away."""
    return isinstance(array, jax.Array) and not is_tracer(array) and array.is_deleted()
