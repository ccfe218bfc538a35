"""The Keras backend's flags and inputs mean what they mean on every other backend: two
``unscale`` calls before one ``update(flag)`` are decided by the flag, a NumPy bool is a flag,
and another framework's tensors are refused in the words every backend uses
(tests/cross/test_foreign_arrays.py checks the other backends)."""

from __future__ import annotations

import numpy as np
import pytest
from imperative_misuse_checks import check_a_flag_stands_for_the_unscale_checks_it_was_made_from

import unifiedamp as ua


def _tensor(keras, values):
    return keras.ops.convert_to_tensor(np.asarray(values, np.float32))


def test_a_flag_stands_for_the_unscale_checks_it_was_made_from(keras):
    # The Keras backend records no checks: a flag-less update() is NoInfChecksError.
    check_a_flag_stands_for_the_unscale_checks_it_was_made_from(
        ua.GradScaler(1024.0, growth_interval=1, backend="keras"),
        [_tensor(keras, [np.inf])], [_tensor(keras, [1.0])], keras.ops.logical_and,
        recorded=False)


def test_where_finite_takes_a_numpy_bool_as_a_flag(keras):
    scaler = ua.GradScaler(backend="keras")
    new, old = [_tensor(keras, [1.0, 2.0])], [_tensor(keras, [0.0, 0.0])]
    for flag, expected in [(np.bool_(True), [1.0, 2.0]), (np.bool_(False), [0.0, 0.0]),
                           (np.isfinite(np.float32(np.inf)), [0.0, 0.0])]:
        chosen = scaler.where_finite(flag, new, old)
        assert keras.ops.convert_to_numpy(chosen[0]).tolist() == expected, flag


def _foreign(keras):
    """A tensor of a framework that is not Keras's backend: (tensor, its backend's name)."""
    if keras.backend.backend() == "torch":
        jnp = pytest.importorskip("jax.numpy")
        return jnp.ones(2, "float32"), "jax"
    torch = pytest.importorskip("torch")
    return torch.ones(2), "torch"


def test_another_frameworks_tensors_are_refused_in_the_same_words(keras):
    scaler = ua.GradScaler(8.0, backend="keras")
    foreign, other = _foreign(keras)
    own = _tensor(keras, [1.0, 2.0])
    pattern = (rf"takes Keras tensors \({keras.backend.backend()}\), NumPy arrays or numbers "
               rf"or a list/tuple/dict of them, got a \w+\.\w+ leaf of shape \(2,\) .*; "
               rf"convert it with keras\.ops\.convert_to_tensor .*, or use backend='{other}'")
    for call in (lambda: scaler.scale(foreign), lambda: scaler.unscale([own, foreign]),
                 lambda: scaler.where_finite(True, [own], [foreign])):
        with pytest.raises(ua.ForeignArrayError, match=pattern):
            call()
    assert scaler.get_scale() == 8.0 and scaler.num_steps == 0
    # NumPy arrays and numbers are Keras inputs.
    assert keras.ops.convert_to_numpy(scaler.scale(np.ones(2, np.float32))).tolist() == [8.0, 8.0]
