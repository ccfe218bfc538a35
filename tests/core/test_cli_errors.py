"""The unifiedamp command is honest: a backend that did not run fails a run that asked for it,
a broken framework is not "installed", a closed pipe is quiet, bad arguments are usage errors.

Frameworks are made absent or broken for the command's processes (and their subprocesses) by a
``sitecustomize`` and a package on PYTHONPATH, never by a mock of the framework.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

OSERROR = "libfake.so: cannot open shared object file"


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "unifiedamp.cli", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


@pytest.fixture
def frameworks(tmp_path):
    """``frameworks(hidden=..., broken=...)``: an environment in which each hidden framework is
    not installed (``find_spec`` says None) and each broken one is found but its import raises
    OSError, as a torch whose shared libraries failed to install does."""

    def make(hidden: tuple[str, ...] = (), broken: tuple[str, ...] = ()) -> dict[str, str]:
        (tmp_path / "sitecustomize.py").write_text(
            "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in hidden))
        for module in broken:
            (tmp_path / module).mkdir()
            (tmp_path / module / "__init__.py").write_text(f"raise OSError({OSERROR!r})\n")
        return {"PYTHONPATH": str(tmp_path)}

    return make


# ---------------------------------------------------------------- a backend that did not run


def test_an_explicitly_requested_backend_that_is_not_installed_fails_the_run(frameworks):
    env = frameworks(hidden=("torch",))
    proc = cli("conformance", "--backend", "torch", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("torch: not installed (requested with --backend, so the run fails): "
            "pip install 'unifiedamp[torch]'") in proc.stdout
    assert proc.stdout.splitlines()[-1] == "result: FAIL (not run: torch: not installed)"
    proc = cli("conformance", "--backend", "torch", "--json", env=env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["passed"] is False
    assert report["backends"]["torch"]["status"] == "not installed"
    assert report["not_run"] == {"torch": "not installed"}


def test_all_known_backends_leave_a_missing_framework_as_a_cell_and_say_so(frameworks):
    env = frameworks(hidden=("torch", "paddle", "keras", "jax", "mlx"))
    proc = cli("conformance", "--max-examples", "2", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["test", "rule", "numpy", "torch", "paddle", "keras", "jax",
                                "mlx"]
    row = next(line for line in lines if line.startswith("test_vector[static"))
    assert re.split(r"\s{2,}", row)[1:] == ["static mode", "pass"] + ["not installed"] * 5
    assert ("mlx: not installed (not requested with --backend, so the run does not fail): "
            "pip install 'unifiedamp[mlx]'") in lines
    assert lines[-1] == "result: PASS (not run: torch, paddle, keras, jax, mlx: not installed)"


@pytest.mark.slow
def test_a_framework_whose_import_fails_is_not_importable(frameworks):
    # Keras and paddle hidden too: what is checked is torch's row and that the others go on.
    env = frameworks(hidden=("jax", "mlx", "keras", "paddle"), broken=("torch",))
    proc = cli("backends", env=env)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("torch "))
    assert row.split()[:3] == ["torch", "not", "importable"]
    assert f"torch: installed but not importable: OSError: {OSERROR}" in proc.stdout
    report = {e["backend"]: e for e in json.loads(cli("backends", "--json", env=env).stdout)}
    assert report["torch"]["installed"] is True and report["torch"]["importable"] is False
    assert f"OSError: {OSERROR}" in report["torch"]["error"]
    assert report["numpy"]["importable"] is True and report["jax"]["installed"] is False

    proc = cli("conformance", "--backend", "torch", env=env)
    assert proc.returncode == 1
    assert "torch: not importable (requested with --backend, so the run fails): " in proc.stdout
    assert f"OSError: {OSERROR}" in proc.stdout and "INTERNALERROR" not in proc.stdout


# ---------------------------------------------------------------- pipes and arguments


@pytest.mark.parametrize("command", [("backends", "--json"), ("spec", "--format", "json")])
def test_a_closed_pipe_ends_the_command_quietly(command, frameworks):
    env = frameworks(hidden=("torch", "paddle", "keras", "jax", "mlx"))  # numpy's row is enough
    proc = subprocess.Popen([sys.executable, "-m", "unifiedamp.cli", *command], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **env})
    proc.stdout.close()  # like `| head` that has already exited: every write is EPIPE
    stderr = proc.stderr.read()
    # 1, as Python's own documentation of SIGPIPE handling exits
    assert proc.wait(timeout=600) == 1 and stderr == ""


@pytest.mark.parametrize("name, message", [
    ("nmpy", "Unknown backend 'nmpy' (did you mean 'numpy'?); available: ['jax', 'keras', "
             "'mlx', 'numpy', 'paddle', 'torch'] (also flax, np, optax, paddlepaddle, paxml, "
             "praxis, pytorch, tensorflow, tf, tf.keras), or 'module:Class'"),
    (":", "backend ':' is not a 'module:Class' target"),
])
def test_a_backend_that_cannot_exist_is_a_one_line_usage_error(name, message):
    proc = cli("conformance", "--backend", "numpy", "--backend", name)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1].startswith(
        f"unifiedamp conformance: error: argument --backend: {message}")


def test_a_target_that_is_no_scaler_class_is_an_error_cell_naming_the_fix():
    proc = cli("conformance", "--backend", "builtins:print", "--backend", "numpy",
               "--max-examples", "2")
    assert proc.returncode == 1 and "INTERNALERROR" not in proc.stdout
    assert ("builtins:print: error: pytest exited with 4: ERROR: builtins:print: builtins:print "
            "is neither a unifiedamp.GradScaler subclass nor a conformance adapter: it has no "
            "new, iterate, read, snapshot (docs/conformance.md, 'Adapters and capabilities')"
            ) in proc.stdout


@pytest.mark.parametrize("value", ["0", "-3", "many", "2.5"])
def test_max_examples_must_be_an_integer_of_at_least_one(value):
    proc = cli("conformance", "--backend", "numpy", "--max-examples", value)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == (
        "unifiedamp conformance: error: argument --max-examples: must be an integer >= 1 "
        f"(hypothesis examples per property), got {value!r}")


@pytest.mark.parametrize("argv", [[], ["banana"], ["numpy", "torch"]])
def test_the_backends_subprocess_command_answers_a_wrong_call_in_one_line(argv):
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "_worker", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "takes one backend name" in proc.stderr and "unifiedamp backends" in proc.stderr
