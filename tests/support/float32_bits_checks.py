"""Float32 arithmetic on bit patterns (``unifiedamp.backends._float32_bits``) against NumPy's
IEEE float32: the bit patterns, the NumPy references and the comparisons that each session's
``test_float32_bits.py`` uses (tests/core, tests/jax, tests/keras)."""

from __future__ import annotations

import numpy as np

from unifiedamp import spec

#: The factors the update multiplies by: the defaults, odd ones, and the extremes.
FACTORS = [2.0, 0.5, 0.7, 1.1, 3.3, 0.999, 1.0, 1e-20, 2.5e30, 2.0**-149, 3.4e38]


def bit_patterns(seed: int = 0, random: int = 30_000) -> np.ndarray:
    """Non-negative finite float32 bit patterns (int32): the edges of each range, then
    random subnormals, random normals and random ones above 2**126."""
    edges = [0, 1, 2, 3, 0x7FFFFF, 0x7FFFFE, 0x400000, 0x800000, 0x800001, 0xFFFFFF,
             0x3F800000, 0x3F800001, 0x3FFFFFFF, 0x7E800000, 0x7E800001, 0x7E7FFFFF,
             0x7F000000, 0x7F7FFFFF, 0x7F7FFFFE, spec.f32_bits(spec.MIN_UNSCALABLE),
             spec.f32_bits(spec.MIN_UNSCALABLE) - 1]
    rng = np.random.default_rng(seed)
    return np.concatenate([
        edges, rng.integers(1, 0x00800000, random),
        rng.integers(0x00800000, 0x7F800000, 3 * random),
        rng.integers(0x7E800000, 0x7F800000, random)]).astype(np.int32)


def reference_product(bits: np.ndarray, c: float) -> np.ndarray:
    """The bits of ``f32(x * c)``: the float64 product is exact (48 bits, exponents far
    inside float64's range), so one rounding to float32 is IEEE's float32 product."""
    with np.errstate(over="ignore"):
        return (bits.view(np.float32).astype(np.float64) * c).astype(np.float32).view(np.int32)


def reference_reciprocal(bits: np.ndarray) -> np.ndarray:
    """The bits of ``f32(1 / x)`` (the float64 reciprocal rounded once; inf for 0)."""
    with np.errstate(over="ignore", divide="ignore"):
        return (1.0 / bits.view(np.float32).astype(np.float64)).astype(np.float32).view(
            np.int32)


def check_split(bits: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> None:
    """``hi * lo`` is the value exactly, and both are normal numbers (or hi is 0)."""
    value = bits.view(np.float32).astype(np.float64)
    hi, lo = np.asarray(hi, np.float32), np.asarray(lo, np.float32)
    assert (hi.astype(np.float64) * lo.astype(np.float64) == value).all()
    tiny = np.float32(2.0**-126)
    assert ((hi >= tiny) | (hi == 0)).all() and (lo >= tiny).all()


def mismatches(got: np.ndarray, want: np.ndarray, bits: np.ndarray) -> str:
    wrong = np.nonzero(np.asarray(got) != want)[0]
    if not len(wrong):
        return ""
    i = wrong[0]
    return (f"{len(wrong)} of {len(bits)} wrong, e.g. x = {bits[i]:#010x}: got "
            f"{int(np.asarray(got)[i]):#010x}, IEEE gives {int(want[i]):#010x}")
