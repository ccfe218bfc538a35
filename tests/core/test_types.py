"""What editors see of ``unifiedamp.GradScaler(...)``: the backend's class, for mypy and pyright.

The metaclass dispatches at run time; type checkers read the overloads of
``GradScaler.__new__``. A metaclass ``__call__`` visible to them would hide those overloads
from pyright (and Pylance), which would then type every scaler as ``Any``: no completion,
no error. Both checkers read the same small file here.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

PROBE = """\
import unifiedamp as ua
from unifiedamp.backends.jax import JaxGradScaler

reveal_type(ua.GradScaler(1024.0, backend="torch"))
reveal_type(ua.GradScaler(backend="jax"))
reveal_type(ua.GradScaler(backend="mlx"))
reveal_type(ua.GradScaler("cuda"))
reveal_type(ua.GradScaler(8.0))
reveal_type(JaxGradScaler(8.0))
reveal_type(ua.GradScaler(backend="numpy", history=4).overflow_report())
"""
# The type of each reveal_type line, in order, by its class's name.
EXPECTED = ["TorchGradScaler", "JaxGradScaler", "MlxGradScaler", "TorchGradScaler",
            "GradScaler", "JaxGradScaler", "OverflowReport | None"]


def short(type_name: str) -> str:
    """``unifiedamp.backends.torch._scaler.TorchGradScaler`` -> ``TorchGradScaler``."""
    return " | ".join(part.rsplit(".", 1)[-1] for part in type_name.split(" | "))


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_reads_the_backend_class_of_each_constructor_call(tmp_path):
    from mypy import api

    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    # In process; the repository's configuration and cache (tools/typecheck.py uses them too).
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), str(probe)])
    revealed = [short(line.split('Revealed type is "', 1)[1].rstrip('"'))
                for line in out.splitlines() if "Revealed type is" in line]
    assert status == 0, out + err
    assert revealed == EXPECTED, out


@pytest.mark.skipif(importlib.util.find_spec("basedpyright") is None,
                    reason="basedpyright is not installed (the test extra)")
def test_pyright_reads_the_backend_class_of_each_constructor_call(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    # pyright's own defaults (basedpyright's are stricter), on the Python CI runs.
    config = tmp_path / "pyrightconfig.json"
    config.write_text(json.dumps({"typeCheckingMode": "standard", "pythonVersion": "3.11"}))
    # pyright is a Node.js program: it runs in a process of its own.
    proc = subprocess.run(
        [sys.executable, "-m", "basedpyright", "--outputjson", "--pythonpath", sys.executable,
         "--project", str(config), str(probe)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    messages = [d["message"] for d in report["generalDiagnostics"]]
    revealed = [short(m.rsplit(' is "', 1)[1].rstrip('"'))
                for m in messages if m.startswith("Type of ")]
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    assert not errors, errors
    assert revealed == EXPECTED, messages


def test_typecheck_fails_on_the_librarys_pyright_errors_only():
    """tools/typecheck.py lists the frameworks' packaging and annotation errors apart: an
    error in the package, or in a doc block about a unifiedamp type, fails the check."""
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "tools" / "typecheck.py")
    typecheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(typecheck)
    library = typecheck.is_library_error

    def error(message, rule="reportAttributeAccessIssue"):
        return {"message": message, "rule": rule}

    assert library(error('Cannot access attribute "x" for class "object"'), in_block=False)
    assert not library(error('"Group" is not exported', "reportPrivateImportUsage"),
                       in_block=False)
    assert library(error('Cannot access attribute "foo" for class "TorchGradScaler"'),
                   in_block=True)
    assert library(error('Type "ScalerState" is not assignable to "int"'), in_block=True)
    assert not library(error('"Literal[0]" is not assignable to "str" (Keras fit verbose)'),
                       in_block=True)
    assert not library(error('Import "praxis" could not be resolved', "reportMissingImports"),
                       in_block=True)
