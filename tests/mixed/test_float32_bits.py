"""Float32 arithmetic on bit patterns (``unifiedamp.backends._float32_bits``) against NumPy's IEEE
float32, over bit patterns of every kind (0, subnormals, normals, the largest floats), for
each namespace the backends use: ``jax.numpy`` under ``jax.jit``, and ``keras.ops`` under
TensorFlow (graph mode, where the graph optimizer rewrites float arithmetic, and XLA), JAX
and torch, each Keras backend in a child process of its own.
"""

from __future__ import annotations

import pathlib
import textwrap

import numpy as np
import pytest

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


# ------------------------------------------------------------ jax.numpy, in this process


@pytest.mark.framework("jax")
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


@pytest.mark.framework("jax")
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


def test_factor_parts_is_exact():
    from unifiedamp.backends._float32_bits import factor_parts

    for c in [*FACTORS, 2.0**-126, 1.5 * 2.0**-140]:
        c = spec.f32(c)
        cn, ec = factor_parts(c)
        assert 1.0 <= cn < 2.0 and cn * 2.0**ec == c and spec.f32(cn) == cn, c


# ------------------------------------------------------------ keras.ops, one child per backend

KERAS_CHILD = """
import os, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_float32_bits import FACTORS, bit_patterns
from unifiedamp import spec
from unifiedamp.backends._float32_bits import Float32Bits, factor_parts
import keras
from keras import ops

assert keras.backend.backend() == {backend!r}, keras.backend.backend()
f = Float32Bits.for_keras()
bits = bit_patterns()
results = {{}}

def compiled(fn):
    if {backend!r} == "tensorflow":
        import tensorflow as tf
        return tf.function(fn, jit_compile={xla!r})
    if {backend!r} == "jax":
        import jax
        return jax.jit(fn)
    return fn

# As the Keras backend holds a factor: its parts as tensors (a variable's values), so one
# compiled function serves every factor.
mul = compiled(lambda b, cn, ec: f.mul_bits(ops.convert_to_tensor(b), cn, ec))
for i, c in enumerate(FACTORS):
    c = spec.f32(c)
    cn, ec = factor_parts(c)
    results[f"mul{{i}}"] = ops.convert_to_numpy(mul(
        bits, ops.convert_to_tensor(cn, "float32"), ops.convert_to_tensor(ec, "int32")))
    results[f"mul_by{{i}}"] = ops.convert_to_numpy(compiled(
        lambda b, c=c: f.mul_bits_by(ops.convert_to_tensor(b), c))(bits))
results["reciprocal"] = ops.convert_to_numpy(compiled(
    lambda b: f.reciprocal_bits(ops.convert_to_tensor(b)))(bits))
hi, lo = compiled(lambda b: f.split(ops.convert_to_tensor(b)))(bits)
results["hi"], results["lo"] = ops.convert_to_numpy(hi), ops.convert_to_numpy(lo)
np.savez({out!r}, **results)
"""


def _keras_results(run_python, tmp_path, backend: str, xla: bool = False) -> dict:
    pytest.importorskip("keras")
    out = tmp_path / f"{backend}.npz"
    code = KERAS_CHILD.format(tests=str(pathlib.Path(__file__).parent),
                              backend=backend, xla=xla, out=str(out))
    proc = run_python(textwrap.dedent(code), env={"KERAS_BACKEND": backend}, cwd=tmp_path)
    if proc.returncode and f"No module named '{backend}'" in proc.stderr:
        pytest.skip(f"{backend} is not installed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(np.load(out))


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "xla"), [("tensorflow", False), ("tensorflow", True),
                                              ("jax", False), ("torch", False)],
                         ids=["tensorflow-graph", "tensorflow-xla", "jax-jit", "torch"])
def test_keras_namespace_matches_ieee(backend, xla, run_python, tmp_path):
    results = _keras_results(run_python, tmp_path, backend, xla)
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
