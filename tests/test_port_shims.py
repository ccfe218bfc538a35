"""The former import paths keep working for one release: ``unifiedamp.port``,
``unifiedamp.port_source`` and ``unifiedamp.port_state`` (now ``unifiedamp.porting``) and
``unifiedamp.demo`` (now ``unifiedamp.cli.demo``).

Each warns on import with a DeprecationWarning that names the new path, at the user's import
line, and gives the very objects of the new path; nothing in the package uses them.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import subprocess
import sys

import pytest
from test_architecture import GRAPH

import unifiedamp.cli.demo
import unifiedamp.porting

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "unifiedamp"

#: Each former path: the module that now holds its names, and the names it exported.
FORMER = {
    "unifiedamp.port": (unifiedamp.porting, [
        "NATIVE_SCALERS", "config_from_call", "from_native", "native_call"]),
    "unifiedamp.port_source": (unifiedamp.porting, [
        "CallSite", "PortResult", "TARGETS", "port_source"]),
    "unifiedamp.port_state": (unifiedamp.porting, [
        "FORMS", "LIGHTNING_KEYS", "convert_state", "detect_form", "file_type", "load_file",
        "port_state_file", "read_state", "save_file"]),
    "unifiedamp.demo": (unifiedamp.cli.demo, [
        "BACKENDS", "CONFIG", "OVERFLOW_STEPS", "PERIOD", "demo_report", "expected_history",
        "first_divergence", "forced_overflow", "reference"]),
}


@pytest.mark.parametrize("old", FORMER)
def test_a_former_path_warns_naming_the_new_one_and_gives_the_same_objects(old, monkeypatch):
    new, names = FORMER[old]
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported afresh: its body runs
    with pytest.warns(DeprecationWarning) as record:
        module = importlib.import_module(old)
    messages = [str(w.message) for w in record if w.category is DeprecationWarning]
    assert len(messages) == 1, messages
    assert re.match(rf"{re.escape(old)} is deprecated .*\b{re.escape(new.__name__)}$",
                    messages[0]), messages[0]
    assert sorted(module.__all__) == sorted(names)
    for name in names:
        assert getattr(module, name) is getattr(new, name), name


def test_the_warning_points_at_the_line_that_imports_the_former_path(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os\n"
                      "from unifiedamp.port import config_from_call\n"
                      "import unifiedamp.port_state\n"
                      "from unifiedamp import port_source, demo\n")
    proc = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for line, old in ((2, "port"), (3, "port_state"), (4, "port_source"), (4, "demo")):
        assert f"{script}:{line}: DeprecationWarning: unifiedamp.{old} is deprecated" \
            in proc.stderr, proc.stderr


CODE = re.compile(r"(from|import)\s+unifiedamp\.(port|port_source|port_state|demo)\b"
                  r"|from\s+unifiedamp\s+import\s+(port|port_source|port_state|demo)\b")


def test_no_test_imports_a_former_path():
    # The suite's filters ignore these warnings (collecting the doctests imports every
    # module): a test that still used a former path would pass unnoticed.
    for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
        if path.name != pathlib.Path(__file__).name:
            found = CODE.search(path.read_text())
            assert found is None, f"{path.name} imports a former path: {found.group(0)}"


def test_nothing_in_the_package_uses_a_former_path():
    users = {module: sorted(targets & set(FORMER)) for module, targets in GRAPH.items()
             if targets & set(FORMER) and module not in FORMER}
    assert not users, users
    # Code in strings too: the child processes' sources and their `python -m` commands.
    for path in sorted(SRC.rglob("*.py")):
        if ".".join(path.relative_to(SRC.parent).with_suffix("").parts) in FORMER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in FORMER and not CODE.search(node.value), \
                    f"{path}:{node.lineno} names a former path: {node.value[:200]!r}"
