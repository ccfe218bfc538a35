"""Every backend has every member GradScaler declares, with its signature and its
read-only-ness, and no public member GradScaler does not declare beyond the few listed in
tests/support/interface_checks.py (the framework's own names, kept for porting). A member
added to one backend only fails here: declare it in GradScaler (as an optional capability if
only some backends can have it) or list it there with the reason.

This session imports NumPy, torch, Paddle, JAX and MLX together and describes each backend's
class in process; the Keras backend's class is described in tests/keras/test_interface.py
(Keras on TensorFlow cannot share a process with Paddle).
"""

from __future__ import annotations

import inspect

import pytest
from interface_checks import InterfaceContract

from unifiedamp import GradScaler
from unifiedamp._scaler import OPTIONAL_MEMBERS


class TestNumpyInterface(InterfaceContract):
    backend = "numpy"


class TestTorchInterface(InterfaceContract):
    backend = "torch"


class TestPaddleInterface(InterfaceContract):
    backend = "paddle"


class TestJaxInterface(InterfaceContract):
    backend = "jax"


class TestMlxInterface(InterfaceContract):
    backend = "mlx"


def test_every_declared_member_has_a_one_line_docstring():
    for name in dir(GradScaler):
        if name.startswith("_"):
            continue
        doc = inspect.getdoc(getattr(GradScaler, name))
        assert doc and doc.strip(), f"GradScaler.{name} has no docstring"


def test_optional_members_are_declared_and_raise_saying_what_to_use():
    for name in OPTIONAL_MEMBERS:
        assert hasattr(GradScaler, name), name
    with pytest.raises(ValueError, match="not an optional member"):
        GradScaler.supports("scale")


def test_the_constructor_shows_the_design_signature():
    sig = inspect.signature(GradScaler)
    params = list(sig.parameters.values())
    assert [(p.name, p.default) for p in params[:5]] == [
        ("init_scale", 65536.0), ("growth_factor", 2.0), ("backoff_factor", 0.5),
        ("growth_interval", 2000), ("enabled", True)]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:5])
    keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    assert keyword_only == ["hysteresis", "min_scale", "max_scale", "dynamic", "backend"]


def test_a_backend_class_shows_its_own_options_after_the_spec():
    from unifiedamp.backends.numpy import NumpyGradScaler

    names = list(inspect.signature(NumpyGradScaler).parameters)
    assert names[:9] == ["init_scale", "growth_factor", "backoff_factor", "growth_interval",
                         "enabled", "hysteresis", "min_scale", "max_scale", "dynamic"]
    assert {"diagnose", "history", "on_collapse"} <= set(names) and "backend" not in names


@pytest.mark.parametrize("name, backend", [
    ("pytorch", "torch"), ("PyTorch", "torch"), ("tf", "keras"), ("tensorflow", "keras"),
    ("TensorFlow", "keras"), ("flax", "jax"), ("paddlepaddle", "paddle"), ("NumPy", "numpy")])
def test_backend_takes_the_names_users_type(name, backend):
    from unifiedamp import _registry

    assert _registry.resolve(name).name == backend


@pytest.mark.parametrize("typo, suggestion", [
    ("pytroch", "'pytorch', that is 'torch'"), ("tensorflo", "'tensorflow', that is 'keras'"),
    ("jx", "'jax'"), ("paddel", "'paddle'")])
def test_a_misspelt_backend_gets_a_did_you_mean(typo, suggestion):
    from unifiedamp import UnknownBackendError

    with pytest.raises(UnknownBackendError, match=f"did you mean {suggestion}"):
        GradScaler(backend=typo)


def test_imperative_accessors_update_and_restore_return_the_scaler_itself():
    scaler = GradScaler(8.0, backend="numpy")
    assert scaler.set_growth_factor(4.0) is scaler and scaler.get_growth_factor() == 4.0
    assert scaler.update(True) is scaler and scaler.num_steps == 1
    assert scaler.restore(GradScaler(2.0, backend="numpy").state_dict()) is scaler
    assert scaler.get_scale() == 2.0


def test_the_accessors_are_written_once():
    # Each backend class takes them from GradScaler (torch's and paddle's own, which come
    # first in their MRO, are replaced by these).
    from unifiedamp.backends.numpy import NumpyGradScaler

    for name in ("get_growth_factor", "set_growth_factor", "get_backoff_factor",
                 "set_backoff_factor", "get_growth_interval", "set_growth_interval",
                 "get_hysteresis", "set_hysteresis"):
        assert getattr(NumpyGradScaler, name) is getattr(GradScaler, name), name


@pytest.mark.parametrize("backend", ["jax", "mlx"])
def test_functional_setters_return_a_new_scaler_and_leave_this_one(backend):
    pytest.importorskip(backend)
    scaler = GradScaler(8.0, backend=backend).update(False)
    changed = scaler.set_growth_factor(4.0).set_hysteresis(2)
    assert changed is not scaler and type(changed) is type(scaler)
    assert (scaler.get_growth_factor(), scaler.get_hysteresis()) == (2.0, 1)
    assert (changed.get_growth_factor(), changed.get_hysteresis()) == (4.0, 2)
    assert changed.state == scaler.state and changed.num_steps == scaler.num_steps == 1
    with pytest.raises(ValueError, match="growth_factor"):
        scaler.set_growth_factor(0.5)
    restored = scaler.restore(GradScaler(2.0, backend=backend).state_dict())
    assert restored is not scaler and restored.get_scale() == 2.0 and scaler.get_scale() == 4.0
