"""Runs pytest in a fresh interpreter that reads no project's configuration.

The ``unifiedamp conformance`` command runs the shipped suite this way, one
process per backend (frameworks that cannot share a process never do, and a
crash is reported instead of being fatal); the project's own tests run the
suite and the documented examples the same way.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile

__all__ = ["absolute_pythonpath", "run_pytest"]


def run_pytest(args: list[str], *, rootdir: str | os.PathLike[str] | None = None,
               env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -q ARGS`` with an empty ini, no cache and no ``conftest.py``, in
    ``rootdir``, with no plugin but the suite's and Hypothesis's. (Without ``--noconftest``
    pytest would load the ``conftest.py`` of every folder above a collected file, however
    far from ``rootdir``: a project's, above the suite of an editable install, with
    whatever that imports. Without ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` it would read the
    entry points of every installed package and load every plugin installed, whose
    options and hooks the suite does not use.)

    Args:
        args: pytest's arguments (test paths, ``--pyargs ...``, plugin options).
        rootdir: pytest's rootdir and the working directory (default: a new
            temporary directory), which test ids are relative to.
        env: Variables added to this process's environment.
        timeout: Seconds before ``subprocess.TimeoutExpired`` is raised.

    Example:
        >>> proc = run_pytest(["--version"])
        >>> proc.returncode, proc.stdout.startswith("pytest")
        (0, True)
    """
    with tempfile.TemporaryDirectory() as tmp:
        ini = os.path.join(tmp, "pytest.ini")
        with open(ini, "w") as f:
            f.write("[pytest]\n")  # keeps any project's pytest configuration out of the run
        where = os.fspath(rootdir) if rootdir is not None else tmp
        cmd = [sys.executable, "-m", "pytest", "-c", ini, "--rootdir", where, "-q",
               "-p", "no:cacheprovider", "--noconftest", *_PLUGINS, *args]
        return subprocess.run(cmd, cwd=where, capture_output=True, text=True, timeout=timeout,
                              env=absolute_pythonpath({**os.environ, **(env or {}),
                                                       "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}))


#: The plugins of a run: the suite's (the package first, so that pytest rewrites the
#: asserts of all its modules, as it does for a plugin found by its entry point) and
#: Hypothesis's (its options, such as ``--hypothesis-seed``, and statistics).
_PLUGINS = ("-p", "unifiedamp.conformance", "-p", "unifiedamp.conformance.plugin",
            *(("-p", "_hypothesis_pytestplugin")
              if importlib.util.find_spec("_hypothesis_pytestplugin") else ()))


def absolute_pythonpath(env: dict[str, str]) -> dict[str, str]:
    """``env`` with its ``PYTHONPATH`` entries made absolute, from this process's working
    directory: the suite runs in another one, where a relative entry would find nothing.

    Example:
        >>> import os
        >>> absolute_pythonpath({"PYTHONPATH": "src"})["PYTHONPATH"] == os.path.abspath("src")
        True
    """
    if not env.get("PYTHONPATH"):
        return env
    entries = env["PYTHONPATH"].split(os.pathsep)
    return {**env, "PYTHONPATH": os.pathsep.join(os.path.abspath(e) for e in entries)}
