"""Every backend has every member GradScaler declares, with its signature and its
read-only-ness, and no public member GradScaler does not declare beyond the few listed
here (the framework's own names, kept for porting): the description of a scaler class, and
the checks each backend's session instantiates with its ``backend`` (tests/cross for NumPy,
torch, Paddle, JAX and MLX; tests/keras for Keras, once per ``KERAS_BACKEND``)."""

from __future__ import annotations

import ast
import functools
import inspect
import pathlib

import pytest

from unifiedamp import GradScaler, _registry
from unifiedamp._scaler import OPTIONAL_MEMBERS

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

ACCESSORS = [f"{verb}_{what}" for verb in ("get", "set")
             for what in ("growth_factor", "backoff_factor", "growth_interval", "hysteresis")]


def _member(cls, name):
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


@functools.cache
def describe(name: str) -> dict:
    """A backend's scaler class (or ``"GradScaler"``), described: its public members (kind,
    parameters, settable), the accessors it writes itself, its keyword-only options, its
    capabilities, whether it is functional, what it leaves abstract. Computed once per
    process and name."""
    cls = GradScaler if name == "GradScaler" else _registry.load(name)
    names = [n for n in dir(cls) if not n.startswith("_")]
    # An accessor a framework's base class defines (torch.amp.GradScaler's set_growth_factor
    # returns None and skips the spec's validation) must not win the MRO.
    own = [n for n in ACCESSORS
           if not next(c for c in cls.__mro__ if n in vars(c)).__module__.startswith("unifiedamp")]
    options = [p.name for p in inspect.signature(cls).parameters.values()
               if p.kind is p.KEYWORD_ONLY]
    return {"members": {n: _member(cls, n) for n in names}, "own_accessors": own,
            "options": options, "capabilities": sorted(cls.capabilities),
            "functional": cls.functional,
            "abstract": sorted(getattr(cls, "__abstractmethods__", ()))}


def typed_constructors():
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


class InterfaceContract:
    """``backend``: a built-in backend's name; its framework is imported by the session."""

    backend: str | None = None

    @pytest.fixture
    def declared(self):
        return describe("GradScaler")["members"]

    @pytest.fixture
    def report(self):
        """The description of this backend's scaler class (described once per process)."""
        return describe(self.backend)

    def test_backend_has_the_declared_interface(self, declared, report):
        backend = self.backend
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
        assert not report["own_accessors"], \
            f"{backend} takes {report['own_accessors']} from its framework's class"
        assert set(report["capabilities"]) <= set(OPTIONAL_MEMBERS)
        assert report["functional"] is (backend in ("jax", "mlx"))

    def test_the_typed_constructor_names_each_backends_options(self, report):
        backend = self.backend
        names, typed = typed_constructors()[backend]
        assert {_registry.resolve(name).name for name in names} == {backend}
        options = set(report["options"])
        assert typed == options - {"hysteresis", "min_scale", "max_scale", "dynamic"}, \
            f"the {backend} overload of GradScaler.__new__ does not list {backend}'s options"
