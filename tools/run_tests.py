"""Runs the test suite: one pytest session per folder of ``tests/``, one after the other.

Each session imports at most the frameworks its folder is about: paddle and tensorflow cannot
share a process, and Keras's backend is fixed when Keras is imported, so ``tests/keras``
runs once per Keras backend. The doctests of the package's modules run in the session of the
framework their examples use, the rest in ``core``.

Usage::

    python tools/run_tests.py                      # every session
    python tools/run_tests.py torch keras-jax      # some sessions
    python tools/run_tests.py -- -n 2 -m "not slow"  # arguments after -- go to pytest

Prints each session's outcome and time, and exits 1 if any session failed.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "src/unifiedamp"

#: name -> (environment, folder of tests, the package's modules whose examples run there).
SESSIONS: dict[str, tuple[dict[str, str], str, list[str]]] = {
    "core": ({}, "tests/core", []),
    "torch": ({}, "tests/torch", [
        "backends/torch", "callbacks/lightning.py", "callbacks/accelerate.py",
        "conformance/adapters/torch.py", "conformance/engines/torch.py"]),
    "paddle": ({}, "tests/paddle", ["backends/paddle", "conformance/adapters/paddle.py"]),
    "jax": ({}, "tests/jax", [
        "backends/jax", "backends/_functional.py", "conformance/adapters/jax.py",
        "conformance/adapters/jax_devices.py"]),
    "mlx": ({}, "tests/mlx", ["backends/mlx.py", "conformance/adapters/mlx.py"]),
    "mindspore": ({}, "tests/mindspore", []),
    "keras-tensorflow": ({"KERAS_BACKEND": "tensorflow"}, "tests/keras", [
        "backends/keras", "callbacks/keras.py", "conformance/adapters/keras.py",
        "conformance/adapters/keras_replicas.py", "porting/_keras_files.py"]),
    "keras-jax": ({"KERAS_BACKEND": "jax"}, "tests/keras", []),
    "keras-torch": ({"KERAS_BACKEND": "torch"}, "tests/keras", []),
    "cross": ({}, "tests/cross", ["porting/_source.py"]),
    "distributed": ({}, "tests/distributed", []),
}

#: Modules no session here can import: Praxis and PaxML have an environment of their own
#: (tools/praxis_env.sh; .ci/run runs tests/praxis there).
OWN_ENVIRONMENT = ["backends/jax/praxis.py", "backends/jax/paxml.py"]


def paths_of(name: str) -> list[str]:
    """What one session collects: its folder and the modules whose doctests it runs."""
    _, folder, doctests = SESSIONS[name]
    paths = [folder, *(f"{PACKAGE}/{path}" for path in doctests)]
    claimed = OWN_ENVIRONMENT
    if name == "core":  # every module no other session claims
        claimed = [p for _, _, mods in SESSIONS.values() for p in mods] + OWN_ENVIRONMENT
        paths.append(PACKAGE)
    return paths + [f"--ignore={PACKAGE}/{path}" for path in claimed]


def session_of(path: str) -> str:
    """The session that runs a test path (``tests/<folder>/test_x.py::test_y``) or a module of
    the package (for its doctests)."""
    path = path.split("::")[0].rstrip("/")
    for name, (_, folder, doctests) in SESSIONS.items():
        if path == folder or path.startswith(folder + "/"):
            return name
        if any(path == f"{PACKAGE}/{m}" or path.startswith(f"{PACKAGE}/{m}/") for m in doctests):
            return name
    return "core"


def command(name: str, pytest_args: list[str], paths: list[str] | None = None) -> list[str]:
    """The pytest command line of one session (``paths``: a part of it)."""
    return [sys.executable, "-m", "pytest", *(paths or paths_of(name)), *pytest_args]


def main(argv: list[str]) -> int:
    names, pytest_args = argv, []
    if "--" in argv:
        names, pytest_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    unknown = [n for n in names if n not in SESSIONS]
    if unknown:
        print(f"unknown session(s) {', '.join(unknown)}: choose from {', '.join(SESSIONS)}",
              file=sys.stderr)
        return 2
    results = []
    for name in names or SESSIONS:
        env, _, _ = SESSIONS[name]
        print(f"\n=== session {name} {' '.join(f'{k}={v}' for k, v in env.items())}", flush=True)
        start = time.perf_counter()
        code = subprocess.call(command(name, pytest_args), cwd=ROOT, env={**os.environ, **env})
        results.append((name, code, time.perf_counter() - start))
    print("\nsession            exit   time")
    for name, code, seconds in results:
        print(f"{name:<18} {code:>4} {seconds:>6.0f} s")
    print(f"{'all':<18} {'':>4} {sum(s for _, _, s in results):>6.0f} s")
    return int(any(code != 0 for _, code, _ in results))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
