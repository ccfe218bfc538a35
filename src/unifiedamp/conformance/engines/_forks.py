"""The launcher's side of a zygote (:mod:`unifiedamp.conformance.engines._zygote`): one
per preload and rank environment, kept for later launches, closed at exit."""

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
from collections.abc import Mapping
from typing import Any

#: Set per test by pytest; no framework reads it, so it does not key a zygote.
_NOT_READ_AT_IMPORT = ("PYTEST_CURRENT_TEST",)


class Zygote:
    """A ``python -m unifiedamp.conformance.engines._zygote`` process (its docstring says
    what a forked rank sees) and the lock that keeps one request at a time."""

    def __init__(self, preload: tuple[str, ...], env: Mapping[str, str]):
        self.lock = threading.Lock()
        self.folder = tempfile.mkdtemp(prefix="unifiedamp-zygote-")  # nothing to shadow
        self.process = subprocess.Popen(
            [sys.executable, "-m", "unifiedamp.conformance.engines._zygote"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=self.folder, env=dict(env), text=True, bufsize=1)
        self.ok = bool(self._ask({"preload": list(preload)}).get("ok"))

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except OSError:
            line = ""
        return json.loads(line) if line else {}

    def fork(self, module: str, argv: list[str], cwd: str, env: Mapping[str, str],
             log: str, exit_path: str) -> int | None:
        """The pid of a new rank, or None if the zygote has died."""
        with self.lock:
            if self.process.poll() is not None:
                return None
            reply = self._ask({"module": module, "argv": argv, "cwd": cwd, "env": dict(env),
                               "log": log, "exit": exit_path})
        return reply.get("pid")

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
        if zygote is None or zygote.process.poll() is not None:
            zygote = _zygotes[key] = Zygote(preload, env)
    return zygote if zygote.ok else None


class ForkedRank:
    """A rank forked by a zygote, seen as the :class:`subprocess.Popen` of a plain rank
    (``pid``, ``returncode``, ``poll``, ``wait``): the zygote writes its exit status to a
    file."""

    def __init__(self, pid: int, exit_path: str, zygote: Zygote):
        self.pid, self.exit_path, self.zygote = pid, exit_path, zygote
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and os.path.exists(self.exit_path):
            with open(self.exit_path) as f:
                self.returncode = int(f.read())
        elif self.returncode is None and self.zygote.process.poll() is not None:
            # The zygote died (it only exits by itself once its children have): nobody
            # will write the status; a rank that is gone counts as killed.
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode
