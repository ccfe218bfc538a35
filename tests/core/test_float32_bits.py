"""Float32 arithmetic on bit patterns: the NumPy references are the spec's rounding, and a
factor splits exactly into its parts (the namespaces themselves: tests/jax and tests/keras
``test_float32_bits.py``)."""

from __future__ import annotations

import numpy as np
from float32_bits_checks import FACTORS, bit_patterns, reference_product, reference_reciprocal

from unifiedamp import spec


def test_the_numpy_reference_is_the_spec_s_rounding():
    # The vectorised references agree with unifiedamp.spec's f32 on a sample.
    bits = bit_patterns(random=300)
    for c in FACTORS:
        c = spec.f32(c)
        want = [spec.f32_bits(spec.f32_from_bits(int(b)) * c) for b in bits]
        assert (reference_product(bits, c).view(np.uint32) == np.uint32(want)).all(), c
    want = [spec.f32_bits(1.0 / x) if (x := spec.f32_from_bits(int(b))) else 0x7F800000
            for b in bits]
    assert (reference_reciprocal(bits).view(np.uint32) == np.uint32(want)).all()


def test_factor_parts_is_exact():
    from unifiedamp.backends._float32_bits import factor_parts

    for c in [*FACTORS, 2.0**-126, 1.5 * 2.0**-140]:
        c = spec.f32(c)
        cn, ec = factor_parts(c)
        assert 1.0 <= cn < 2.0 and cn * 2.0**ec == c and spec.f32(cn) == cn, c
