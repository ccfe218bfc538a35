"""The unifiedamp command talks: on a terminal, ``conformance``, ``backends`` and ``demo`` say
on stderr what runs, per backend, with its time, and how each ended; piped or with ``--json``
they print exactly their report and nothing else. Every subcommand and option has help text.

The commands run in real subprocesses whose stderr is a pseudo-terminal; frameworks are left
out (``sitecustomize``, as in test_cli_errors.py) to keep the runs short.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pty
import re
import subprocess
import sys
import threading

import pytest

from unifiedamp.cli import _parser
from unifiedamp.cli.backends import print_backends


def hidden(tmp_path, *modules: str) -> dict[str, str]:
    """An environment in which ``modules`` are not installed (``find_spec`` says None)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules))
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                        os.environ.get("PYTHONPATH")]))}


def on_terminal(*args: str, env: dict | None = None) -> tuple[int, str, str]:
    """Runs ``unifiedamp ARGS`` with stderr on a pseudo-terminal: exit status, stdout, and
    stderr as written (``\\r`` rewrites included)."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "unifiedamp.cli", *args],
                            stdout=subprocess.PIPE, stderr=secondary, text=True,
                            env={**os.environ, **(env or {})})
    os.close(secondary)
    chunks: list[bytes] = []

    def read() -> None:  # until the child's end closes the terminal (EIO)
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    out, _ = proc.communicate(timeout=600)
    reader.join(timeout=60)
    os.close(primary)
    # The terminal turns "\n" into "\r\n".
    return proc.returncode, out, b"".join(chunks).decode().replace("\r\n", "\n")


def piped(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "unifiedamp.cli", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


def shown(stderr: str) -> list[str]:
    """The lines a terminal keeps: each line's text after its last carriage return."""
    lines = [line.rpartition("\r")[2].replace("\x1b[K", "") for line in stderr.split("\n")]
    return [line for line in lines if line]


# ---------------------------------------------------------------- help text


def test_every_subcommand_and_every_option_has_help_text():
    missing = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        if not parser.description:
            missing.append(f"{path}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {choice.dest for choice in action._choices_actions if choice.help}
                for name, sub in action.choices.items():
                    if name not in helped:
                        missing.append(f"{path} {name}: no help in the command list")
                    walk(sub, f"{path} {name}")
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")

    parser = _parser()
    walk(parser, "unifiedamp")
    assert missing == []
    # Every subcommand was walked (a subcommand added without add_parser would not be).
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"backends", "spec", "conformance", "plot", "port",
                                "port-state", "demo"}


# ---------------------------------------------------------------- conformance


def test_conformance_on_a_terminal_says_what_runs_and_how_each_backend_ended(tmp_path):
    # Each test of the column's pytest run lasts 50 ms at least (a plugin of its own), so
    # that the live line is drawn while they run however fast the machine: NumPy's column
    # can end within the first tick.
    (tmp_path / "slow_tests.py").write_text(
        "import time\n\ndef pytest_runtest_teardown(item):\n    time.sleep(0.05)\n")
    env = {"PYTEST_PLUGINS": "slow_tests", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    code, out, err = on_terminal("conformance", "--backend", "numpy", "--max-examples", "2",
                                 env=env)
    assert code == 0 and out.splitlines()[-1] == "result: PASS", out
    tests = len(re.findall(r"^test_", out, re.M))
    assert re.fullmatch(rf"numpy: PASS, {tests} tests \(\d+\.\d s\)", shown(err)[-1]), err
    # The live line, rewritten in place, with the elapsed time and the column's count.
    assert re.search(rf"\rconformance \d+ s: numpy \d+ s \(\d+/{tests} tests\)", err), err


# ---------------------------------------------------------------- backends


def test_backends_on_a_terminal_names_each_import_with_its_time(tmp_path):
    env = hidden(tmp_path, "torch", "paddle", "keras", "jax", "mlx")
    code, out, err = on_terminal("backends", env=env)
    assert code == 0 and out.startswith("backend  installed"), out + err
    assert re.fullmatch(r"numpy: importable, devices cpu \(\d+\.\d s\)", shown(err)[-1]), err
    assert err.startswith("\rbackends 0 s: ")  # the live line, from the start
    assert "torch" not in err  # not installed: no import to wait for
    # Piped, or with --json: the table or the JSON, and not a byte more.
    proc = piped("backends", env=env)
    assert proc.stdout == out and proc.stderr == ""
    code, out, err = on_terminal("backends", "--json", env=env)
    assert code == 0 and err == "" and json.loads(out)[0]["backend"] == "numpy"
    code, _, err = on_terminal("backends", "--no-progress", env=env)
    assert code == 0 and err == ""
    # --progress into a log: a line when each backend starts and ends, no rewriting.
    proc = piped("backends", "--progress", env=env)
    assert re.fullmatch(r"numpy: running\nnumpy: importable, devices cpu \(\d+\.\d s\)\n",
                        proc.stderr), proc.stderr


@pytest.mark.slow
def test_keras_devices_are_those_of_the_framework_keras_runs_on(tmp_path, capsys):
    if not all(importlib.util.find_spec(m) for m in ("keras", "jax")):
        pytest.skip("needs keras and jax (the command imports them, this process does not)")
    env = {**hidden(tmp_path, "torch", "paddle", "mlx"), "KERAS_BACKEND": "jax"}
    proc = piped("backends", "--json", env=env)
    report = {e["backend"]: e for e in json.loads(proc.stdout)}
    keras, jax = report["keras"], report["jax"]
    assert keras["importable"] and keras["runs_on"] == "jax", keras
    assert keras["runs_on_version"] == jax["version"]
    # Keras names jax's devices platform:id, as jax's own str() does.
    assert keras["devices"] == jax["devices"] == ["cpu:0"], (keras, jax)
    print_backends(list(report.values()))  # the table of the same report
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("keras "))
    assert re.split(r"\s{2,}", row)[2:4] == [
        f"keras {keras['version']} on jax {jax['version']}", "cpu:0"], row


def test_a_frameworks_version_is_found_under_the_distribution_that_installs_it():
    # Keras may run on tensorflow installed as tensorflow-cpu: its version, by the module.
    import importlib.metadata
    import importlib.util

    from unifiedamp.cli.backends import _framework_version

    if importlib.util.find_spec("tensorflow") is None:  # found, not imported
        pytest.skip("tensorflow is not installed")
    dists = importlib.metadata.packages_distributions()["tensorflow"]
    assert _framework_version("tensorflow") == importlib.metadata.version(dists[0])
    assert _framework_version("numpy") == importlib.metadata.version("numpy")
    assert _framework_version("no-such-framework") is None


# ---------------------------------------------------------------- demo


def test_demo_on_a_terminal_says_which_framework_trains_and_how_it_ended():
    args = ("demo", "--backend", "numpy", "--steps", "12", "--out", "none")
    code, out, err = on_terminal(*args)
    assert code == 0 and out.splitlines()[-1] == "result: PASS", out + err
    assert re.fullmatch(r"numpy: 12 steps, 1 skipped, matches the spec \(\d+\.\d s\)",
                        shown(err)[-1]), err
    assert err.startswith("\rdemo 0 s: ")  # the live line (numpy trains in under a second)
    proc = piped(*args)
    assert proc.stdout.replace(re.search(r"\d+\.\d s", proc.stdout)[0], "") == \
        out.replace(re.search(r"\d+\.\d s", out)[0], "")
    assert proc.stderr == ""
    code, out, err = on_terminal(*args, "--json")
    assert code == 0 and err == "" and json.loads(out)["passed"]
