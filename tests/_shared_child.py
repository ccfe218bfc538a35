"""A child process, or a fixture's result, that every pytest-xdist worker of a session shares.

Several test modules run their checks in child interpreters (one per Keras backend, say)
and read the outcomes when their tests run. Under ``pytest -n 2`` every worker runs tests
of such a module, and each would start the same children: the same checks again. A
:class:`SharedChild` is started by whichever worker asks first; the others find it in the
session's shared temporary folder and read its output. It writes its output to a log file
there and, when it ends, its exit code to ``exitcode``; whoever started it waits for it at
the end of the session (another worker may still be reading it) and kills it only after
``timeout``. :func:`shared_result` does the same for a module fixture's value: computed by
one worker, read by the others.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from unifiedamp._files import write_bytes

# Runs the command with its output in the log file, then writes its exit code (renamed into
# place, so that a reader never sees half of it).
_WRAPPER = """\
import os, subprocess, sys
done, log, *cmd = sys.argv[1:]
with open(log, "w") as out:
    code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
with open(done + ".part", "w") as f:
    f.write(str(code))
os.replace(done + ".part", done)
"""


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The temporary folder of the whole session: xdist gives each worker a folder of its
    own under it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_result(tmp_path_factory: pytest.TempPathFactory, key: str,
                  compute: Callable[[], Any]) -> Any:
    """``compute()``'s value (JSON), computed once per session under ``key``: the first
    worker to ask computes it while it holds a lock; the others wait for the lock and read
    what it wrote. A ``compute`` that raised (or skipped) wrote nothing: the next worker
    computes it again, and sees the error itself. Each worker gets the value as JSON gives
    it back (lists for tuples), the worker that computed it too."""
    folder = shared_folder(tmp_path_factory)
    path = folder / f"shared-{key}.json"
    with open(folder / f"shared-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not path.exists():
            write_bytes(path, json.dumps(compute()).encode())
        return json.loads(path.read_text())


class SharedChild:
    """A command run once per session under ``key`` (the same key on every worker must mean
    the same command), in the folder ``where`` of the shared temporary folder: write the
    files it needs there when :attr:`owner` is true, then :meth:`start` it."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, key: str,
                 timeout: float = 900):
        self.where = shared_folder(tmp_path_factory) / f"shared-{key}"
        self.timeout = timeout
        self.log, self._done = self.where / "log.txt", self.where / "exitcode"
        try:
            self.where.mkdir()
            self.owner = True
        except FileExistsError:
            self.owner = False
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None

    def start(self, cmd: list[str], env: dict[str, str]) -> None:
        """Starts ``cmd`` if this worker is the first to ask for ``key``; no-op otherwise."""
        if not self.owner:
            return
        self.proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, str(self._done),
                                      str(self.log), *cmd], cwd=self.where, env=env,
                                     start_new_session=True)
        atexit.register(self._finish)

    def start_script(self, code: str, env: dict[str, str]) -> None:
        """Starts ``python -c code`` with ``os.environ`` and ``env`` as :meth:`start` does,
        in a fork of the session's shared fork server for the script's leading imports
        (tests/_forkserver.py): children that import the same frameworks with the same
        variables share one import of them."""
        if not self.owner:
            return
        self.thread = threading.Thread(target=self._run_script, args=(code, env), daemon=True)
        self.thread.start()
        atexit.register(self._finish)

    def _run_script(self, code: str, env: dict[str, str]) -> None:
        from _forkserver import ForkServers

        servers = ForkServers(shared=self.where.parent / "forkservers")
        try:
            result = servers.run(code, timeout=self.timeout, env=env, cwd=self.where)
            code_text, output = str(result.returncode), result.stdout + result.stderr
        except subprocess.TimeoutExpired as timed_out:
            # No exit code: wait() reports the timeout.
            code_text, output = None, f"{timed_out.output or ''}{timed_out.stderr or ''}"
        except Exception as error:  # a fork server that failed: the reader sees why
            code_text, output = "-1", f"{type(error).__name__}: {error}"
        finally:
            servers.close()
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        write_bytes(self.log, output.encode())
        if code_text is not None:
            write_bytes(self._done, code_text.encode())

    def wait(self) -> int | None:
        """The child's exit code once it ended; None if it did not end within ``timeout``
        (it is then killed, by the worker that started it)."""
        deadline = time.monotonic() + self.timeout
        while not self._done.exists():
            if time.monotonic() > deadline:
                self._kill()
                return None
            time.sleep(0.1)
        return int(self._done.read_text())

    def output(self) -> str:
        """Everything the child has written so far."""
        return self.log.read_text() if self.log.exists() else "(no output)"

    def tail(self, n: int = 4000) -> str:
        return self.output()[-n:]

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _finish(self) -> None:
        # At the worker's exit: another worker may still read the child; wait for it, then
        # make sure nothing is left running.
        if self.thread is not None:
            self.thread.join(timeout=self.timeout)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                pass
            self._kill()
