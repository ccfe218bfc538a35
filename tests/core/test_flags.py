"""What the numpy scaler's ``update()`` takes as a flag, and what it refuses.

A flag is what ``unscale`` returns (a bool or a NumPy bool) or a Python bool; a plain number
first is torch's positional ``new_scale``; anything else (a float array, a list) is refused
before anything changes, with the fix. Arrays of another framework are refused too: NumPy
would quietly copy them to the host. Also the backend-name suggestion, case-insensitive.
"""

from __future__ import annotations

import numpy as np
import pytest
from imperative_misuse_checks import check_a_flag_stands_for_the_unscale_checks_it_was_made_from

import unifiedamp as ua
from unifiedamp.backends.numpy import SGD, NumpyGradScaler
from unifiedamp.errors import UnknownBackendError


class HostArray:
    """An array of a framework NumPy does not know, as a torch tensor or a JAX array is to
    NumPy: ``np.asarray`` converts it through ``__array__``."""

    def __init__(self, values: list[float]):
        self.values = np.array(values, np.float32)
        self.dtype = self.values.dtype
        self.shape = self.values.shape

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)


def _after_one_check(scale: float = 1024.0) -> NumpyGradScaler:
    scaler = NumpyGradScaler(scale)
    scaler.unscale([np.ones(2, np.float32)])
    return scaler


@pytest.mark.parametrize("flag", [np.array(1.0), np.array([1.0]), [True, False],
                                  (True,), "True"],
                         ids=["0d-float-array", "float-array", "list", "tuple", "str"])
def test_a_non_flag_first_argument_is_refused_and_changes_nothing(flag):
    scaler = _after_one_check()
    with pytest.raises(TypeError, match=r"as its flag.*new_scale="):
        scaler.update(flag)
    assert (scaler.get_scale(), scaler.num_steps) == (1024.0, 0)
    scaler.update(True)  # the check of the iteration is still there
    assert scaler.num_steps == 1


def test_a_float_flag_does_not_become_the_scale():
    scaler = _after_one_check()
    _, finite = scaler.unscale([np.array([np.inf], np.float32)])
    with pytest.raises(TypeError, match="new_scale="):
        scaler.update(np.asarray(finite, np.float32))
    assert scaler.get_scale() == 1024.0


def test_a_number_first_is_torchs_positional_new_scale():
    scaler = NumpyGradScaler(1024.0)
    assert scaler.update(8.0).get_scale() == 8.0
    assert scaler.update(np.float32(4.0)).get_scale() == 4.0
    assert scaler.num_steps == 0  # a manual set, as on torch


@pytest.mark.parametrize("flag, skipped", [(np.bool_(False), True), (np.bool_(True), False),
                                           (np.array(False), True), (False, True)])
def test_numpy_and_python_bools_are_flags(flag, skipped):
    scaler = NumpyGradScaler(1024.0)
    scaler.update(flag)
    assert (scaler.last_step_skipped, scaler.get_scale()) == (skipped,
                                                              512.0 if skipped else 1024.0)


def test_where_finite_takes_numpy_bool_scalars():
    scaler = NumpyGradScaler()
    new, old = [np.ones(2, np.float32)], [np.zeros(2, np.float32)]
    assert scaler.where_finite(np.bool_(True), new, old) is not old
    np.testing.assert_array_equal(scaler.where_finite(np.bool_(True), new, old)[0], new[0])
    np.testing.assert_array_equal(scaler.where_finite(np.bool_(False), new, old)[0], old[0])
    # unscale's own flag, as the docs' step uses it
    _, finite = scaler.unscale([np.array([np.inf], np.float32)])
    assert scaler.where_finite(finite, new, old)[0] is old[0]


@pytest.mark.parametrize("verb", ["scale", "unscale"])
def test_arrays_of_another_framework_are_refused(verb):
    scaler = NumpyGradScaler(4.0)
    with pytest.raises(TypeError, match=r"HostArray leaf.*np\.asarray"):
        getattr(scaler, verb)([HostArray([1.0, 2.0])])
    assert scaler.update(True).num_steps == 1  # the refused unscale recorded no check


def test_a_flag_of_another_framework_is_refused():
    scaler = _after_one_check()
    flag = HostArray([0.0])
    flag.dtype, flag.shape = np.dtype(bool), ()
    with pytest.raises(TypeError, match=r"HostArray flag.*np\.asarray"):
        scaler.update(flag)
    assert scaler.num_steps == 0


def test_the_documented_loop_still_runs_with_numpys_own_values():
    scaler, opt = NumpyGradScaler(8.0), SGD([np.ones(2, np.float32)])
    opt.grads = [scaler.scale(np.ones(2, np.float32))]
    scaler.step(opt)
    assert scaler.update(np.bool_(True)).num_steps == 1
    assert scaler.scale(0.5) == 4.0


@pytest.mark.parametrize("name, target", [("TORHC", "torch"), ("Numpyy", "numpy"),
                                          ("PADDEL", "paddle")])
def test_backend_name_suggestions_ignore_case(name, target):
    with pytest.raises(UnknownBackendError, match=f"did you mean '{target}'"):
        ua.GradScaler(backend=name)


def test_a_flag_stands_for_the_unscale_checks_it_was_made_from():
    check_a_flag_stands_for_the_unscale_checks_it_was_made_from(
        NumpyGradScaler(1024.0, growth_interval=1), [np.array([np.inf], np.float32)],
        [np.ones(1, np.float32)], lambda a, b: a and b)
