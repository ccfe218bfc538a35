"""Float32 arithmetic on bit patterns (``unifiedamp.backends._float32_bits``) in ``keras.ops``,
against NumPy's IEEE float32 over bit patterns of every kind (0, subnormals, normals, the
largest floats), compiled as the session's Keras backend compiles: TensorFlow's graph mode
(where the graph optimizer rewrites float arithmetic) and XLA, ``jax.jit``, torch (eager).
The keras session runs once per ``KERAS_BACKEND``; each run checks its own backend's cases.
"""

from __future__ import annotations

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


def _keras_results(backend: str, xla: bool = False) -> dict:
    """Every result of the keras.ops namespace on ``bit_patterns()``, compiled the way the
    Keras backend ``backend`` (the one this session runs) compiles, as NumPy arrays."""
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != backend:
        pytest.skip(f"checks the {backend} Keras backend; this session runs "
                    f"KERAS_BACKEND={keras.backend.backend()}")
    from keras import ops

    from unifiedamp.backends._float32_bits import Float32Bits, factor_parts

    f = Float32Bits.for_keras()
    bits = bit_patterns()
    results = {}

    def compiled(fn):
        if backend == "tensorflow":
            import tensorflow as tf

            return tf.function(fn, jit_compile=xla)
        if backend == "jax":
            import jax

            return jax.jit(fn)
        return fn

    # As the Keras backend holds a factor: its parts as tensors (a variable's values), so one
    # compiled function serves every factor.
    mul = compiled(lambda b, cn, ec: f.mul_bits(ops.convert_to_tensor(b), cn, ec))
    for i, c in enumerate(FACTORS):
        c = spec.f32(c)
        cn, ec = factor_parts(c)
        results[f"mul{i}"] = ops.convert_to_numpy(mul(
            bits, ops.convert_to_tensor(cn, "float32"), ops.convert_to_tensor(ec, "int32")))
        results[f"mul_by{i}"] = ops.convert_to_numpy(compiled(
            lambda b, c=c: f.mul_bits_by(ops.convert_to_tensor(b), c))(bits))
    results["reciprocal"] = ops.convert_to_numpy(compiled(
        lambda b: f.reciprocal_bits(ops.convert_to_tensor(b)))(bits))
    hi, lo = compiled(lambda b: f.split(ops.convert_to_tensor(b)))(bits)
    results["hi"], results["lo"] = ops.convert_to_numpy(hi), ops.convert_to_numpy(lo)
    return results


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "xla"), [("tensorflow", False), ("tensorflow", True),
                                              ("jax", False), ("torch", False)],
                         ids=["tensorflow-graph", "tensorflow-xla", "jax-jit", "torch"])
def test_keras_namespace_matches_ieee(backend, xla):
    results = _keras_results(backend, xla)
    bits = bit_patterns()
    for i, c in enumerate(FACTORS):
        want = reference_product(bits, spec.f32(c))
        for key in (f"mul{i}", f"mul_by{i}"):
            assert not mismatches(results[key], want, bits), (key, c, mismatches(
                results[key], want, bits))
    want = reference_reciprocal(bits)
    assert not mismatches(results["reciprocal"], want, bits), mismatches(
        results["reciprocal"], want, bits)
    check_split(bits, results["hi"], results["lo"])
