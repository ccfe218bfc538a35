"""Every backend has every member GradScaler declares, with its signature and its
read-only-ness, and no public member GradScaler does not declare beyond the few listed
here (the framework's own names, kept for porting). A member added to one backend only
fails here: declare it in GradScaler (as an optional capability if only some backends
can have it) or list it below with the reason."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import pathlib

import pytest
from _shared_child import shared_result

from unifiedamp import GradScaler
from unifiedamp._scaler import OPTIONAL_MEMBERS

BACKENDS = ["numpy", "torch", "paddle", "keras", "jax", "mlx"]

#: Public names a backend has beyond GradScaler's, each the framework's own or
#: a backend's own tool (docs/backends.md lists them).
EXTRAS = {
    "numpy": set(),
    # torch.amp.GradScaler's state dict and which update path runs.
    "torch": {"uses_native_update"},
    # paddle.amp.GradScaler's own names for the accessors, and the native scaler.
    "paddle": {"get_decr_every_n_nan_or_inf", "get_decr_ratio", "get_incr_every_n_steps",
               "get_incr_ratio", "get_init_loss_scaling", "is_enable",
               "is_use_dynamic_loss_scaling", "native", "set_decr_every_n_nan_or_inf",
               "set_decr_ratio", "set_incr_every_n_steps", "set_incr_ratio",
               "set_init_loss_scaling"},
    # The scaler of a loaded model's optimizer, and the optimizer wrap() returned.
    "keras": {"of", "optimizer"},
    # The pytree protocol and the array namespace.
    "jax": {"tree_flatten_with_keys", "tree_unflatten", "xp"},
    # apply(optimizer, model, grads, finite): mlx.optimizers' update, undone where not finite.
    "mlx": {"apply", "xp"},
}

DESCRIBE = r'''
import inspect, json, sys
from unifiedamp import _registry
from unifiedamp._scaler import GradScaler

def describe(cls, name):
    attr = inspect.getattr_static(cls, name)
    if isinstance(attr, property):
        return {"kind": "property", "settable": attr.fset is not None}
    kind = "method"
    if isinstance(attr, classmethod):
        kind, attr = "classmethod", attr.__func__
    elif isinstance(attr, staticmethod):
        kind, attr = "staticmethod", attr.__func__
    if not callable(attr):
        return {"kind": "attribute", "type": type(attr).__name__}
    params = [(p.name, p.kind.name, p.default is not inspect.Parameter.empty)
              for p in inspect.signature(attr).parameters.values()]
    return {"kind": kind, "params": params}

cls = GradScaler if sys.argv[1] == "GradScaler" else _registry.load(sys.argv[1])
names = [n for n in dir(cls) if not n.startswith("_")]
ACCESSORS = [f"{verb}_{what}" for verb in ("get", "set")
             for what in ("growth_factor", "backoff_factor", "growth_interval", "hysteresis")]
own = [n for n in ACCESSORS if getattr(cls, n) is not getattr(GradScaler, n)]
options = [p.name for p in inspect.signature(cls).parameters.values()
           if p.kind is p.KEYWORD_ONLY]
print(json.dumps({"members": {n: describe(cls, n) for n in names}, "own_accessors": own,
                  "options": options,
                  "capabilities": sorted(cls.capabilities), "functional": cls.functional,
                  "abstract": sorted(getattr(cls, "__abstractmethods__", ()))}))
'''


@pytest.fixture(scope="session")
def describe(fork_servers, tmp_path_factory):
    """``describe(name)``: DESCRIBE's report on a backend (or ``"GradScaler"``), from one
    process per backend (tensorflow and paddle cannot share one) forked from the server
    that imported its framework, once per session for all workers."""
    from unifiedamp import _registry

    def report(name):
        code = DESCRIBE.replace("sys.argv[1]", repr(name))
        if name != "GradScaler":
            code = f"import {_registry.resolve(name).modules[0]}\n{code}"

        def compute():
            proc = fork_servers.run(code, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            return json.loads(proc.stdout.strip().splitlines()[-1])

        return shared_result(tmp_path_factory, f"interface-{name}", compute)

    return functools.cache(report)


@pytest.fixture(scope="module")
def declared(describe):
    return describe("GradScaler")["members"]


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_has_the_declared_interface(declared, describe, backend):
    report = describe(backend)
    members = report["members"]
    assert not report["abstract"], f"{backend} leaves {report['abstract']} abstract"
    for name, want in declared.items():
        have = members.get(name)
        assert have is not None, f"{backend} has no {name}"
        assert have["kind"] == want["kind"], f"{backend}.{name}: {have} against {want}"
        if want["kind"] == "property":
            assert not have["settable"], f"{backend}.{name} must be read-only"
        if "params" in want:
            n = len(want["params"])
            assert have["params"][:n] == want["params"], \
                f"{backend}.{name}{have['params']} does not start with {want['params']}"
            # More parameters only with defaults, so every declared call still works.
            for extra in have["params"][n:]:
                assert extra[2] or extra[1] in ("VAR_POSITIONAL", "VAR_KEYWORD"), \
                    f"{backend}.{name}: extra parameter {extra[0]} needs a default"
    undeclared = set(members) - set(declared) - EXTRAS[backend]
    assert not undeclared, (f"{backend} has public members GradScaler does not declare: "
                            f"{sorted(undeclared)}")
    assert not report["own_accessors"], f"{backend} writes its own {report['own_accessors']}"
    assert set(report["capabilities"]) <= set(OPTIONAL_MEMBERS)
    assert report["functional"] is (backend in ("jax", "mlx"))


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


def _typed_constructors():
    """What the ``__new__`` overloads under ``TYPE_CHECKING`` give type checkers: for each
    ``Literal`` of backend names, those names and the keyword-only options besides the
    spec's and ``backend``."""
    import unifiedamp._scaler as facade

    spec_options = {"hysteresis", "min_scale", "max_scale", "dynamic", "backend"}
    out = {}
    for node in ast.walk(ast.parse(pathlib.Path(facade.__file__).read_text())):
        if not (isinstance(node, ast.FunctionDef) and node.name == "__new__"):
            continue
        keyword = {a.arg: a.annotation for a in node.args.kwonlyargs}
        literal = keyword.get("backend")
        if isinstance(literal, ast.Subscript) and getattr(literal.value, "id", "") == "Literal":
            elts = literal.slice.elts if isinstance(literal.slice, ast.Tuple) else [literal.slice]
            names = [e.value for e in elts if isinstance(e, ast.Constant)]
            out[names[0]] = (names, {k for k in keyword if k not in spec_options})
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_typed_constructor_names_each_backends_options(backend, describe):
    from unifiedamp import _registry

    names, typed = _typed_constructors()[backend]
    assert {_registry.resolve(name).name for name in names} == {backend}
    options = set(describe(backend)["options"])
    assert typed == options - {"hysteresis", "min_scale", "max_scale", "dynamic"}, \
        f"the {backend} overload of GradScaler.__new__ does not list {backend}'s options"


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
