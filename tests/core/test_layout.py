"""The tests' shape: one folder per session, each importing only its frameworks, no process
machinery, no test file too long to read.

A session is one pytest process (tools/run_tests.py): paddle and tensorflow cannot share
one, and Keras's backend is fixed at its import. Imports are read from the code (the module
and its functions, ``pytest.importorskip`` included), not from the strings a test runs in
another process.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
sys.path.insert(0, str(ROOT / "tools"))
import run_tests  # noqa: E402  (tools/run_tests.py)

#: Framework modules, by the top-level name an import uses.
TORCH = {"torch", "lightning", "pytorch_lightning", "accelerate", "transformers", "deepspeed",
         "megatron", "colossalai"}
JAX = {"jax", "jaxlib", "flax", "optax", "jmp", "orbax"}
KERAS = {"keras", "tensorflow", "tf_keras"}
FRAMEWORKS = TORCH | JAX | KERAS | {"paddle", "mlx", "mindspore", "praxis", "paxml"}
#: unifiedamp's modules that import a framework when imported.
LIBRARY = {"unifiedamp.backends.torch": "torch", "unifiedamp.backends.paddle": "paddle",
           "unifiedamp.backends.jax": "jax", "unifiedamp.backends.mlx": "mlx",
           "unifiedamp.backends.keras": "keras", "unifiedamp.callbacks.lightning": "torch",
           "unifiedamp.callbacks.accelerate": "torch", "unifiedamp.callbacks.keras": "keras"}

#: folder -> the frameworks its tests may import in process.
ALLOWED = {
    "core": set(),
    "torch": TORCH,
    "paddle": {"paddle"},
    "jax": JAX,
    "mlx": {"mlx"},
    "mindspore": {"mindspore"},
    "keras": KERAS | JAX | TORCH,   # Keras on each of its backends
    "cross": FRAMEWORKS - {"praxis", "paxml"},
    "distributed": FRAMEWORKS - {"praxis", "paxml"},
    "praxis": JAX | {"praxis", "paxml"},
}
MAX_TEST_LINES = 800


def imported(path: pathlib.Path) -> set[str]:
    """The frameworks a Python file imports, at the top or in a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "importorskip" and node.args
              and isinstance(node.args[0], ast.Constant)):
            names = [str(node.args[0].value)]
        for name in names:
            if name.split(".")[0] in FRAMEWORKS:
                out.add(name.split(".")[0])
            for module, framework in LIBRARY.items():
                if name == module or name.startswith(module + "."):
                    out.add(framework)
    return out


def folders() -> list[str]:
    return sorted(p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "support"
                  and not p.name.startswith((".", "__")))


def test_every_folder_is_a_session_and_every_session_a_folder():
    sessions = {folder.split("/")[1] for _, folder, _ in run_tests.SESSIONS.values()}
    assert set(folders()) == sessions | {"praxis"}, set(folders()) ^ (sessions | {"praxis"})
    assert set(ALLOWED) == set(folders())


@pytest.mark.parametrize("folder", folders())
def test_a_folder_imports_only_its_frameworks(folder):
    wrong = {}
    for path in sorted((TESTS / folder).rglob("*.py")):
        extra = imported(path) - ALLOWED[folder]
        if extra:
            wrong[path.name] = sorted(extra)
        if folder in ("cross", "distributed") and "paddle" in imported(path):
            assert not imported(path) & KERAS, f"{path.name}: paddle and tensorflow/keras"
    assert not wrong, f"tests/{folder} imports frameworks of another session: {wrong}"


def test_the_import_check_sees_an_import_in_a_function_and_importorskip(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text("import numpy\n\ndef test():\n    import torch.nn\n"
                    "    from unifiedamp.backends.keras import KerasGradScaler\n"
                    "    pytest.importorskip('paddle')\n    code = 'import jax'\n")
    assert imported(path) == {"torch", "keras", "paddle"}


def test_no_test_file_is_too_long_to_read():
    long = [f"{p.relative_to(TESTS)} ({n})" for p in sorted(TESTS.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_TEST_LINES]
    assert not long, f"test files over {MAX_TEST_LINES} lines (split them by topic): {long}"


def test_no_process_machinery_in_the_package_or_the_tests():
    """Processes start with subprocess or a framework's launcher; nothing forks an
    interpreter that imported a framework (unsafe on macOS) or serves forks."""
    found = []
    for path in [*sorted((ROOT / "src").rglob("*.py")), *sorted(TESTS.rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr in ("fork", "forkpty")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def test_every_module_that_imports_a_framework_has_its_doctests_in_a_session():
    """The ``core`` session collects the doctests of every module no other session claims:
    a module importing a framework at its top would import it there."""
    claimed = [f"{run_tests.PACKAGE}/{m}" for _, _, mods in run_tests.SESSIONS.values()
               for m in mods] + [f"{run_tests.PACKAGE}/{m}" for m in run_tests.OWN_ENVIRONMENT]
    unclaimed = []
    for path in sorted((ROOT / run_tests.PACKAGE).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if any(rel == c or rel.startswith(c + "/") for c in claimed):
            continue
        for node in ast.parse(path.read_text(), rel).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     and not node.level else [])
            if any(name.split(".")[0] in FRAMEWORKS for name in names):
                unclaimed.append(rel)
    assert not unclaimed, f"modules importing a framework, collected by core: {unclaimed}"


_TEST_PATH = re.compile(r"\btests/[\w/]+\.py(?:::\w+)?")


def test_every_test_path_the_project_names_exists():
    """Docs, docstrings and tools cite tests by path (``tests/torch/test_x.py::test_y``):
    each file exists and defines the test it names."""
    sources = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "mkdocs.yml",
               *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "src").rglob("*.py")),
               *sorted((ROOT / "tools").glob("*.py")), *sorted((ROOT / "tools").glob("*.sh"))]
    missing = []
    for source in sources:
        for cited in sorted(set(_TEST_PATH.findall(source.read_text()))):
            path, _, name = cited.partition("::")
            file = ROOT / path
            if not file.exists() or (name and not re.search(
                    rf"^\s*(?:async )?def {name}\b|^class {name}\b", file.read_text(), re.M)):
                missing.append(f"{source.relative_to(ROOT)}: {cited}")
    assert not missing, "\n".join(missing)
