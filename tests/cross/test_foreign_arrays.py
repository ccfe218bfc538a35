"""Every backend refuses another framework's arrays in the same words, takes a NumPy bool as
a flag, and refuses a float flag.

An array of another framework handed to ``scale``, ``unscale`` or ``where_finite`` would be
copied quietly (to the host, or to another device) or fail deep inside the framework: each
backend raises :class:`unifiedamp.ForeignArrayError` naming the leaf's type, the conversion
and the backend of its framework, and records nothing. NumPy arrays are JAX's own inputs
(``jnp.asarray``): the JAX backend takes them. The Keras backend's refusal
is checked in tests/keras/test_keras_wrapper.py (Keras on TensorFlow cannot share this
process with Paddle).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import unifiedamp as ua

# backend -> (how to make one of its float32 arrays, the modules whose arrays it takes)
MAKE = {
    "numpy": lambda values: np.asarray(values, np.float32),
    "torch": lambda values: __import__("torch").tensor(values),
    "paddle": lambda values: __import__("paddle").to_tensor(values, dtype="float32"),
    "jax": lambda values: __import__("jax").numpy.asarray(values, "float32"),
    "mlx": lambda values: __import__("mlx.core").core.array(values),
}
TAKES = {"numpy": {"numpy"}, "torch": {"torch"}, "paddle": {"paddle"},
         "jax": {"jax", "numpy"}, "mlx": {"mlx"}}
PAIRS = [(backend, other) for backend in MAKE for other in MAKE if other not in TAKES[backend]]


def _message(other: str) -> str:
    root = {"jax": "jaxlib"}.get(other, other)
    return (rf"takes .+ or a list/tuple/dict of them, got a {root}\.\w+ leaf of shape \(2,\) "
            rf"and dtype \S*float32; "
            rf"convert it with .+, or use backend='{other}' for its arrays")


def _refused(call, other):
    with pytest.raises(ua.ForeignArrayError, match=_message(other)) as info:
        call()
    # The frameworks' own habits: torch's and Paddle's scale() raise ValueError here.
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    return str(info.value)


@pytest.mark.parametrize("backend, other", PAIRS, ids=[f"{b}-given-{o}" for b, o in PAIRS])
def test_another_frameworks_arrays_are_refused_in_the_same_words(backend, other):
    if backend == "paddle" or other == "paddle":
        pytest.importorskip("paddle")
    if backend == "mlx" or other == "mlx":
        pytest.importorskip("mlx.core")
    scaler = ua.GradScaler(8.0, backend=backend)
    foreign = MAKE[other]([1.0, 2.0])
    own = MAKE[backend]([1.0, 2.0])
    words = {_refused(lambda: scaler.scale(foreign), other).split(" takes ")[1],
             _refused(lambda: scaler.unscale([own, foreign]), other).split(" takes ")[1],
             _refused(lambda: scaler.where_finite(True, [own], [foreign]), other)
             .split(" takes ")[1]}
    assert len(words) == 1, words  # one sentence per backend, whatever the method
    # The refused unscale recorded no check: the next update counts as the first step.
    if backend in ("jax", "mlx"):
        assert scaler.num_steps == 0 and scaler.get_scale() == 8.0
    else:
        _, finite = scaler.unscale([own])
        assert scaler.update(finite).num_steps == 1


@pytest.mark.parametrize("backend", list(MAKE))
def test_where_finite_takes_a_numpy_bool_as_a_flag(backend):
    """``np.isfinite(loss)`` is a NumPy bool on the host: it selects like ``True``/``False``
    on every backend (a where_finite that read it as its truth value of an array, or
    returned the old values for a NumPy True, fails here)."""
    if backend == "paddle":
        pytest.importorskip("paddle")
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    scaler = ua.GradScaler(8.0, backend=backend)
    new, old = [MAKE[backend]([1.0, 2.0])], [MAKE[backend]([0.0, 0.0])]
    for flag, expected in [(np.bool_(True), [1.0, 2.0]), (np.bool_(False), [0.0, 0.0]),
                           (np.isfinite(np.float32(np.inf)), [0.0, 0.0]),
                           (np.asarray(True), [1.0, 2.0])]:
        chosen = scaler.where_finite(flag, new, old)
        assert np.asarray(chosen[0]).tolist() == expected, (flag, chosen)


def test_the_message_names_the_leaf_and_the_fix():
    scaler = ua.GradScaler(backend="torch")
    message = _refused(lambda: scaler.scale(np.ones(2, np.float32)), "numpy")
    assert re.search(r"got a numpy\.ndarray leaf of shape \(2,\) and dtype float32; "
                     r"convert it with torch\.as_tensor", message), message


@pytest.mark.parametrize("backend", list(MAKE))
def test_a_float_flag_is_an_error_on_every_backend(backend):
    """``update(finite.float())`` would set the scale to 1.0 where a number first is torch's
    ``new_scale``: every backend refuses a non-bool array as the flag and changes nothing (a
    plain number first stays torch's ``update(new_scale)``; numpy's flag is a bool, so its
    float array stands in for ``f.float()``)."""
    if backend == "paddle":
        pytest.importorskip("paddle")
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    scaler = ua.GradScaler(1024.0, backend=backend)
    _, finite = scaler.unscale([MAKE[backend]([1.0, 2.0])])
    as_float = {"torch": lambda f: f.float(), "paddle": lambda f: f.astype("float32"),
                "numpy": lambda f: np.asarray(f, np.float32), "jax": lambda f: f.astype("float32"),
                "mlx": lambda f: f.astype(__import__("mlx.core").core.float32)}[backend]
    with pytest.raises(TypeError, match=r"flag|finite"):
        scaler.update(as_float(finite))
    assert scaler.get_scale() == 1024.0 and scaler.num_steps == 0
