"""Keras's private API, which the Keras backend overrides and calls, on the session's Keras
backend (the keras session runs once per ``KERAS_BACKEND``; Keras's sources of every
backend are read by each): the methods, parameters and attributes that
``unifiedamp/backends/keras/_compat.py`` lists exist in the installed Keras, the checks see a
change, only ``_compat.py`` touches the private API, and only the torch paths reach into
another backend of the package.
"""

from __future__ import annotations

import pathlib

from keras_helpers import only_on


def keras_private_changes(lso_cls) -> list[str]:
    """How ``lso_cls`` (keras.optimizers.LossScaleOptimizer or a stand-in) differs from the
    private API unifiedamp/backends/keras/_compat.py lists."""
    import inspect

    import keras

    from unifiedamp.backends.keras import _compat

    changes = []
    for table in (_compat.OVERRIDDEN, _compat.CALLED):
        for name, params in table.items():
            method = getattr(lso_cls, name, None)
            if not callable(method):
                changes.append(f"no method {name}")
                continue
            got = list(inspect.signature(method).parameters)
            if got != params:
                changes.append(f"{name}{tuple(got)}, expected {tuple(params)}")
    apply = inspect.getsource(lso_cls.apply)
    changes += [f"apply() no longer calls {hook}" for hook in ("_tf_apply", "_common_apply")
                if hook not in apply]
    opt = lso_cls(keras.optimizers.SGD())
    opt.build([keras.Variable(1.0)])
    changes += [f"no attribute {a}" for a in _compat.ATTRIBUTES if not hasattr(opt, a)]
    return changes


def test_keras_private_surface_is_what_the_backend_was_written_for(keras):
    import importlib.metadata

    changes = keras_private_changes(keras.optimizers.LossScaleOptimizer)
    extra = {r.split(";")[0] for r in importlib.metadata.requires("unifiedamp")
             if 'extra == "keras"' in r}
    assert not changes, (
        f"keras {keras.__version__} changed the private LossScaleOptimizer API that "
        f"unifiedamp's Keras backend overrides or calls: {'; '.join(changes)}. The keras "
        f"extra ({sorted(extra)}, tested with 3.15) is what the backend supports: adapt "
        "unifiedamp/backends/keras/_compat.py, or install a Keras in that range")
    from unifiedamp.backends.keras import _compat

    assert callable(_compat.no_automatic_dependency_tracking)
    if keras.backend.backend() == "tensorflow":  # the TensorFlow path's question (tf.distribute)
        assert isinstance(_compat.replicas_update_themselves(), bool)


def test_the_private_surface_check_sees_a_changed_hook(keras):
    class NewerLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
        def _stateful_handle_non_finite_grads(self, grads):
            super()._stateful_handle_non_finite_grads()

    assert keras_private_changes(NewerLossScaleOptimizer) == [
        "_stateful_handle_non_finite_grads('self', 'grads'), expected ('self',)"]


def test_the_overrides_take_every_call_shaped_like_keras(keras):
    """Each override takes Keras's parameters first, and any more are optional: two take
    more (the gradients, for diagnose's counts in the skipped branch)."""
    import inspect

    from unifiedamp.backends.keras._compat import OVERRIDDEN, LossScaleOptimizerHooks

    lso = keras.optimizers.LossScaleOptimizer
    overridden = {n for n in vars(LossScaleOptimizerHooks)
                  if n.startswith("_") and not n.startswith("__") and hasattr(lso, n)}
    assert overridden == set(OVERRIDDEN)
    widened = []
    for name, params in OVERRIDDEN.items():
        ours = list(inspect.signature(getattr(LossScaleOptimizerHooks, name)).parameters.values())
        assert [p.name for p in ours[:len(params)]] == params, name
        assert all(p.default is not p.empty for p in ours[len(params):]), name
        if len(ours) > len(params):
            widened.append(name)
    assert widened == ["_stateful_handle_non_finite_grads", "_stateless_handle_non_finite_grads"]


def keras_private_names() -> set[str]:
    """The private names of Keras's optimizers, on every Keras backend: the methods their
    sources define and the attributes they set or read on ``self``, and what a built
    ``LossScaleOptimizer`` holds on this process's backend."""
    import ast

    import keras

    root = pathlib.Path(keras.__file__).parent / "src"
    sources = [*(root / "optimizers").glob("*.py"), *root.glob("backend/*/optimizer.py"),
               *(root / "backend" / "torch" / "optimizers").glob("*.py")]
    names = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                names.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "self"):
                names.add(node.attr)
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    opt.build([keras.Variable(1.0)])
    names |= set(dir(opt)) | set(vars(opt))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_keras_uses(source: str, names: set[str]) -> list[str]:
    """Where ``source`` touches Keras's private API: an import from ``keras.src``, a name of
    ``names`` as an attribute, a method defined (an override) or a getattr string, and
    TensorFlow's ``__internal__``; as ``"line: what"``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Import):
            private = [a.name for a in node.names if a.name.startswith("keras.src")]
            what = f"import {private[0]}" if private else None
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras.src"):
            what = f"from {node.module} import"
        elif isinstance(node, ast.Attribute) and (node.attr in names
                                                  or node.attr == "__internal__"):
            what = f".{node.attr}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            what = f"def {node.name}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            what = f"{node.func.id}(..., {node.args[1].value!r})"
        if what:
            found.append(f"{node.lineno}: {what}")
    return found


def test_only_compat_touches_keras_private_api(keras):
    import unifiedamp.backends.keras as package

    names = keras_private_names()
    assert {"_trainable_variables", "_tf_apply", "_get_variable_index"} <= names
    folder = pathlib.Path(package.__file__).parent
    uses = {path.name: private_keras_uses(path.read_text(), names)
            for path in sorted(folder.glob("*.py")) if path.name != "_compat.py"}
    assert len(uses) >= 8, sorted(uses)
    wrong = {name: found for name, found in uses.items() if found}
    assert not wrong, ("only _compat.py may use Keras's private API (add what is needed "
                       f"there, under a name of ours): {wrong}")


def test_the_private_api_check_sees_each_kind_of_use(keras):
    names = keras_private_names()
    source = ("from keras.src.utils import tracking\n"
              "import keras.src.ops\n"
              "class W:\n"
              "    def _tf_apply(self):\n"
              "        return self._trainable_variables, getattr(self, '_variables')\n"
              "tf.__internal__.distribute\n")
    assert private_keras_uses(source, names) == [
        "1: from keras.src.utils import", "2: import keras.src.ops", "4: def _tf_apply",
        "6: .__internal__", "5: ._trainable_variables", "5: getattr(..., '_variables')"]


@only_on("tensorflow", why="reads the package's sources, the same under every backend: "
         "checked once, in the tensorflow session")
def test_only_the_torch_paths_import_the_torch_backend_and_only_its_two_shared_modules():
    """Keras-on-torch reuses the torch backend's kernel call and overflow counts; nothing
    else of the Keras package reaches into another backend (the shared modules of the
    backends layer, ``unifiedamp.backends._*``, are for every backend)."""
    import ast

    import unifiedamp.backends.keras as package

    folder = pathlib.Path(package.__file__).parent
    allowed = {"_torch.py": {"unifiedamp.backends.torch._compat",
                             "unifiedamp.backends.torch._diagnostics"}}
    wrong, used = [], set()
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[:2] != ["unifiedamp", "backends"] or len(parts) < 3 \
                        or parts[2] == "keras" or parts[2].startswith("_"):
                    continue
                if module in allowed.get(path.name, set()):
                    used.add(module)
                else:
                    wrong.append(f"{path.name}:{node.lineno} imports {module}")
    assert not wrong, wrong
    assert used == allowed["_torch.py"]
