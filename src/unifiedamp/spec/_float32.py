"""IEEE float32 arithmetic in pure Python: rounding, bit patterns, limits."""

from __future__ import annotations

import math
import struct

__all__ = ["FLOAT32_MAX", "FLOAT32_MIN_NORMAL", "f32", "f32_bits", "f32_from_bits", "f32_hex"]

FLOAT32_MIN_NORMAL = 2.0**-126
#: float32's largest finite number (Flax's DynamicScale clamps a growth to it).
FLOAT32_MAX = 3.4028234663852886e38

_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def f32(x: float) -> float:
    """Rounds ``x`` to the nearest float32 (ties to even), returned as a Python float.

    Example:
        >>> f32(0.1)
        0.10000000149011612
        >>> f32(1e39)
        inf
    """
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:
        # struct refuses finite values that round past float32's range; IEEE rounds them to inf.
        return math.copysign(math.inf, x)


def f32_bits(x: float) -> int:
    """The float32 bit pattern of ``f32(x)`` as an unsigned int.

    Example:
        >>> hex(f32_bits(1.0))
        '0x3f800000'
    """
    return _U32.unpack(_F32.pack(f32(x)))[0]


def f32_from_bits(bits: int) -> float:
    """The float32 value of a bit pattern, as a Python float.

    Example:
        >>> f32_from_bits(0x3F800000)
        1.0
    """
    return _F32.unpack(_U32.pack(bits))[0]


def f32_hex(x: float) -> str:
    """The float32 bit pattern of ``x`` as ``0x########``, for error messages.

    Example:
        >>> f32_hex(1.0)
        '0x3f800000'
    """
    return f"0x{f32_bits(x):08x}"
