"""Backend table, detection without importing, entry points, missing frameworks, import purity
(real Paddle objects: tests/paddle/test_registry.py; paddle and TensorFlow in one process:
tests/cross/test_registry.py)."""

from __future__ import annotations

import ast
import json
import pathlib
import sys
import textwrap

import numpy as np
import pytest

import unifiedamp as ua
from unifiedamp import _registry
from unifiedamp.backends.numpy import SGD, NumpyGradScaler

FRAMEWORKS = ("torch", "paddle", "tensorflow", "keras", "jax", "mlx", "optax", "flax")


def test_import_unifiedamp_imports_no_framework(run_python):
    code = textwrap.dedent(f"""
        import sys, json
        import unifiedamp, unifiedamp.spec, unifiedamp.cli, unifiedamp.conformance
        scaler = unifiedamp.GradScaler(backend="numpy")
        print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))
    """)
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_import_unifiedamp_does_not_even_import_numpy(run_python):
    proc = run_python("import sys, unifiedamp; print('numpy' in sys.modules)")
    assert proc.stdout.strip() == "False", proc.stderr


def test_facade_returns_the_backend_scaler():
    scaler = ua.GradScaler(8.0, backend="numpy")
    assert type(scaler) is NumpyGradScaler and isinstance(scaler, ua.GradScaler)
    assert scaler.get_scale() == 8.0


def test_backend_detected_from_an_object_type_without_importing():
    assert _registry.detect(np.zeros(2)) == "numpy"
    assert type(ua.GradScaler(backend=np.float32(1.0))) is NumpyGradScaler


def test_subclass_defined_elsewhere_is_detected_through_its_mro():
    class MyOptimizer(np.ndarray):
        pass

    assert _registry.detect(MyOptimizer(1)) == "numpy"


def test_undetectable_object_is_a_clear_error():
    with pytest.raises(ua.UnknownBackendError, match="Cannot tell the framework of .*SGD; pass "
                                                     "backend="):
        ua.GradScaler(backend=SGD([]))


def test_no_framework_imported_means_numpy(run_python):
    proc = run_python("import unifiedamp as ua; print(type(ua.GradScaler()).__name__)")
    assert proc.stdout.strip() == "NumpyGradScaler", proc.stderr


def test_detection_reads_sys_modules_and_asks_when_ambiguous(run_python):
    # Module objects standing in sys.modules: detection must only look, never import.
    code = textwrap.dedent("""
        import sys, types, unifiedamp as ua
        sys.modules["torch"] = types.ModuleType("torch")
        sys.modules["jax"] = types.ModuleType("jax")
        try:
            ua.GradScaler()
        except ua.UnknownBackendError as exc:
            print(type(exc).__name__, exc)
    """)
    proc = run_python(code)
    assert "Several frameworks are imported (torch, jax); pass backend=" in proc.stdout, proc.stderr
    assert proc.stdout.startswith("AmbiguousBackendError ")


def test_keras_claims_the_framework_it_runs_on(run_python):
    code = textwrap.dedent("""
        import os, sys, types
        from unifiedamp import _registry
        os.environ["KERAS_BACKEND"] = "torch"
        sys.modules["keras"] = types.ModuleType("keras")
        sys.modules["torch"] = types.ModuleType("torch")
        print(_registry._imported_frameworks())
    """)
    assert run_python(code).stdout.strip() == "['keras']"


def test_tensorflow_is_another_name_of_the_keras_backend():
    assert _registry.resolve("tensorflow") is _registry.resolve("keras")


def test_unknown_backend_name_lists_the_available_ones():
    with pytest.raises(ua.UnknownBackendError,
                       match=r"Unknown backend 'nmpy' \(did you mean 'numpy'\?\); available: "
                             r"\['jax', 'keras', 'mlx', 'numpy', 'paddle', 'torch'\]"):
        ua.GradScaler(backend="nmpy")


def test_module_class_target_loads_any_class():
    scaler = ua.GradScaler(4.0, backend="unifiedamp.backends.numpy:NumpyGradScaler")
    assert type(scaler) is NumpyGradScaler


def test_module_class_target_must_be_a_gradscaler_subclass(capsys):
    with pytest.raises(ua.UnknownBackendError) as info:
        ua.GradScaler(1.0, 2.0, backend="builtins:print")
    assert capsys.readouterr().out == ""  # print was never called
    assert str(info.value) == (
        "backend 'builtins:print' is builtins.print, not a subclass of unifiedamp.GradScaler; "
        "point backend= at a scaler class that subclasses unifiedamp.GradScaler "
        "(docs/backends.md, 'Third-party backends')")
    with pytest.raises(ua.UnknownBackendError, match="'collections:OrderedDict' is "
                                                     "collections.OrderedDict, not a subclass"):
        _registry.load("collections:OrderedDict")


def test_the_scaler_base_named_by_the_registry_is_unifiedamps():
    assert _registry.load("unifiedamp._scaler:GradScaler") is ua.GradScaler


@pytest.mark.parametrize("target", [":", "mod:", ":Cls", "my mod:Cls", "mod:Cls:x", "mod.:Cls",
                                    "mod:Outer.Inner"])
def test_malformed_module_class_target_names_the_expected_form(target):
    with pytest.raises(ua.UnknownBackendError) as info:
        ua.GradScaler(backend=target)
    assert str(info.value) == (
        f"backend {target!r} is not a 'module:Class' target: expected an importable dotted "
        "module name, one colon, then a class name, as in 'mypackage.amp:MyScaler'")


def test_a_framework_whose_import_raises_oserror_is_a_missing_backend(tmp_path, monkeypatch):
    # As torch does when one of its shared libraries failed to install.
    (tmp_path / "brokenfw.py").write_text("raise OSError('libfake.so: cannot open shared "
                                          "object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ua.MissingBackendError, match=r"backend 'brokenfw:Scaler' cannot be "
                                                     r"imported \(OSError: libfake.so: cannot "
                                                     r"open shared object file\); to use it:"):
        ua.GradScaler(backend="brokenfw:Scaler")


def test_missing_framework_is_an_import_error_saying_what_to_install(run_python):
    code = textwrap.dedent("""
        import sys
        sys.modules["numpy"] = None  # as if numpy were not installed
        import unifiedamp as ua
        try:
            ua.GradScaler(backend="numpy")
        except ImportError as exc:
            print(type(exc).__name__, "|", exc)
    """)
    out = run_python(code).stdout
    assert out.startswith("MissingBackendError | backend 'numpy' cannot be imported")
    assert "to use it: pip install numpy" in out


def test_backend_class_refuses_a_backend_argument():
    with pytest.raises(TypeError, match="is the 'numpy' backend already"):
        NumpyGradScaler(backend="numpy")


def install_third_party(where: pathlib.Path, entry_name: str) -> pathlib.Path:
    """A real installed distribution (dist-info + module) registering an entry point."""
    (where / "thirdscaler.py").write_text(textwrap.dedent("""
        from unifiedamp.backends.numpy import NumpyGradScaler

        class ThirdScaler(NumpyGradScaler):
            backend = "third"
    """))
    info = where / "thirdscaler-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdscaler\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[unifiedamp.backends]\n{entry_name} = thirdscaler:ThirdScaler\n")
    return where


@pytest.fixture
def third_party(tmp_path):
    """A third-party backend registered as 'third'."""
    return install_third_party(tmp_path, "third")


@pytest.fixture
def third_party_named_numpy(tmp_path):
    """A third-party backend whose entry point takes a built-in backend's name."""
    return install_third_party(tmp_path, "numpy")


def test_third_party_backends_register_through_entry_points(third_party, monkeypatch):
    monkeypatch.syspath_prepend(str(third_party))
    assert _registry.entry_points() == {"third": "thirdscaler:ThirdScaler"}
    scaler = ua.GradScaler(8.0, backend="third")
    assert type(scaler).__name__ == "ThirdScaler" and scaler.state_dict()["backend"] == "third"
    assert "third" in _registry.available()


def test_an_entry_point_named_like_a_builtin_backend_does_not_replace_it(
        third_party_named_numpy, monkeypatch):
    monkeypatch.syspath_prepend(str(third_party_named_numpy))
    assert _registry.entry_points() == {"numpy": "thirdscaler:ThirdScaler"}
    assert _registry.available()["numpy"] == _registry.BUILTIN["numpy"]
    assert _registry.load("numpy") is NumpyGradScaler
    assert type(ua.GradScaler(backend="numpy")) is NumpyGradScaler


def test_paddle_objects_are_detected_as_paddle_without_importing_paddle():
    # A stand-in for paddle.optimizer.Adam: detection reads only the type's module name.
    optimizer = type("Adam", (), {"__module__": "paddle.optimizer"})()
    imported = "paddle" in sys.modules
    assert _registry.detect(optimizer) == "paddle"
    assert ("paddle" in sys.modules) == imported


def test_paddle_after_tensorflow_is_refused_instead_of_crashing(run_python):
    code = textwrap.dedent("""
        import sys, types
        from unifiedamp._isolation import ensure_importable
        sys.modules["tensorflow"] = types.ModuleType("tensorflow")
        try:
            ensure_importable("paddle")
        except ImportError as exc:
            print(type(exc).__name__, "|", exc)
    """)
    out = run_python(code).stdout
    assert out.startswith("FrameworkConflictError | paddle cannot be imported after tensorflow")
    assert "import paddle before tensorflow" in out


# ---------------------------------------------------------------- the declared interface


def test_every_public_exception_is_exported_from_unifiedamp():
    src = pathlib.Path(ua.__file__).parent
    defined = {node.name: path.relative_to(src)
               for path in src.rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
               and node.name.endswith(("Error", "Warning"))}
    assert len(defined) >= 7
    missing = {name: str(path) for name, path in defined.items() if name not in ua.__all__}
    assert not missing, f"not exported from unifiedamp: {missing}"
    assert all(issubclass(getattr(ua, name), Exception) for name in defined)


def test_a_backend_missing_an_abstract_member_cannot_be_built():
    class Partial(ua.GradScaler):
        backend = "partial"

        def state_dict(self):
            return {}

    with pytest.raises(TypeError, match="abstract") as info:
        Partial()
    required = {"config", "state", "get_scale", "is_enabled", "scale", "unscale", "where_finite",
                "update", "last_step_skipped", "num_skipped_steps", "num_steps",
                "_reconfigure"}
    assert Partial.__abstractmethods__ == required
    assert all(member in str(info.value) for member in required)


def test_the_conformance_hook_finds_the_adapter_of_a_builtin_base_through_the_table():
    from unifiedamp.conformance.adapters.numpy import NumpyAdapter

    class Mine(NumpyGradScaler):
        pass

    adapter = Mine.conformance_adapter()
    assert type(adapter) is NumpyAdapter and adapter.scaler_cls is Mine
    assert _registry.BUILTIN["numpy"].adapter.endswith("conformance.adapters.numpy:NumpyAdapter")


def test_the_conformance_hook_of_an_unrelated_backend_says_how_to_provide_one():
    class Alone(ua.GradScaler):
        pass

    with pytest.raises(NotImplementedError, match=r"derives from no built-in backend.*give it "
                                                  r"a conformance_adapter\(\) class method"):
        Alone.conformance_adapter()
