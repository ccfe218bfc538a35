"""Float32 arithmetic on bit patterns (``unifiedamp.backends._float32_bits``) in ``jax.numpy``
under ``jax.jit``, against NumPy's IEEE float32 over bit patterns of every kind (0,
subnormals, normals, the largest floats)."""

from __future__ import annotations

import numpy as np
import pytest
from float32_bits_checks import (
    FACTORS,
    bit_patterns,
    check_split,
    mismatches,
    reference_product,
    reference_reciprocal,
)

from unifiedamp import spec


def test_jax_namespace_matches_ieee_under_jit():
    jax = pytest.importorskip("jax")
    from unifiedamp.backends._float32_bits import Float32Bits

    f = Float32Bits.for_jax()
    bits = bit_patterns()
    for c in FACTORS:
        c = spec.f32(c)
        got = np.asarray(jax.jit(lambda b, c=c: f.mul_bits_by(b, c))(bits))
        assert not mismatches(got, reference_product(bits, c), bits), (c, mismatches(
            got, reference_product(bits, c), bits))
    got = np.asarray(jax.jit(f.reciprocal_bits)(bits))
    assert not mismatches(got, reference_reciprocal(bits), bits), mismatches(
        got, reference_reciprocal(bits), bits)
    check_split(bits, *jax.jit(f.split)(bits))


def test_jax_multiply_takes_the_factor_as_arrays_too():
    # keras passes a factor read from a variable: (significand, exponent) arrays.
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from unifiedamp.backends._float32_bits import Float32Bits, factor_parts

    f = Float32Bits.for_jax()
    bits = bit_patterns(random=2_000)
    for c in FACTORS:
        c = spec.f32(c)
        cn, ec = factor_parts(c)
        got = jax.jit(f.mul_bits)(bits, jnp.float32(cn), jnp.int32(ec))
        assert not mismatches(got, reference_product(bits, c), bits), c
