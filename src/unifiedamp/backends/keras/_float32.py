"""Float32 arithmetic on int32 bit patterns, in ``keras.ops``: the scale's update and its
reciprocal, exact at every float32 value on every Keras backend.

TensorFlow and XLA flush float32 subnormals to zero, so the rule's products and the scale's
reciprocal are computed on bit patterns, with integer ops and float ops whose operands and
results are all normal numbers, as the JAX backend does.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

_EXP_MASK = 0x7F800000
_MIN_NORMAL_BITS = 0x00800000


def _i32(x: Any) -> Any:
    return ops.view(ops.cast(x, "float32"), "int32")


def _f32(bits: Any) -> Any:
    return ops.view(ops.cast(bits, "int32"), "float32")


def _int(value: int) -> Any:
    return ops.convert_to_tensor(value, dtype="int32")


def _mantissa(x: Any) -> Any:
    """The 24-bit significand of a normal float32, as an int32."""
    return ops.bitwise_or(ops.bitwise_and(_i32(x), _int(0x7FFFFF)), _int(0x800000))


def _product_error(a: Any, b: Any, p: Any) -> Any:
    """``a * b - p`` exactly, in units of 2**-46, as an int32: for ``a``, ``b`` in [1, 2) and
    ``p`` in [1, 4) within half an ulp of ``a * b`` (so the result fits in 24 bits).

    Integer arithmetic on 12-bit halves of the significands: TensorFlow's graph
    optimizer (tf.function without XLA) reassociates float sums, which breaks the
    float version of Dekker's product the JAX backend uses; integer sums are exact
    in any order.
    """
    x, c = _mantissa(a), _mantissa(b)
    xh, xl = ops.right_shift(x, 12), ops.bitwise_and(x, _int(0xFFF))
    ch, cl = ops.right_shift(c, 12), ops.bitwise_and(c, _int(0xFFF))
    # p = pm * 2**(pe - 23); in units of 2**-46 it is pm << (23 + pe) = hh * 2**24 + hl.
    pb = _i32(p)
    pe = ops.right_shift(pb, 23) - 127
    pm = _mantissa(p)
    hh = ops.right_shift(pm, 1 - pe)
    hl = ops.where(ops.equal(pe, 0), ops.left_shift(ops.bitwise_and(pm, _int(1)), 23), _int(0))
    mid = xh * cl + xl * ch  # < 2**25
    high = xh * ch - hh + ops.right_shift(mid, 12)
    low = ops.left_shift(ops.bitwise_and(mid, _int(0xFFF)), 12) + xl * cl - hl
    return high * (1 << 24) + low


def _round_half_even(v: Any, below: Any) -> Any:
    """``v`` rounded to an int32, ties to even, where ``v`` is a rounded value and ``below``
    (any sign-carrying number) the remainder it dropped: a tie goes up when it is > 0."""
    floor = ops.floor(v)
    frac = v - floor
    odd = ops.not_equal(ops.floor(floor * 0.5) * 2.0, floor)
    tie_up = ops.logical_or(ops.greater(below, 0),
                            ops.logical_and(ops.equal(below, 0), odd))
    up = ops.logical_or(frac > 0.5, ops.logical_and(ops.equal(frac, 0.5), tie_up))
    return ops.cast(floor, "int32") + ops.cast(up, "int32")


def _normalised(bits: Any) -> tuple[Any, Any]:
    """``(xn, ex)`` with the non-zero float32 of ``bits`` equal to ``xn * 2**ex``, xn in [1, 2)
    a normal float32 and ex an int32, subnormals included (their mantissa, an int below
    2**23, converts to float32 exactly and carries its own exponent)."""
    ebits = ops.bitwise_and(ops.right_shift(bits, 23), _int(0xFF))
    mant = ops.bitwise_and(bits, _int(0x7FFFFF))
    subnormal = ops.equal(ebits, 0)
    as_float = _i32(ops.cast(mant, "float32"))
    frac = ops.where(subnormal, ops.bitwise_and(as_float, _int(0x7FFFFF)), mant)
    ex = ops.where(subnormal, ops.right_shift(as_float, 23) - 127 - 149, ebits - 127)
    return _f32(ops.bitwise_or(_int(127 << 23), frac)), ex


def _mul_bits(bits: Any, cn: Any, ec: Any) -> Any:
    """The bits of ``f32(x * c)`` for the non-negative float32 ``x`` of ``bits`` and a positive
    float32 ``c = cn * 2**ec`` (``cn`` a float32 in [1, 2), ``ec`` an int32: tensors, the
    rule's factors are a variable's values), rounded to nearest even, subnormals included."""
    xn, ex = _normalised(bits)
    hi = xn * cn
    lo = _product_error(xn, cn, hi)
    hbits = _i32(hi)
    e_res = ops.bitwise_and(ops.right_shift(hbits, 23), _int(0xFF)) + ex + ec
    normal = ops.bitwise_or(ops.bitwise_and(hbits, _int(0x7FFFFF)), ops.left_shift(e_res, 23))
    s = ops.clip(149 + ex + ec, -60, 30)  # below -60 the result rounds to 0 anyway
    two_s = _f32(ops.left_shift(s + 127, 23))
    tiny = _round_half_even(hi * two_s, lo)
    out = ops.where(e_res >= 255, _int(_EXP_MASK), ops.where(e_res >= 1, normal, tiny))
    return ops.where(ops.equal(bits, 0), _int(0), out)


def _reciprocal_of_mantissa(m: Any) -> Any:
    """``f32(1 / m)`` for a float32 ``m`` in [1, 2), correctly rounded, in (0.5, 1].

    ``1 / m`` is a division in eager TensorFlow, JAX and torch, but TensorFlow's graph
    optimizer (tf.function without XLA) turns it into an approximate reciprocal,
    up to 3 ulps off over every m in [1, 2): of ``1 / m`` and its four neighbours on
    each side, the one with the smallest exact ``|m * r - 1|`` is taken.
    """
    r0 = _i32(1.0 / m)
    best_r, best_err = None, None
    for step in range(-4, 5):
        r = _f32(r0 + step)
        # 2 * r is in [1, 2) for r in [0.5, 1): m * (2 * r) - 2 exactly, as an int.
        err = ops.absolute(_product_error(m, r * 2.0, ops.convert_to_tensor(2.0, "float32")))
        if best_r is None:
            best_r, best_err = r, err
        else:
            better = err < best_err
            best_r, best_err = ops.where(better, r, best_r), ops.where(better, err, best_err)
    return ops.where(ops.equal(m, 1.0), ops.convert_to_tensor(1.0, "float32"), best_r)


def _reciprocal_bits(bits: Any) -> Any:
    """The bits of ``f32(1 / scale)`` (the float64 reciprocal rounded once), for the
    non-negative float32 scale of ``bits``, at every scale: 1 / (m * 2**e) is
    (1 / m) * 2**-e, an exponent shift of the correctly rounded 1 / m, or, where that
    is subnormal (scales above 2**126), 1 / m rounded again to a multiple of 2**-149
    with the sign of the exact 1 - m * r breaking a tie."""
    m, e = _normalised(bits)
    r = _reciprocal_of_mantissa(m)
    rb = _i32(r)
    e_res = ops.right_shift(rb, 23) - e  # biased exponent of the result
    normal = ops.bitwise_or(ops.bitwise_and(rb, _int(0x7FFFFF)), ops.left_shift(e_res, 23))
    s = ops.clip(149 - e, 0, 30)  # only used where the result is subnormal: e >= 126
    t = r * _f32(ops.left_shift(s + 127, 23))
    below = -_product_error(m, r * 2.0, ops.convert_to_tensor(2.0, "float32"))
    tiny = _round_half_even(t, below)
    out = ops.where(e_res >= 255, _int(_EXP_MASK), ops.where(e_res >= 1, normal, tiny))
    return ops.where(ops.equal(bits, 0), _int(_EXP_MASK), out)


def _split(bits: Any) -> tuple[Any, Any]:
    """Two normal float32 factors whose product is the float32 of ``bits`` (see jax.py)."""
    subnormal = bits < _MIN_NORMAL_BITS
    hi = ops.where(subnormal, ops.cast(bits, "float32") * 2.0**-85, _f32(bits))
    lo = ops.where(subnormal, 2.0**-64, 1.0)
    return ops.stop_gradient(hi), ops.stop_gradient(lo)


def _multiply(x: Any, hi: Any, lo: Any | None) -> Any:
    dtype = keras.backend.standardize_dtype(x.dtype)
    wide = ops.cast(x, "float32") if dtype in ("float16", "bfloat16") else x
    product = wide * ops.cast(hi, wide.dtype)
    if lo is not None:
        product = product * ops.cast(lo, wide.dtype)
    return ops.cast(product, dtype)
