"""What every test session shares: markers, the run's caches, and ``run_python``.

The tests live in one folder per session (``tests/core``, ``tests/torch``, ``tests/keras``...),
each importing at most the frameworks it is about: ``pytest tests/torch`` runs one session,
``tools/run_tests.py`` runs them all (paddle and tensorflow cannot share a process, and
Keras's backend is fixed when it is imported, so one pytest process cannot hold every
framework). Helpers that several folders use live in ``tests/support`` (on ``sys.path``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

# Between parallel regions the idle threads of an OpenMP runtime (torch's libgomp, the Intel
# runtime paddle loads) spin before they sleep: with a worker per core, those spins take the
# cores the others need. Passive waiting changes no result. Set before paddle or torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: one of the heaviest tests (10 s or more on two cores); "
                   "-m 'not slow' leaves them out")
    config.addinivalue_line(
        "markers", "distributed: runs several processes under a distributed engine; "
                   "-m 'not distributed' leaves them out")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller set the environment the workers inherit
    # One JAX compilation cache and one Hypothesis folder per run (an environment that sets
    # its own keeps it): the workers and the processes the tests start compile the same
    # steps and build the same Hypothesis tables again otherwise.
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        folder = tempfile.mkdtemp(prefix="unifiedamp-tests-jax-cache-")
        os.environ.update(JAX_COMPILATION_CACHE_DIR=folder,
                          JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(config.rootpath / ".hypothesis"))


@pytest.fixture
def run_python():
    """Runs ``python -c code *args`` in a new interpreter and returns ``subprocess.run``'s
    result (text output captured). For what only a process shows: what an import loads, a
    crash, a file read back by a process that did not write it."""

    def run(code: str, timeout: float = 300, env: dict | None = None,
            cwd: str | os.PathLike[str] | None = None, args: tuple[str, ...] = ()):
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=timeout, cwd=cwd,
                              env={**os.environ, **(env or {})})

    return run
