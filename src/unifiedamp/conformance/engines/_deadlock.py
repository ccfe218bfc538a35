"""How :func:`~unifiedamp.conformance.engines.launch` finds a deadlock without waiting
for its timeout: ranks that have all stopped using the CPU wait for each other.

Example:
    >>> import subprocess, sys
    >>> rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
    ...                         start_new_session=True)
    >>> time.sleep(1)  # its start, which uses the CPU
    >>> watch, now = IdleWatch(2.0), time.monotonic()
    >>> [watch.idle([rank.pid], now + t) for t in (0, 1, 2)]  # the times of three samples
    [False, False, True]
    >>> rank.kill(); rank.wait()
    -9
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

#: Asks a rank of ``rank_main`` for its threads' stacks (faulthandler); a rank that
#: is not one yet (still importing) dies of it, which is then the same as being killed.
#: None where the platform has no SIGUSR1 (no stacks there).
STACKS_SIGNAL: int | None = getattr(signal, "SIGUSR1", None)

#: The exit statuses of ranks that launch() killed (or that ended before it did).
KILLED = frozenset({None, 0, -signal.SIGKILL}
                   | ({-STACKS_SIGNAL} if STACKS_SIGNAL is not None else set()))


def listen_for_stacks() -> None:
    """Makes this rank print its threads' stacks on :func:`print_stacks`' signal."""
    if STACKS_SIGNAL is not None:
        faulthandler.register(STACKS_SIGNAL, all_threads=True)


def print_stacks(procs: Sequence[Any]) -> None:
    """Asks each rank for its stacks, and gives them a moment to write them."""
    if STACKS_SIGNAL is None:
        return
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, STACKS_SIGNAL)
    # faulthandler writes from the signal handler itself: a moment is enough.
    time.sleep(0.5)


class IdleWatch:
    """Says when the sessions of the given ranks (a rank and whatever it started) have
    used less than 1% of a CPU for ``seconds``, sampling ``/proc`` once a second."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.available = os.path.isdir("/proc/self")

    def idle(self, pids: Sequence[int], now: float) -> bool:
        if not self.available or not pids or (
                self.samples and now - self.samples[-1][0] < 1.0):
            return False
        used = _session_cpu(set(pids))
        self.samples.append((now, used))
        while len(self.samples) > 1 and now - self.samples[1][0] >= self.seconds:
            self.samples.pop(0)
        then, before = self.samples[0]
        if now - then < self.seconds:
            return False
        # A rank that started after the first sample, or a session that lost a process,
        # counts as busy: only a whole window of near-zero use is a deadlock.
        return all(pid in before and 0 <= used.get(pid, 0.0) - before[pid]
                   < 0.01 * (now - then) for pid in pids)


def _session_cpu(sessions: set[int]) -> dict[int, float]:
    """CPU seconds used so far by each session's processes (and their reaped children)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        session = int(fields[3])
        if session in sessions:
            used[session] = used.get(session, 0.0) + sum(
                int(value) for value in fields[11:15]) / tick
    return used
