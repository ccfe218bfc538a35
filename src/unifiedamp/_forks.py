"""Children forked from a zygote (:mod:`unifiedamp._zygote`, which says what a child
sees): one zygote per preload and environment, kept for later children of this process
until it has been idle for a minute, closed at exit.

Example:
    >>> proc = run_code("import sys, json; print(sys.argv[1:], 'json' in sys.modules)",
    ...                 ["a", "b"], preload=("json",))
    >>> proc.returncode, proc.stdout
    (0, "['a', 'b'] True\\n")
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

#: Seconds a zygote waits for its next child before it exits.
IDLE_SECONDS = 60.0

#: Set per test by pytest; no framework reads it, so it does not key a zygote.
_NOT_READ_AT_IMPORT = ("PYTEST_CURRENT_TEST",)


class Zygote:
    """A ``python -m unifiedamp._zygote`` process and the lock that keeps one request
    at a time."""

    def __init__(self, preload: tuple[str, ...], env: Mapping[str, str]):
        self.lock = threading.Lock()
        self.folder = tempfile.mkdtemp(prefix="unifiedamp-zygote-")  # nothing to shadow
        self.process = subprocess.Popen(
            [sys.executable, "-m", "unifiedamp._zygote"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=self.folder, env=dict(env), text=True, bufsize=1)
        self.ok = bool(self._ask({"preload": list(preload), "idle": IDLE_SECONDS}).get("ok"))

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except OSError:
            line = ""
        return json.loads(line) if line else {}

    def fork(self, program: Mapping[str, str], argv: Sequence[str], cwd: str,
             env: Mapping[str, str], stdout: str, stderr: str,
             exit_path: str) -> ForkedProcess | None:
        """A new child running ``program`` (``{"module": name}`` or ``{"code": text}``),
        or None if the zygote has exited."""
        with self.lock:
            if self.process.poll() is not None:
                return None
            reply = self._ask({**program, "argv": list(argv), "cwd": cwd, "env": dict(env),
                               "stdout": stdout, "stderr": stderr, "exit": exit_path})
        pid = reply.get("pid")
        return None if pid is None else ForkedProcess(pid, exit_path, self)

    def close(self) -> None:
        # At the end of its input the zygote waits for its children, then exits.
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


_zygotes: dict[tuple[Any, ...], Zygote] = {}
_zygotes_lock = threading.Lock()


@atexit.register
def _close_zygotes() -> None:
    with _zygotes_lock:
        for zygote in _zygotes.values():
            zygote.close()
        _zygotes.clear()


def zygote_for(preload: tuple[str, ...], env: Mapping[str, str]) -> Zygote | None:
    """The zygote for ``preload`` in ``env`` (started at the first call); None when the
    preload fails there."""
    key = (preload, tuple(sorted((k, v) for k, v in env.items()
                                 if k not in _NOT_READ_AT_IMPORT)))
    with _zygotes_lock:
        zygote = _zygotes.get(key)
        # One whose preload failed stays: the next call would fail the same way.
        if zygote is None or (zygote.ok and zygote.process.poll() is not None):
            if zygote is not None:  # exited when idle: its folder goes too
                zygote.close()
            zygote = _zygotes[key] = Zygote(preload, env)
    return zygote if zygote.ok else None


class ForkedProcess:
    """A child of a zygote, seen as a :class:`subprocess.Popen` (``pid``, ``returncode``,
    ``poll``, ``wait``): the zygote writes its exit status to a file."""

    def __init__(self, pid: int, exit_path: str, zygote: Zygote):
        self.pid, self.exit_path, self.zygote = pid, exit_path, zygote
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        died = self.zygote.process.poll() is not None  # before looking for the file
        if os.path.exists(self.exit_path):
            with open(self.exit_path) as f:
                self.returncode = int(f.read())
        elif died:
            # The zygote died (it exits by itself only once its children have): nobody
            # will write the status; a child that is gone counts as killed.
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired("(a zygote's child)", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """Kills the child's process group (its session)."""
        kill_group(self.pid)


def kill_group(pid: int) -> None:
    """Kills the process group of ``pid``, a child started in a session of its own (by
    ``subprocess.Popen(start_new_session=True)`` or a zygote); nothing if it is gone."""
    with contextlib.suppress(ProcessLookupError):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:  # forked, not yet in a session of its own
            os.kill(pid, signal.SIGKILL)


def run_code(code: str, argv: Sequence[str] = (), preload: Sequence[str] = (),
             env: Mapping[str, str] | None = None,
             timeout: float | None = None) -> subprocess.CompletedProcess:
    """What ``subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
    text=True, env=env, timeout=timeout)`` returns, the child forked from the zygote that
    imported ``preload`` (a plain interpreter when that import fails there, or without
    ``preload``). A timeout kills the child and raises :class:`subprocess.TimeoutExpired`."""
    env = dict(os.environ if env is None else env)
    command = [sys.executable, "-c", code, *argv]
    zygote = zygote_for(tuple(preload), env) if preload else None
    with tempfile.TemporaryDirectory(prefix="unifiedamp-fork-") as folder:
        out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
        child = zygote.fork({"code": code}, argv, os.getcwd(), env, out, err,
                            os.path.join(folder, "exit")) if zygote else None
        if child is None:
            return subprocess.run(command, capture_output=True, text=True, env=env,
                                  timeout=timeout)
        try:
            status = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise subprocess.TimeoutExpired(command, timeout or 0.0) from None
        with open(out, errors="replace") as o, open(err, errors="replace") as e:
            return subprocess.CompletedProcess(command, status, o.read(), e.read())
