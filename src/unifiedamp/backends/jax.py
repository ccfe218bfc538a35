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
normal float32 factors (:func:`_split`), so neither multiplier is flushed at
any scale: their results are NumPy's (and torch's, MLX's) bits wherever those
are normal numbers, zeros, infs or NaNs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from unifiedamp import diagnostics
from unifiedamp._registry import MissingBackendError
from unifiedamp.backends import _functional
from unifiedamp.backends._functional import LEAVES, FunctionalGradScaler, LeafCounts
from unifiedamp.spec import MIN_UNSCALABLE, ScalerConfig, f32_bits

__all__ = ["JaxGradScaler", "LeafCounts", "LossScaledAccumulateState", "LossScaledState",
           "LossScaledTransformation", "all_finite", "check_collapse", "collapse_message",
           "find_scaler", "history_init", "history_record", "loss_scaled",
           "loss_scaled_accumulate", "overflow_counts", "overflow_report", "replace_scaler",
           "scale_history", "step_if_finite", "where_finite"]

_EXP_MASK = 0x7F800000
_MIN_NORMAL_BITS = 0x00800000  # bits of 2**-126, float32's smallest normal number


def _split(bits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two float32 0-d arrays ``hi, lo`` whose product is exactly the non-negative
    float32 with bit pattern ``bits``, both normal (or ``hi`` 0 or inf).

    ``(x * hi) * lo`` is then ``f32(x * value)`` for every x whose product is a
    normal number, zero, inf or NaN, while XLA flushes a subnormal ``value`` used
    directly (to 0, so ``x * value`` is 0 and ``x / value`` inf). A normal value
    gives ``lo = 1``: the common case stays one multiply, and a multiply by 1 is
    free in the fused elementwise kernel. A subnormal value ``k * 2**-149`` gives
    ``hi = k * 2**-85`` (an exact int-to-float conversion, k < 2**23) and
    ``lo = 2**-64``: ``|x * hi|`` stays below 2**66 (no spurious inf), is rounded
    once to 24 bits, and the scaling by ``lo`` is exact unless the result is
    subnormal.
    """
    subnormal = bits < _MIN_NORMAL_BITS
    hi = jnp.where(subnormal, bits.astype(jnp.float32) * jnp.float32(2.0**-85),
                   lax.bitcast_convert_type(bits, jnp.float32))
    lo = jnp.where(subnormal, jnp.float32(2.0**-64), jnp.float32(1.0))
    return lax.stop_gradient(hi), lax.stop_gradient(lo)


def _split_bits(x: jax.Array, keep: int) -> tuple[jax.Array, jax.Array]:
    """Dekker's split of a normal float32 array: ``x == high + low`` exactly, ``high``
    with the top ``keep`` mantissa bits (so products of halves are exact)."""
    mask = -(1 << (23 - keep))
    high = lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.int32) & mask, jnp.float32)
    return high, x - high


def _product_error(a: jax.Array, b: jax.Array, p: jax.Array) -> jax.Array:
    """``a * b - p`` exactly, for normal float32 ``a``, ``b`` and ``p = f32(a * b)``
    (Dekker's product: the halves' products are exact in float32)."""
    ah, al = _split_bits(a, 11)
    bh, bl = _split_bits(b, 11)
    return (((ah * bh - p) + ah * bl) + al * bh) + al * bl


def _round_half_even(v: jax.Array, below: jax.Array) -> jax.Array:
    """``v`` rounded to an int32, to nearest, ties to even, where ``v`` is a rounded
    value and ``below`` the sign-carrying remainder it dropped: a tie in ``v`` goes up
    when the exact value was above it."""
    floor = jnp.floor(v)
    frac = v - floor
    odd = jnp.floor(floor * 0.5) * 2 != floor
    up = (frac > 0.5) | ((frac == 0.5) & ((below > 0) | ((below == 0) & odd)))
    return floor.astype(jnp.int32) + up.astype(jnp.int32)


def _reciprocal_bits(scale: jax.Array) -> jax.Array:
    """The bits of ``f32(1 / scale)`` for a non-negative float32 0-d array: the float64
    reciprocal rounded once to float32, what torch, NumPy and MLX unscale with.

    float32 division is correctly rounded, and equals that double rounding (53 >=
    2 * 24 + 2 bits), so ``1 / scale`` is used for normal scales below 2**126.
    XLA flushes a subnormal scale (1 / scale would be inf) and a subnormal
    reciprocal (a scale above 2**126, 1 / scale would be 0): both are computed
    on a normalised mantissa instead, the subnormal reciprocal rounded to its
    multiple of 2**-149 with the exact remainder deciding a tie.
    """
    bits = lax.bitcast_convert_type(scale, jnp.int32)
    expo = bits >> 23
    mant = bits & 0x7FFFFF
    # A subnormal scale k * 2**-149 (k = mant): 1 / scale = (1 / (k * 2**-85)) * 2**64,
    # the product exact unless it overflows (to inf where float64 -> float32 does too).
    small = (jnp.float32(1.0) / (mant.astype(jnp.float32) * jnp.float32(2.0**-85))
             ) * jnp.float32(2.0**64)
    # A scale m * 2**e with m in [1, 2), e in {126, 127}: 1 / scale = (1 / m) * 2**-e is
    # a subnormal k * 2**-149 with k = round((1 / m) * 2**(149 - e)), at most 2**23.
    m = lax.bitcast_convert_type((127 << 23) | mant, jnp.float32)
    r = jnp.float32(1.0) / m
    t = r * lax.bitcast_convert_type((149 - (expo - 127) + 127) << 23, jnp.float32)
    # r is 1 / m rounded to 24 bits; rounding r again is right except when r lands on
    # a tie: then the sign of the exact 1 - m * r says which way.
    p = m * r
    large = _round_half_even(t, (jnp.float32(1.0) - p) - _product_error(m, r, p))
    normal = lax.bitcast_convert_type(jnp.float32(1.0) / scale, jnp.int32)
    return jnp.where(expo == 0, lax.bitcast_convert_type(small, jnp.int32),
                     jnp.where(expo < 253, normal, large))


def _multiply(tree: Any, hi: jax.Array, lo: jax.Array) -> Any:
    """Every leaf times ``hi * lo`` (see :func:`_split`), in the leaf's dtype."""
    return jax.tree.map(lambda x: ((x * hi) * lo).astype(jnp.result_type(x)), tree)


def _mul_bits(x: jax.Array, c: float) -> jax.Array:
    """The bits of f32(x * c), IEEE round to nearest even, subnormals included.

    ``x`` is a non-negative float32 scalar array, ``c`` a positive float32 value
    known when tracing. x = xn * 2**ex and c = cn * 2**ec with xn, cn in [1, 2);
    xn * cn is computed exactly as hi + lo (Dekker's product, operands split on
    their bits), then either reassembled with the exponent (normal result) or
    rounded once to a multiple of 2**-149 (subnormal result).
    """
    mant_c, exp_c = math.frexp(c)
    cn, ec = jnp.float32(mant_c * 2), exp_c - 1
    bits = lax.bitcast_convert_type(x, jnp.int32)
    ebits = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    subnormal = ebits == 0
    shift = jnp.where(subnormal, lax.clz(mant) - 8, 0)
    ex = jnp.where(subnormal, -126 - shift, ebits - 127)
    xn = lax.bitcast_convert_type((127 << 23) | ((mant << shift) & 0x7FFFFF), jnp.float32)
    hi = xn * cn
    lo = _product_error(xn, cn, hi)
    hbits = lax.bitcast_convert_type(hi, jnp.int32)
    e_res = ((hbits >> 23) & 0xFF) + ex + ec
    normal = (hbits & 0x7FFFFF) | (e_res << 23)
    s = jnp.clip(149 + ex + ec, -60, 30)  # below -60 the result rounds to 0 anyway
    two_s = lax.bitcast_convert_type((s + 127) << 23, jnp.float32)
    tiny = _round_half_even(hi * two_s, lo * two_s)
    out = jnp.where(e_res >= 255, _EXP_MASK, jnp.where(e_res >= 1, normal, tiny))
    return jnp.where(bits == 0, 0, out).astype(jnp.int32)


def all_finite(tree: Any, axis_name: Any = None) -> jax.Array:
    """True (a 0-d bool array) when every element of every leaf is finite.

    With ``axis_name`` (inside ``shard_map``/``pmap``), true only if it holds on
    every device of that axis, so all of them skip together.

    Example:
        >>> import jax.numpy as jnp
        >>> bool(all_finite({"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf])}))
        False
    """
    finite = jnp.array(True)
    for leaf in jax.tree.leaves(tree):
        leaf = jnp.asarray(leaf)
        if jnp.dtype(leaf.dtype).itemsize >= 4:
            # sum(g * 0) is 0 for finite g and NaN as soon as one element is inf or NaN
            # (exact: a sum of zeros cannot overflow). One float reduction, which XLA's
            # CPU runs about twice as fast as isfinite().all() (2.8 against 5.2 ms on
            # 9.4M float32, jax 0.10.2); XLA never folds it (x * 0 is not 0 for a float x).
            finite = finite & jnp.isfinite(jnp.sum(leaf * 0))
        else:
            # float16/bfloat16: XLA's CPU emulates their arithmetic, and sum(g * 0)
            # takes 25 ms on 9.4M float16 where isfinite().all() takes 8 ms.
            finite = finite & jnp.all(jnp.isfinite(leaf))
    if axis_name is not None:
        finite = lax.psum((~finite).astype(jnp.int32), axis_name) == 0
    return finite


def step_if_finite(finite: jax.Array, step: Callable[[Any], Any], state: Any) -> Any:
    """``step(state)`` if ``finite`` else ``state``, as a ``lax.cond``: a skipped step
    costs nothing, and a taken one updates parameters and optimizer state in place.

    Unscale the gradients *inside* ``step`` (``scaler.unscale(grads)[0]``) and take the
    flag from a call outside (``scaler.unscale(grads)[1]``): XLA drops each call's unused
    half, and the product fuses into the optimizer's update instead of being a pass
    of its own. This is the fastest form measured on XLA's CPU (jax 0.10.2):
    :func:`where_finite` over the optimizer state costs twice the step there, see
    ``docs/backends/jax.md``.

    Example:
        >>> import jax.numpy as jnp
        >>> step_if_finite(jnp.array(False), lambda w: w - 1.0, jnp.ones(2))
        Array([1., 1.], dtype=float32)
    """
    return lax.cond(finite, step, lambda s: s, state)


def where_finite(finite: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old``, leaf by leaf: keeps parameters and optimizer
    state of a skipped step without a host sync.

    Prefer :func:`step_if_finite` for a whole optimizer step under ``jax.jit``: XLA's CPU
    fuses the optimizer's new moments into both the select and the parameter update,
    so it copies every moment first (measured 2x the step of a 9.4M-parameter AdamW
    MLP, jax 0.10.2); a select on a few leaves, or outside ``jit``, is cheap.

    Example:
        >>> import jax.numpy as jnp
        >>> where_finite(jnp.array(False), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})["w"]
        Array([0., 0.], dtype=float32)
    """
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


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
        return lax.bitcast_convert_type(scale, jnp.int32)

    def _decode(self, bits: jax.Array) -> jax.Array:
        return lax.bitcast_convert_type(bits, jnp.float32)

    def _constant(self, value: float) -> int:
        return f32_bits(value)

    def _multiply(self, scale: jax.Array, factor: float) -> jax.Array:
        return _mul_bits(scale, factor)

    def _is_finite(self, bits: jax.Array) -> jax.Array:
        return (bits & _EXP_MASK) != _EXP_MASK

    @classmethod
    def _overflow_reductions(cls, grad: jax.Array) -> tuple[jax.Array, ...]:
        # One variadic reduce: XLA fuses it with its inputs into one pass over the gradient
        # (XLA's CPU, jax 0.10.2: 2.3 ms on 9.4M float32, where three reductions took
        # 67 ms, each writing its input to memory first). float16/bfloat16 magnitudes are
        # compared in float32 (exact); float64 ones in float64, rounded at the end.
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
        if not self._config.enabled:
            return outputs
        # asarray: in a flax nnx optimizer state the leaf is a Variable, not an array.
        scale = jnp.asarray(self.loss_scale)
        return _multiply(outputs, *_split(lax.bitcast_convert_type(scale, jnp.int32)))

    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` where ``finite``, else ``old``: pytrees of the same structure, selected
        leaf by leaf (module-level :func:`where_finite`; traceable, no host sync).

        Example:
            >>> import jax.numpy as jnp, unifiedamp as ua
            >>> s = ua.GradScaler(backend="jax")
            >>> s.where_finite(jnp.array(False), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})["w"]
            Array([0., 0.], dtype=float32)
        """
        return where_finite(finite, new, old)

    def unscale(self, grads: Any, axis_name: Any = None) -> tuple[Any, jax.Array]:
        """Divides every leaf by the scale; returns ``(grads, all finite)`` in one pass.

        Each leaf is multiplied by ``f32(1 / scale)`` (the float64 reciprocal rounded
        once, like torch, NumPy and MLX), giving their bits at every scale wherever
        the result is a normal number, zero, inf or NaN; a result below 2**-126 is
        flushed to zero, as XLA does for every float32 op. ``all finite`` is
        decided on the gradients as given (scaled), like every backend, and is
        false at a scale whose reciprocal overflows (``spec.unscale_overflows``);
        with ``axis_name`` it is agreed across that mapped axis.

        Example:
            >>> import jax.numpy as jnp
            >>> grads, finite = JaxGradScaler(2.0**127).unscale(jnp.float32(1.7e8))
            >>> grads, bool(finite)
            (Array(9.991702e-31, dtype=float32), True)
        """
        if not self._config.enabled:
            return grads, jnp.array(True)
        finite = all_finite(grads, axis_name) & self._reciprocal_finite()
        return _multiply(grads, *_split(_reciprocal_bits(jnp.asarray(self.loss_scale)))), finite

    def _reciprocal_finite(self) -> jax.Array:
        # spec.unscale_overflows: below MIN_UNSCALABLE (a subnormal) 1/scale is inf, and
        # every check finds inf. Compared on bit patterns: XLA flushes subnormal operands.
        bits = lax.bitcast_convert_type(jnp.asarray(self.loss_scale), jnp.int32)
        return bits >= f32_bits(MIN_UNSCALABLE)

    def _traced(self, array: Any) -> bool:
        return isinstance(jnp.asarray(array), jax.core.Tracer)

    # ------------------------------------------------------------ tooling

    @classmethod
    def devices(cls) -> list[str]:
        """The devices JAX sees."""
        return [str(d) for d in jax.devices()]


# ---------------------------------------------------------------- optax


class LossScaledState(NamedTuple):
    """The state of :func:`loss_scaled`: the scaler (its scale scales the loss) and the
    inner transformation's state."""

    scaler: JaxGradScaler
    inner_state: Any


class LossScaledTransformation(NamedTuple):
    """An optax gradient transformation with Praxis's ``init_partition_spec``."""

    init: Callable[..., Any]
    update: Callable[..., Any]
    init_partition_spec: Callable[..., Any]


def loss_scaled(inner: Any, scaler: JaxGradScaler, *,
                axis_name: Any = None) -> LossScaledTransformation:
    """Wraps an optax transformation with dynamic loss scaling.

    ``update`` takes the gradients of the *scaled* loss, unscales them, checks
    them, and either applies ``inner`` or, if any was inf/NaN, returns zero
    updates and keeps ``inner``'s state as it was; then it updates the scaler.
    Read the scaler to scale the loss with :func:`find_scaler` (works through
    ``optax.chain`` and ``optax.MultiSteps``). For gradient accumulation, wrap
    ``optax.MultiSteps`` (``loss_scaled(optax.MultiSteps(inner, k), scaler)``): each
    micro-batch is checked and an inf is dropped before it reaches the accumulator,
    which optax (0.2.8) never clears of an inf once it holds one.

    Args:
        inner: Any optax ``GradientTransformation``.
        scaler: The initial :class:`JaxGradScaler`.
        axis_name: Inside ``shard_map``/``pmap``, the axis whose devices must agree.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> tx = loss_scaled(optax.sgd(0.1), JaxGradScaler(8.0, growth_interval=1))
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> scaled = {"w": jnp.array([8.0, jnp.inf])}          # gradients of scale(loss)
        >>> updates, state = tx.update(scaled, state, params)
        >>> updates["w"], find_scaler(state).get_scale()
        (Array([0., 0.], dtype=float32), 4.0)
    """

    optax = _import_optax("loss_scaled")

    # optax's own adapter: passes extra args to transformations that take them.
    inner_tx = optax.with_extra_args_support(inner)

    def init(params: Any) -> LossScaledState:
        return LossScaledState(scaler, inner_tx.init(params))

    def update(updates: Any, state: LossScaledState, params: Any = None,
               **extra_args: Any) -> tuple[Any, LossScaledState]:
        scaler = state.scaler
        finite = (all_finite(updates, axis_name) & scaler._reciprocal_finite()
                  if scaler.is_enabled() else jnp.array(True))

        def apply() -> tuple[Any, Any]:
            # Unscaling inside the branch lets XLA fuse it into the inner update.
            grads = scaler.unscale(updates)[0]
            return inner_tx.update(grads, state.inner_state, params, **extra_args)

        def skip() -> tuple[Any, Any]:
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(apply)[0])
            return zeros, state.inner_state

        new_updates, new_inner = _cond_varying(finite, apply, skip)
        return new_updates, LossScaledState(scaler.update(finite), new_inner)

    def init_partition_spec(params_spec: Any) -> LossScaledState:
        if not hasattr(inner, "init_partition_spec"):
            raise TypeError("init_partition_spec needs an inner transformation that has one "
                            "(a Praxis ShardedGradientTransformation)")
        replicated = jax.tree.map(lambda _: jax.sharding.PartitionSpec(), scaler)
        return LossScaledState(replicated, inner.init_partition_spec(params_spec))

    return LossScaledTransformation(init, update, init_partition_spec)


class LossScaledAccumulateState(NamedTuple):
    """The state of :func:`loss_scaled_accumulate`.

    Attributes:
        scaler: The scaler (read it with :func:`find_scaler` to scale each micro-batch's
            loss); updated once per window.
        mini_step: The micro-batches summed so far in this window, an int32 0-d array
            (0 to ``every_k - 1``).
        acc_grads: The running sum of this window's *scaled* gradients, the parameters'
            structure and dtypes.
        inner_state: The inner transformation's state.
    """

    scaler: JaxGradScaler
    mini_step: Any
    acc_grads: Any
    inner_state: Any


def loss_scaled_accumulate(inner: Any, scaler: JaxGradScaler, every_k: int, *,
                           axis_name: Any = None) -> Any:
    """Gradient accumulation with dynamic loss scaling, step for step as torch does it.

    torch's recipe calls ``scaler.scale(loss / k).backward()`` on every micro-batch
    (the scaled gradients add up in ``.grad``) and, once every ``k`` micro-batches,
    ``scaler.step(optimizer)`` (unscale the sum; skip the whole window if it holds an
    inf/NaN) and ``scaler.update()``. This transformation does the same: each
    ``update`` adds the gradients of the scaled loss to a running sum and returns
    zero updates; every ``every_k``-th call unscales the sum, applies ``inner`` to it
    or, if it is not finite, returns zero updates and keeps ``inner``'s state, then
    updates the scaler exactly once and clears the sum. The scale therefore grows
    and backs off per optimizer step, as in torch, not per micro-batch as with
    ``loss_scaled(optax.MultiSteps(inner, k), scaler)``, which drops a bad micro-batch
    and steps on the others.

    The sum is a sum, as in torch: divide each micro-batch's loss by ``every_k``
    for the mean (``optax.MultiSteps`` averages instead). Checked and unscaled once
    per window with the scaler's ``unscale``, so a scale whose reciprocal overflows
    counts as inf, as the spec says. Pure and jit-safe: two ``lax.cond``, no host
    transfer; the scaler is in the state, where :func:`find_scaler` finds it.

    Args:
        inner: Any optax ``GradientTransformation``; it sees the unscaled sum.
        scaler: The initial :class:`JaxGradScaler`.
        every_k: Micro-batches per optimizer step, an int >= 1.
        axis_name: Inside ``shard_map``/``pmap``, the axis whose devices must agree.

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is a
        :class:`LossScaledAccumulateState`.

    Raises:
        TypeError: ``every_k`` is not an int.
        ValueError: ``every_k`` is below 1.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = loss_scaled_accumulate(optax.sgd(0.1), JaxGradScaler(8.0, growth_interval=1),
        ...                             every_k=2)
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> for scaled in ([8.0, 16.0], [8.0, 0.0], [8.0, jnp.inf], [8.0, 0.0]):
        ...     updates, state = tx.update({"w": jnp.array(scaled)}, state, params)
        ...     print(updates["w"], find_scaler(state).get_scale())
        [0. 0.] 8.0
        [-0.2 -0.2] 16.0
        [0. 0.] 16.0
        [0. 0.] 8.0
    """
    if not isinstance(every_k, (int, numbers.Integral)) or isinstance(every_k, bool):
        raise TypeError(f"every_k must be an int >= 1 (micro-batches per optimizer step), "
                        f"got {every_k!r} of type {type(every_k).__name__}")
    if every_k < 1:
        raise ValueError(f"every_k must be an int >= 1 (micro-batches per optimizer step), "
                         f"got {every_k}; use 1 for no accumulation")
    optax = _import_optax("loss_scaled_accumulate")

    inner_tx = optax.with_extra_args_support(inner)

    def init(params: Any) -> LossScaledAccumulateState:
        return LossScaledAccumulateState(scaler, jnp.zeros((), jnp.int32),
                                         jax.tree.map(jnp.zeros_like, params),
                                         inner_tx.init(params))

    def update(updates: Any, state: LossScaledAccumulateState, params: Any = None,
               **extra_args: Any) -> tuple[Any, LossScaledAccumulateState]:
        acc = jax.tree.map(lambda a, g: (a + g).astype(a.dtype), state.acc_grads, updates)

        def apply(grads: Any) -> tuple[Any, Any]:
            return inner_tx.update(grads, state.inner_state, params, **extra_args)

        out_shape = jax.eval_shape(apply, acc)

        def zeros() -> Any:
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape[0])

        def step(_: Any) -> tuple[Any, ...]:
            grads, finite = state.scaler.unscale(acc, axis_name)
            new_updates, new_inner = _cond_varying(
                finite, lambda: apply(grads), lambda: (zeros(), state.inner_state))
            cleared = jax.tree.map(jnp.zeros_like, acc)
            return (new_updates, new_inner, state.scaler.update(finite), cleared,
                    jnp.zeros((), jnp.int32))

        def accumulate(_: Any) -> tuple[Any, ...]:
            return zeros(), state.inner_state, state.scaler, acc, state.mini_step + 1

        new_updates, new_inner, new_scaler, new_acc, mini_step = _cond_varying(
            state.mini_step >= every_k - 1, lambda: step(None), lambda: accumulate(None))
        return new_updates, LossScaledAccumulateState(new_scaler, mini_step, new_acc,
                                                      new_inner)

    return optax.GradientTransformationExtraArgs(init, update)


def _import_optax(caller: str) -> Any:
    # optax is the jax extra's, not jax's: the scaler works without it, these wrappers not.
    try:
        import optax
    except ImportError as exc:
        raise MissingBackendError(
            f"{caller} needs optax, which cannot be imported ({exc}); install it with: "
            "pip install 'unifiedamp[jax]'") from exc
    return optax


def _cond_varying(pred: jax.Array, true_fn: Callable[[], Any],
                  false_fn: Callable[[], Any]) -> Any:
    """``lax.cond(pred, true_fn, false_fn)`` whose branches may vary over different
    manual axes inside a ``shard_map``: both are typed as varying over their union
    (a no-op outside ``shard_map``).

    A default ``shard_map`` checks varying manual axes: gradients that vary over an
    axis make the step's outputs vary, while a skip branch's zeros and the incoming
    state may not, and ``lax.cond`` needs equal types in both branches."""
    varying = jax.tree.map(lambda a, b: _varying_axes(a) | _varying_axes(b),
                           jax.eval_shape(true_fn), jax.eval_shape(false_fn))

    def cast(branch: Callable[[], Any]) -> Callable[[Any], Any]:
        return lambda _: jax.tree.map(_cast_varying, branch(), varying)

    return lax.cond(pred, cast(true_fn), cast(false_fn), None)


def _varying_axes(x: Any) -> frozenset[Any]:
    """The manual mesh axes ``x`` (an array or ShapeDtypeStruct) varies over inside a
    ``shard_map``; empty elsewhere."""
    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # jax 0.10; earlier ones call it vma
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()) or ())


def _cast_varying(x: Any, axes: frozenset[Any]) -> Any:
    """``x`` typed as varying over ``axes`` (a type cast, no data moves)."""
    missing = tuple(a for a in axes if a not in _varying_axes(x))
    if not missing:
        return x
    if hasattr(lax, "pcast"):
        return lax.pcast(x, missing, to="varying")
    return lax.pvary(x, missing)  # type: ignore[attr-defined]  # jax < 0.9 (pragma: no cover)


def find_scaler(opt_state: Any) -> JaxGradScaler:
    """The scaler inside an optimizer state (also within chain, MultiSteps, flax nnx).

    Raises:
        ValueError: There is none (the transformation was not built with :func:`loss_scaled`).
    """
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(
        x, JaxGradScaler)) if isinstance(x, JaxGradScaler)]
    if not found:
        raise ValueError("no JaxGradScaler in this optimizer state: build the optimizer with "
                         "unifiedamp.backends.jax.loss_scaled(inner, scaler) or "
                         "loss_scaled_accumulate(inner, scaler, every_k)")
    return found[0]


def replace_scaler(opt_state: Any, scaler: JaxGradScaler) -> Any:
    """The optimizer state with its scaler replaced (within chain, MultiSteps...), e.g. by
    one restored from a checkpoint: ``opt_state = replace_scaler(opt_state, restored)``.

    Raises:
        ValueError: There is no scaler to replace (see :func:`find_scaler`).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = optax.chain(optax.clip(1.0), loss_scaled(optax.sgd(0.1), JaxGradScaler()))
        >>> state = tx.init({"w": jnp.ones(2)})
        >>> restored = JaxGradScaler().restore(JaxGradScaler(8.0).state_dict())
        >>> find_scaler(replace_scaler(state, restored)).get_scale()
        8.0
    """
    find_scaler(opt_state)  # the same error when there is none
    is_scaler = lambda x: isinstance(x, JaxGradScaler)  # noqa: E731
    return jax.tree.map(lambda x: scaler if is_scaler(x) else x, opt_state, is_leaf=is_scaler)


# ---------------------------------------------------------------- diagnostics


def overflow_counts(grads: Any, when: Any = None) -> Any:
    """Per-gradient inf/NaN counts, traceable: the gradients' tree with a :class:`LeafCounts`
    ``(inf, nan, max_finite, shape)`` of arrays where each gradient was.

    ``inf`` and ``nan`` are int32 0-d counts (exact up to 2**31 - 1 elements a leaf),
    ``max_finite`` the float32 largest finite magnitude, ``shape`` the gradient's shape as
    an int32 array (a constant). Return the tree from the jitted step and read it outside
    with :func:`overflow_report`, which names the leaves by key path.

    Cost: one pass over each gradient (a variadic reduce XLA fuses with its inputs;
    leaves that are not floats count nothing): measured 2.3 ms on 9.4M float32 in 4 leaves
    (1.9 ms in float16) on a shared 2-core CPU (jax 0.10.2), where :func:`all_finite`
    took 6.2 ms. To pay it only on skipped steps, pass ``when=~finite``: the counts are
    then computed under a ``lax.cond`` (zeros, with the shapes, where ``when`` is false:
    0.2 ms there), i.e. ``lax.cond(~finite, lambda: overflow_counts(grads), lambda:
    <zeros>)``. On a GPU, XLA may read a ``lax.cond``'s predicate on the host (see
    ``docs/backends/jax.md``): there counting on every step may be the cheaper form.

    Args:
        grads: A tree of gradient arrays (dicts, lists, Flax NNX state, optax trees...).
        when: None (always count), or a Python bool / 0-d bool array: count where true.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from unifiedamp.backends.jax import JaxGradScaler, overflow_counts, overflow_report
        >>> def loss_fn(p, x):                 # float16 compute, float32 parameters
        ...     h = x.astype(jnp.float16) @ p["dense1"]["kernel"].astype(jnp.float16)
        ...     return jnp.sum(h @ p["dense2"]["kernel"].astype(jnp.float16)).astype(jnp.float32)
        >>> @jax.jit
        ... def step(params, scaler, x):
        ...     def scaled(p):                 # the unscaled loss as aux, for the report
        ...         loss = loss_fn(p, x)
        ...         return scaler.scale(loss), loss
        ...     (_, loss), grads = jax.value_and_grad(scaled, has_aux=True)(params)
        ...     grads, finite = scaler.unscale(grads)
        ...     counts = overflow_counts(grads, when=~finite)    # a lax.cond: free when finite
        ...     return scaler.update(finite), counts, loss, scaler.loss_scale
        >>> params = {"dense1": {"kernel": jnp.ones((2, 3))}, "dense2": {"kernel": jnp.ones(3)}}
        >>> scaler = JaxGradScaler(2.0**15)
        >>> scaler, counts, loss, scale = step(params, scaler, jnp.array([[1.0, 2.0]]))
        >>> print(overflow_report(counts, step=1, scale=scale, loss=loss))
        Step 1 was skipped at scale 32768: 2 of 2 gradients held inf/NaN.
          dense1.kernel (2, 3): 3 inf, 0 NaN, largest finite |g| 1
          dense2.kernel (3,): 3 inf, 0 NaN, largest finite |g| 0
        The loss was finite before scaling: the scaled gradients overflowed float16 and
        the scaler backs off, as designed.
    """
    def count() -> Any:
        return jax.tree.map(lambda g: _functional.leaf_counts(JaxGradScaler, jnp.asarray(g)),
                            grads)

    if when is None:
        return count()

    def zeros() -> Any:
        return jax.tree.map(lambda g: LeafCounts(
            jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32),
            jnp.asarray(jnp.shape(g), jnp.int32)), grads)

    if isinstance(when, bool):
        return count() if when else zeros()
    dtype = getattr(when, "dtype", None)
    if dtype is None or jnp.dtype(dtype) != jnp.bool_ or jnp.shape(when) != ():
        raise TypeError(f"overflow_counts(grads, when=...) takes None, a bool or a 0-d bool "
                        f"array (e.g. ~finite), got {when!r}")
    return _cond_varying(when, count, zeros)


def _path_name(path: Any) -> str:
    """A key path as a dotted name: ``params.dense1.kernel``, ``layers.0.bias``. A Flax NNX
    Variable's ``.value`` at the end is left out (``dense1.kernel``, not
    ``dense1.kernel.value``)."""
    keys = list(path)
    if keys and isinstance(keys[-1], jax.tree_util.GetAttrKey) and keys[-1].name == "value":
        keys.pop()
    parts = []
    for key in keys:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            parts.append(str(key.key))
        else:
            parts.append(str(key))
    return ".".join(parts) or "grads"


def overflow_report(counts: Any, *, step: Any = None, scale: Any = None, loss: Any = None,
                    history: Any = None) -> diagnostics.OverflowReport | None:
    """The :class:`~unifiedamp.diagnostics.OverflowReport` of :func:`overflow_counts`'s tree,
    outside ``jit`` (it reads the device once); None when no gradient held inf/NaN.

    Gradients are named by key path, dotted (``params.dense1.kernel``, ``layers.0.bias``;
    a Flax NNX state's ``.value`` left out), in tree order; ``checked`` is the number of
    leaves.

    Args:
        counts: What :func:`overflow_counts` returned from the step.
        step: The update's number (from 1). Default: the last record of ``history``, else 0
            (unknown).
        scale: The scale the loss was multiplied by (the scaler's before ``update``):
            return ``scaler.loss_scale`` from the step, or pass ``history``. Default: the
            last record of ``history``, else NaN (unknown).
        loss: The unscaled loss (an array or a number) returned from the step, or a bool
            (``jnp.isfinite(loss)``): sets ``loss_finite``; None leaves it unknown.
        history: A :func:`history_init` ring that recorded this step last (see above).

    Example:
        >>> import jax.numpy as jnp
        >>> grads = {"b": jnp.zeros(2), "w": jnp.array([[1.0, -jnp.inf], [jnp.nan, -4.0]])}
        >>> report = overflow_report(overflow_counts(grads), step=3, scale=1024.0, loss=2.5)
        >>> report.names, report.overflows[0], report.checked, report.loss_finite
        (['w'], GradientOverflow('w', shape=(2, 2), inf=1, nan=1, max_finite=4.0), 2, True)
        >>> overflow_report(overflow_counts({"w": jnp.ones(3)})) is None
        True
    """
    pairs = jax.tree_util.tree_flatten_with_path(
        counts, is_leaf=lambda x: isinstance(x, LeafCounts))[0]
    named = [(_path_name(path), record) for path, record in pairs]
    if loss is not None and not isinstance(loss, bool):
        loss = jnp.asarray(loss)
    return _functional.build_report(named, jax.device_get, step=step, scale=scale,
                                    loss_finite=_functional.loss_is_finite(jnp, loss),
                                    history=history)


def history_init(size: int) -> dict[str, jax.Array]:
    """An empty ring of the last ``size`` updates, to keep in the train state: a dict of
    ``iteration`` (int32), ``scale`` (float32), ``skipped`` (bool), each ``(size,)``, and
    ``count`` (int32 0-d, records written). A pytree of its own buffers: donate it.

    Raises:
        TypeError: ``size`` is not an int (a bool neither).
        ValueError: ``size`` is below 1.

    Example:
        >>> sorted((k, v.shape, str(v.dtype)) for k, v in history_init(4).items())
        [('count', (), 'int32'), ('iteration', (4,), 'int32'), ('scale', (4,), 'float32'),
         ('skipped', (4,), 'bool')]
    """
    return _functional.history_init(JaxGradScaler, size)


def _set_slot(ring: jax.Array, slot: jax.Array, value: jax.Array) -> jax.Array:
    return lax.dynamic_update_index_in_dim(ring, jnp.asarray(value, ring.dtype), slot, 0)


def history_record(history: dict[str, jax.Array], scaler: JaxGradScaler,
                   finite: Any) -> dict[str, jax.Array]:
    """``history`` with this update recorded, traceable (a ``dynamic_update_slice`` per
    array, no host transfer): iteration ``count + 1``, the scale of ``scaler`` *before*
    ``scaler.update(finite)`` (the scale this step's loss was multiplied by; 1.0 when
    disabled) and whether the step was skipped (``not finite``), in slot ``count % size``.

    Call it with the scaler the step started with, next to ``update``::

        history = history_record(history, scaler, finite)
        scaler = scaler.update(finite)

    Example:
        >>> import jax, unifiedamp as ua
        >>> @jax.jit
        ... def step(scaler, history, finite):
        ...     return scaler.update(finite), history_record(history, scaler, finite)
        >>> scaler, history = ua.GradScaler(8.0, growth_interval=1, backend="jax"), history_init(2)
        >>> for finite in [True, False, True]:
        ...     scaler, history = step(scaler, history, finite)
        >>> scale_history(history).as_list()     # the last 2 of 3: iterations 2 and 3
        [(2, 16.0, True), (3, 8.0, False)]
    """
    return _functional.history_record(JaxGradScaler, _set_slot, history, scaler, finite)


def scale_history(history: dict[str, jax.Array]) -> diagnostics.ScaleHistory:
    """The ring as a :class:`~unifiedamp.diagnostics.ScaleHistory`, oldest record first
    (reads the device: call it outside ``jit``, when you log or plot).

    Example:
        >>> scale_history(history_init(3)).as_list()
        []
    """
    return _functional.scale_history(jax.device_get, history)


def collapse_message(scaler: JaxGradScaler, report: diagnostics.OverflowReport | None = None,
                     *, step: Any = None, max_consecutive_skips: int | None = 100) -> str | None:
    """The collapse warning's text for this scaler, or None: the imperative backends'
    message (same rule, same words), read from ``consecutive_skips`` and the scale.

    A collapse is ``max_consecutive_skips`` skipped steps in a row (None: not checked) or a
    scale below float32's smallest normal number. ``report`` (:func:`overflow_report` of
    the last skipped step) ends the message with ``"Last overflow: "``, its summary and
    whether the loss itself was inf/NaN (then the fixes: lower learning rate, bfloat16,
    clipping). ``step`` names the step (default ``report.step``). Reads the device: call it
    outside ``jit``, e.g. where you log. :func:`check_collapse` warns with it.

    Example:
        >>> scaler = JaxGradScaler(8.0).update(False).update(False)
        >>> print(collapse_message(scaler, step=2, max_consecutive_skips=2))
        Loss scale collapsed at step 2: scale 2.0 (0x40000000); the gradients were inf/NaN at
        each of the last 2 steps, ...
        >>> collapse_message(scaler.update(True), max_consecutive_skips=2) is None
        True
    """
    return _functional.collapse_message(JaxGradScaler, scaler, report, step=step,
                                        max_consecutive_skips=max_consecutive_skips)


def check_collapse(scaler: JaxGradScaler, report: diagnostics.OverflowReport | None = None,
                   *, step: Any = None, max_consecutive_skips: int | None = 100,
                   on_collapse: str = "warn") -> str | None:
    """Warns :class:`unifiedamp.ScaleCollapseWarning` (or raises
    :class:`unifiedamp.ScaleCollapseError` with ``on_collapse="raise"``) with
    :func:`collapse_message` when the scale collapsed; returns the message, or None.

    Stateless: it warns at every call that finds a collapse, so call it where you log
    (every N steps), with the scaler the step returned.

    Example:
        >>> import warnings
        >>> scaler = JaxGradScaler(8.0).update(False).update(False)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = check_collapse(scaler, max_consecutive_skips=2)
        >>> caught[0].category.__name__, str(caught[0].message)[:22]
        ('ScaleCollapseWarning', 'Loss scale collapsed: ')
    """
    return _functional.check_collapse(JaxGradScaler, scaler, report, step=step,
                                      max_consecutive_skips=max_consecutive_skips,
                                      on_collapse=on_collapse, stacklevel=3)
