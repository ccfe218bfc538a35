"""Float32 arithmetic on int32 bit patterns, exact where a framework flushes subnormals.

XLA (JAX, and Keras on JAX) and TensorFlow flush float32 subnormals to zero, as inputs and as
results. The scale's update, ``f32(scale * factor)``, and its reciprocal, ``f32(1 / scale)``
(the float64 reciprocal rounded once, what torch, NumPy and MLX unscale with), are therefore
computed on the scale's bit pattern, with integer ops and float ops whose operands and results
are all normal numbers: they give IEEE's bits (NumPy's) at every float32 value, subnormals
included. Multiplying a tensor by a scale is split the same way (:meth:`Float32Bits.split`).

The algorithms are written once, against an array namespace (:class:`Float32Bits` takes it and
the conversions it lacks), and stay exact under every compiler they run under:

- Products are exact through integer arithmetic on 12-bit halves of the significands
  (:meth:`Float32Bits.product_error`), not through Dekker's float product: TensorFlow's graph
  optimizer (``tf.function`` without XLA) reassociates float sums, which breaks the float
  form, while integer sums are exact in any order.
- ``1 / m`` is corrected to the correctly rounded reciprocal by testing its neighbours with
  that exact product: TensorFlow's graph optimizer turns a division into an approximate
  reciprocal (up to 3 ulps off).

:meth:`Float32Bits.for_jax` and :meth:`Float32Bits.for_keras` build the two namespaces the
backends use; each imports its framework when called, never when this module is imported.

Example:
    >>> import numpy as np
    >>> from unifiedamp.spec import f32_bits, f32_from_bits
    >>> f = Float32Bits.for_jax()                   # or Float32Bits.for_keras()
    >>> scale = f.bits(np.float32(2.0**-140))       # int32 bits: the scale as the rule holds it
    >>> f32_from_bits(int(f.mul_bits_by(scale, 0.7)))  # f32(scale * 0.7), a subnormal
    5.016648502282845e-43
    >>> f32_from_bits(int(f.reciprocal_bits(f.bits(np.float32(2.0**127)))))
    5.877471754111438e-39
    >>> hi, lo = f.split(scale)                     # two normal factors: x * hi * lo
    >>> float(hi) * float(lo) == 2.0**-140, float(lo) == 2.0**-64
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["EXP_MASK", "MIN_NORMAL_BITS", "Float32Bits", "factor_parts", "reciprocal_factors"]

#: The exponent bits of a float32: all set for inf and NaN.
EXP_MASK = 0x7F800000
#: The bits of 2**-126, float32's smallest normal number.
MIN_NORMAL_BITS = 0x00800000


def factor_parts(c: float) -> tuple[float, int]:
    """``(cn, ec)`` with ``c == cn * 2**ec`` and ``cn`` in [1, 2), for a positive float32
    ``c`` known on the host (exact, subnormals included): the form :meth:`Float32Bits.mul_bits`
    takes.

    Example:
        >>> factor_parts(0.75), factor_parts(2.0**-149)
        ((1.5, -1), (1.0, -149))
    """
    mantissa, exponent = math.frexp(c)
    return mantissa * 2, exponent - 1


def reciprocal_factors(scale: float) -> tuple[float, float]:
    """``split(reciprocal_bits(bits))`` of the float32 ``scale`` computed on the host: the
    two normal factors of ``f32(1 / scale)`` (:meth:`Float32Bits.split`), for a scaler that
    keeps them while the scale stays.

    Example:
        >>> reciprocal_factors(1024.0), reciprocal_factors(0.0)
        ((0.0009765625, 1.0), (inf, 1.0))
        >>> hi, lo = reciprocal_factors(2.0**127)        # 1 / scale is subnormal: 2**-127
        >>> hi * lo == 2.0**-127, lo == 2.0**-64
        (True, True)
    """
    from unifiedamp.spec import f32, f32_bits

    # Python's division is float64's, correctly rounded; f32 rounds it once more.
    reciprocal = math.inf if scale == 0 else f32(1.0 / scale)
    bits = f32_bits(reciprocal)
    if bits < MIN_NORMAL_BITS:
        return bits * 2.0**-85, 2.0**-64
    return reciprocal, 1.0


@dataclass(frozen=True)
class Float32Bits:
    """Float32 arithmetic on int32 bit patterns, over one array namespace.

    Every method takes and returns arrays of the namespace (scalars or any shape,
    elementwise), traceable: no host read, no Python branch on a value. Bit patterns are
    int32 arrays of non-negative float32 values.
    """

    #: The namespace: ``where``, ``equal``, ``not_equal``, ``greater``, ``logical_and``,
    #: ``logical_or``, ``bitwise_and``, ``bitwise_or``, ``right_shift``, ``left_shift``,
    #: ``floor``, ``clip``, ``absolute``, ``expand_dims``, ``min`` and ``sum`` (with ``axis``;
    #: ``min`` with ``keepdims``), NumPy's meaning (``jax.numpy``, ``keras.ops``).
    xp: Any
    #: A float32 array (or a number) -> its int32 bit patterns.
    bits: Callable[[Any], Any]
    #: int32 bit patterns -> the float32 array.
    from_bits: Callable[[Any], Any]
    #: A number or an array -> an int32 array (a cast; an integral float stays exact).
    int32: Callable[[Any], Any]
    #: A number or an array -> a float32 array (a cast).
    float32: Callable[[Any], Any]
    #: An array -> the same values, with no gradient through them.
    stop_gradient: Callable[[Any], Any]
    #: Whether :meth:`reciprocal_of_mantissa` tests its candidates one after the other in
    #: elementwise ops (one fused kernel under XLA) rather than along a new axis with
    #: reductions (a ninth of the ops in a TensorFlow graph). The same result either way.
    elementwise: bool = False

    @classmethod
    def for_jax(cls) -> Float32Bits:
        """The namespace of ``jax.numpy`` (bit casts with ``lax.bitcast_convert_type``)."""
        import jax.numpy as jnp
        from jax import lax

        return cls(jnp,
                   bits=lambda x: lax.bitcast_convert_type(jnp.asarray(x, jnp.float32),
                                                           jnp.int32),
                   from_bits=lambda b: lax.bitcast_convert_type(jnp.asarray(b, jnp.int32),
                                                                jnp.float32),
                   int32=lambda v: jnp.asarray(v, jnp.int32),
                   float32=lambda v: jnp.asarray(v, jnp.float32),
                   stop_gradient=lax.stop_gradient, elementwise=True)

    @classmethod
    def for_keras(cls) -> Float32Bits:
        """The namespace of ``keras.ops``, for every Keras backend (bit casts with
        ``ops.view``)."""
        from keras import ops

        return cls(ops,
                   bits=lambda x: ops.view(ops.cast(x, "float32"), "int32"),
                   from_bits=lambda b: ops.view(ops.cast(b, "int32"), "float32"),
                   int32=lambda v: ops.cast(v, "int32"),
                   float32=lambda v: ops.cast(v, "float32"),
                   stop_gradient=ops.stop_gradient)

    # ------------------------------------------------------------ building blocks

    def mantissa(self, x: Any) -> Any:
        """The 24-bit significand of a normal float32, as an int32."""
        xp = self.xp
        return xp.bitwise_or(xp.bitwise_and(self.bits(x), self.int32(0x7FFFFF)),
                             self.int32(0x800000))

    def product_error(self, a: Any, b: Any, p: Any) -> Any:
        """``a * b - p`` exactly, in units of 2**-46, as an int32: for ``a``, ``b`` in [1, 2)
        and ``p`` in [1, 4) within half an ulp of ``a * b`` (so the result fits in 24 bits).

        Integer arithmetic on 12-bit halves of the significands: integer sums are exact in
        any order, so no compiler's reassociation changes the result.
        """
        xp = self.xp
        x, c = self.mantissa(a), self.mantissa(b)
        xh, xl = xp.right_shift(x, 12), xp.bitwise_and(x, self.int32(0xFFF))
        ch, cl = xp.right_shift(c, 12), xp.bitwise_and(c, self.int32(0xFFF))
        # p = pm * 2**(pe - 23); in units of 2**-46 it is pm << (23 + pe) = hh * 2**24 + hl.
        pe = xp.right_shift(self.bits(p), 23) - 127
        pm = self.mantissa(p)
        hh = xp.right_shift(pm, 1 - pe)
        hl = xp.where(xp.equal(pe, 0), xp.left_shift(xp.bitwise_and(pm, self.int32(1)), 23),
                      self.int32(0))
        mid = xh * cl + xl * ch  # < 2**25
        high = xh * ch - hh + xp.right_shift(mid, 12)
        low = xp.left_shift(xp.bitwise_and(mid, self.int32(0xFFF)), 12) + xl * cl - hl
        return high * (1 << 24) + low

    def round_half_even(self, v: Any, below: Any) -> Any:
        """``v`` rounded to an int32, ties to even, where ``v`` is a rounded value and
        ``below`` (any sign-carrying number) the remainder it dropped: a tie goes up when it
        is > 0."""
        xp = self.xp
        floor = xp.floor(v)
        frac = v - floor
        odd = xp.not_equal(xp.floor(floor * 0.5) * 2.0, floor)
        tie_up = xp.logical_or(xp.greater(below, 0),
                               xp.logical_and(xp.equal(below, 0), odd))
        up = xp.logical_or(frac > 0.5, xp.logical_and(xp.equal(frac, 0.5), tie_up))
        return self.int32(floor) + self.int32(up)

    def normalised(self, bits: Any) -> tuple[Any, Any]:
        """``(xn, ex)`` with the non-zero float32 of ``bits`` equal to ``xn * 2**ex``, ``xn``
        in [1, 2) a normal float32 and ``ex`` an int32, subnormals included (their
        mantissa, an int below 2**23, converts to float32 exactly and carries its own
        exponent)."""
        xp = self.xp
        ebits = xp.bitwise_and(xp.right_shift(bits, 23), self.int32(0xFF))
        mant = xp.bitwise_and(bits, self.int32(0x7FFFFF))
        subnormal = xp.equal(ebits, 0)
        as_float = self.bits(self.float32(mant))
        frac = xp.where(subnormal, xp.bitwise_and(as_float, self.int32(0x7FFFFF)), mant)
        ex = xp.where(subnormal, xp.right_shift(as_float, 23) - 127 - 149, ebits - 127)
        return self.from_bits(xp.bitwise_or(self.int32(127 << 23), frac)), ex

    def reciprocal_of_mantissa(self, m: Any) -> tuple[Any, Any]:
        """``(r, m * 2r - 2)``: ``r = f32(1 / m)`` for a float32 ``m`` in [1, 2), correctly
        rounded, in (0.5, 1], and its exact error, an int32 in units of 2**-46
        (:meth:`product_error`). ``r`` is, of ``1 / m`` and its four neighbours on each side,
        the one with the smallest exact ``|m * r - 1|`` (the division may be an approximate
        reciprocal, see the module); of two as close, the smaller."""
        if self.elementwise:
            return self._reciprocal_of_mantissa_elementwise(m)
        xp = self.xp
        # The nine candidates along a new last axis, tested at once: one product per
        # candidate in a single set of ops (a graph a ninth the size of a loop's).
        m9 = xp.expand_dims(m, -1)
        r = self.from_bits(xp.expand_dims(self.bits(1.0 / m), -1)
                           + self.int32(list(range(-4, 5))))
        # 2 * r is in [1, 2) for r in [0.5, 1): m * (2 * r) - 2 exactly, as an int.
        error = self.product_error(m9, r * 2.0, self.float32(2.0))
        err = xp.absolute(error)
        # Of the closest, the smallest (the first in the candidates' increasing order).
        closest = xp.equal(err, xp.min(err, axis=-1, keepdims=True))
        best_r = xp.min(xp.where(closest, r, self.float32(2.0)), axis=-1)
        # The candidates are distinct: one of them is best_r, its error the only one summed.
        best_error = xp.sum(xp.where(xp.equal(r, xp.expand_dims(best_r, -1)), error,
                                     self.int32(0)), axis=-1)
        # m == 1: r == 1 exactly (its neighbours above break product_error's bounds).
        one = xp.equal(m, 1.0)
        return (xp.where(one, self.float32(1.0), best_r),
                xp.where(one, self.int32(0), best_error))

    def _reciprocal_of_mantissa_elementwise(self, m: Any) -> tuple[Any, Any]:
        # The same choice as the vectorised form, candidate after candidate in increasing
        # order, keeping the first of the closest: elementwise ops only, which a compiler
        # fuses into one kernel (XLA makes a kernel of each reduction of the other form).
        xp = self.xp
        first = self.bits(1.0 / m)
        best_r = best_error = best_abs = None
        for k in range(-4, 5):
            r = self.from_bits(first + k)
            error = self.product_error(m, r * 2.0, self.float32(2.0))
            err = xp.absolute(error)
            if best_r is None:
                best_r, best_error, best_abs = r, error, err
                continue
            closer = err < best_abs
            best_r = xp.where(closer, r, best_r)
            best_error = xp.where(closer, error, best_error)
            best_abs = xp.where(closer, err, best_abs)
        one = xp.equal(m, 1.0)
        return (xp.where(one, self.float32(1.0), best_r),
                xp.where(one, self.int32(0), best_error))

    # ------------------------------------------------------------ what the backends use

    def is_finite(self, bits: Any) -> Any:
        """Whether the float32 of ``bits`` is finite (not inf or NaN)."""
        xp = self.xp
        return xp.not_equal(xp.bitwise_and(bits, self.int32(EXP_MASK)), EXP_MASK)

    def mul_bits(self, bits: Any, cn: Any, ec: Any) -> Any:
        """The bits of ``f32(x * c)``, rounded to nearest even, subnormals included, for the
        non-negative float32 ``x`` of ``bits`` and a positive float32 ``c = cn * 2**ec``:
        ``cn`` a float32 in [1, 2) and ``ec`` an int32, arrays (read from a variable) or
        numbers (:func:`factor_parts`, :meth:`mul_bits_by`).

        ``xn * cn`` (``x`` normalised) is computed exactly as ``hi`` plus an integer
        remainder, then either reassembled with the exponent (a normal result) or rounded
        once to a multiple of 2**-149 (a subnormal result).
        """
        xp = self.xp
        xn, ex = self.normalised(bits)
        hi = xn * cn
        lo = self.product_error(xn, cn, hi)
        hbits = self.bits(hi)
        e_res = xp.bitwise_and(xp.right_shift(hbits, 23), self.int32(0xFF)) + ex + ec
        normal = xp.bitwise_or(xp.bitwise_and(hbits, self.int32(0x7FFFFF)),
                               xp.left_shift(e_res, 23))
        s = xp.clip(149 + ex + ec, -60, 30)  # below -60 the result rounds to 0 anyway
        two_s = self.from_bits(xp.left_shift(s + 127, 23))
        tiny = self.round_half_even(hi * two_s, lo)
        out = xp.where(e_res >= 255, self.int32(EXP_MASK), xp.where(e_res >= 1, normal, tiny))
        return xp.where(xp.equal(bits, 0), self.int32(0), out)

    def mul_bits_by(self, bits: Any, c: float) -> Any:
        """:meth:`mul_bits` by a positive float32 ``c`` known on the host."""
        cn, ec = factor_parts(c)
        return self.mul_bits(bits, self.float32(cn), ec)

    def reciprocal_bits(self, bits: Any) -> Any:
        """The bits of ``f32(1 / scale)`` (the float64 reciprocal rounded once) for the
        non-negative float32 scale of ``bits``, at every scale (inf for 0).

        ``1 / (m * 2**e)`` is ``(1 / m) * 2**-e``: an exponent shift of the correctly
        rounded ``1 / m``, or, where that is subnormal (scales above 2**126), ``1 / m``
        rounded again to a multiple of 2**-149, the sign of the exact ``1 - m * r``
        breaking a tie.
        """
        xp = self.xp
        m, e = self.normalised(bits)
        r, error = self.reciprocal_of_mantissa(m)
        rb = self.bits(r)
        e_res = xp.right_shift(rb, 23) - e  # biased exponent of the result
        normal = xp.bitwise_or(xp.bitwise_and(rb, self.int32(0x7FFFFF)), xp.left_shift(e_res, 23))
        s = xp.clip(149 - e, 0, 30)  # only used where the result is subnormal: e >= 126
        t = r * self.from_bits(xp.left_shift(s + 127, 23))
        tiny = self.round_half_even(t, -error)
        out = xp.where(e_res >= 255, self.int32(EXP_MASK), xp.where(e_res >= 1, normal, tiny))
        return xp.where(xp.equal(bits, 0), self.int32(EXP_MASK), out)

    def split(self, bits: Any) -> tuple[Any, Any]:
        """Two float32 arrays ``hi, lo`` whose product is exactly the non-negative float32 of
        ``bits``, both normal (or ``hi`` 0 or inf), with no gradient through them.

        ``(x * hi) * lo`` is then ``f32(x * value)`` for every ``x`` whose product is a
        normal number, zero, inf or NaN, where a subnormal ``value`` used directly is
        flushed (``x * value`` would be 0). A normal value gives ``lo = 1``: the common case
        stays one multiply. A subnormal value ``k * 2**-149`` gives ``hi = k * 2**-85`` (an
        exact int-to-float conversion, k < 2**23) and ``lo = 2**-64``: ``|x * hi|`` stays
        below 2**66 (no spurious inf), is rounded once to 24 bits, and the scaling by ``lo``
        is exact unless the result is subnormal.
        """
        xp = self.xp
        subnormal = bits < MIN_NORMAL_BITS
        hi = xp.where(subnormal, self.float32(bits) * self.float32(2.0**-85),
                      self.from_bits(bits))
        lo = xp.where(subnormal, self.float32(2.0**-64), self.float32(1.0))
        return self.stop_gradient(hi), self.stop_gradient(lo)
