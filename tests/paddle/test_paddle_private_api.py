"""Paddle's private API the backend relies on: the installed paddle still has what
``backends/paddle/_compat.py`` lists, and no other module of the backend names any of it."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import pathlib

import pytest

paddle = pytest.importorskip("paddle")

from unifiedamp.backends.paddle import _compat  # noqa: E402

#: The backend's package: the modules the checks below read.
PACKAGE = pathlib.Path(_compat.__file__).parent


def private_surface_changes(amp_scaler_cls):
    """What of the private API ``backends/paddle/_compat.py`` lists the installed Paddle no
    longer has; ``amp_scaler_cls`` is paddle.amp.GradScaler or a stand-in for a release."""
    changes = [f"no {module}.{name}" for module, name in _compat.PRIVATE_IMPORTS
               if not hasattr(importlib.import_module(module), name)]
    from paddle import _C_ops  # the kernel, in the private module listed above

    if not hasattr(_C_ops, "check_finite_and_unscale_"):
        changes.append("no _C_ops.check_finite_and_unscale_")
    objects = {"tracer": paddle.base.framework._dygraph_tracer(),
               "paddle.Tensor": paddle.to_tensor([1.0]),
               "paddle.optimizer.Optimizer": paddle.optimizer.SGD(
                   parameters=paddle.nn.Linear(1, 1).parameters())}
    changes += [f"no {kind}.{name}" for kind, name in _compat.PRIVATE_ATTRIBUTES
                if not hasattr(objects[kind], name)]
    # Paddle's scaler sets its attributes in __init__ (most only when enabled, which a CPU
    # place refuses), and its own code calls the private methods this backend overrides.
    source = "\n".join(inspect.getsource(klass) for klass in amp_scaler_cls.__mro__
                       if klass is not object)
    changes += [f"{amp_scaler_cls.__name__} no longer sets {name}"
                for name in _compat.NATIVE_ATTRIBUTES if f"self.{name} = " not in source]
    changes += [f"{amp_scaler_cls.__name__} no longer calls {name}()"
                for name in _compat.OVERRIDDEN_METHODS if f"self.{name}(" not in source]
    return changes


def test_paddles_private_surface_is_what_the_backend_was_written_for():
    supported = [r for r in importlib.metadata.requires("unifiedamp")
                 if r.startswith("paddlepaddle") and 'extra == "paddle"' in r]
    changes = private_surface_changes(paddle.amp.GradScaler)
    assert not changes, (
        f"paddle {paddle.__version__} changed the private API that unifiedamp's Paddle "
        f"backend uses: {'; '.join(changes)}. The backend supports "
        f"{supported[0].split(';')[0]} (tested: 3.3.1, CPU build); adapt "
        "unifiedamp/backends/paddle/_compat.py or use a paddle in that range")


def test_the_private_surface_check_sees_a_scaler_that_changed():
    # Shaped like a release whose scaler keeps its flags elsewhere and folds _update into
    # update().
    class NewerAmpScaler:
        def __init__(self):
            self._enable = True
            self._use_dynamic_loss_scaling = True
            self._init_loss_scaling = 65536.0
            self._scale = None
            self._incr_ratio = 2.0
            self._decr_ratio = 0.5
            self._incr_every_n_steps = 2000
            self._decr_every_n_nan_or_inf = 1
            self._incr_count = 0
            self._decr_count = 0
            self._found_inf = None
            self._optimizer_states = {}

        def step(self, optimizer):
            self._unscale(optimizer)

    assert private_surface_changes(NewerAmpScaler) == [
        "NewerAmpScaler no longer sets _cache_found_inf",
        "NewerAmpScaler no longer calls _update()"]


def identifiers(path):
    """Every name a module uses: names, attributes, imports, definitions, and strings that
    are identifiers (``getattr(x, "_name")``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.alias):
            found.update(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(node.module.split("."))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.isidentifier()):
            found.add(node.value)
    return found


def paddle_internals(path):
    """``paddle.base``/``paddle.fluid`` and ``paddle._x`` a module reaches, as dotted paths."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "paddle"):
            parts = ["paddle", node.attr]
        else:
            continue
        if parts[0] == "paddle" and any(p.startswith("_") or p in ("base", "fluid")
                                        for p in parts[1:]):
            found.add(".".join(parts))
    return found


def test_no_module_of_the_paddle_backend_but_compat_names_paddles_private_api():
    modules = sorted(PACKAGE.glob("*.py"))
    assert {p.name for p in modules} >= {"__init__.py", "_scaler.py", "_compat.py"}
    # What the check looks for is there, in the one module allowed to have it.
    assert _compat.PRIVATE_NAMES <= identifiers(PACKAGE / "_compat.py")
    assert paddle_internals(PACKAGE / "_compat.py")
    offenders = {p.name: sorted(identifiers(p) & _compat.PRIVATE_NAMES) + sorted(
                 paddle_internals(p)) for p in modules if p.name != "_compat.py"}
    assert not any(offenders.values()), (
        f"Paddle's private API used outside backends/paddle/_compat.py: {offenders}; add a "
        "function to _compat.py (and its name to its lists) and call that")
