"""What several subcommands share: the time a subprocess may take, its error line, whether
a framework is installed, the table they print and the progress they show."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

#: The longest one backend's subprocess may run (a worker, a conformance suite).
WORKER_TIMEOUT_S = 600


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The line of a failed subprocess's output that says why (stderr's last, else stdout's)."""
    lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    # pytest prefixes an error raised while it configures; the error is what matters.
    return lines[-1].removeprefix("INTERNALERROR> ") if lines else "no output"


def is_installed(module: str) -> bool:
    """Whether a top-level module is installed, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules without a __spec__: it is there
        return True


def print_table(rows: Sequence[tuple[str, ...]]) -> None:
    """Prints ``rows`` in left-aligned columns, the first row as the header."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for j, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))


def progress_wanted(args: Any) -> bool:
    """Whether a command shows its progress: ``--progress``/``--no-progress`` when given, else
    only on a terminal and never with ``--json`` (whose output is for a program)."""
    if args.progress is not None:
        return bool(args.progress)
    return not getattr(args, "json", False) and _isatty(sys.stderr)


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """Adds ``--progress``/``--no-progress`` (default: shown on a terminal, without --json)."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show what runs, per backend, with the time it took, on stderr "
                             "(default: on a terminal, and not with --json)")


class Progress:
    """What a command is doing, on stderr, while it runs.

    A line per task when it ends (``torch: PASS, 71 tests (41.2 s)``) and, on a terminal,
    one more line, rewritten in place every half second, with the tasks that run and for
    how long (``conformance 12 s: torch 8 s (12/71 tests), jax 8 s; waiting: mlx``). Off
    a terminal (``--progress`` into a log) a line says when each task starts instead.
    Disabled, it writes nothing. Tasks may start and end in other threads.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> with Progress("demo", ["numpy"], stream=out) as progress:
        ...     progress.start("numpy")
        ...     progress.finish("numpy", "matches the spec")
        >>> print(out.getvalue().replace("0.0 s", "T"), end="")
        numpy: running
        numpy: matches the spec (T)
    """

    def __init__(self, command: str, names: Sequence[str], *, enabled: bool = True,
                 stream: TextIO | None = None, note: Callable[[str], str] | None = None):
        self.command, self.enabled = command, enabled
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.live = enabled and _isatty(self.stream)
        self._note = note
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._waiting = list(names)
        self._running: dict[str, float] = {}
        self._notes: dict[str, str] = {}
        self._done = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.live:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self.live:
                self.stream.write("\r\x1b[K")  # the live line goes; the task lines stay
                self.stream.flush()

    def start(self, name: str) -> None:
        """``name`` runs from now on."""
        with self._lock:
            if name in self._waiting:
                self._waiting.remove(name)
            self._running[name] = time.monotonic()
            if self.enabled and not self.live:
                self._write(f"{name}: running")

    def note(self, name: str, text: str) -> None:
        """What the live line says of ``name`` besides its time (``12/40 steps``)."""
        self._notes[name] = text

    def finish(self, name: str, outcome: str) -> None:
        """``name`` ended with ``outcome``: its line, with the time since it started."""
        with self._lock:
            since = self._running.pop(name, None)
            if name in self._waiting:
                self._waiting.remove(name)
            self._done += 1
            if self.enabled:
                took = "" if since is None else f" ({time.monotonic() - since:.1f} s)"
                self._write(f"{name}: {outcome}{took}")

    def _write(self, line: str) -> None:
        # Over the live line, which is drawn again below it.
        self.stream.write(("\r\x1b[K" if self.live else "") + line + "\n")
        if self.live:
            self.stream.write(self._line())
        self.stream.flush()

    def _line(self) -> str:
        now = time.monotonic()
        running = []
        for name, since in self._running.items():
            note = self._notes.get(name) or (self._note(name) if self._note else "")
            running.append(f"{name} {now - since:.0f} s" + (f" ({note})" if note else ""))
        line = f"{self.command} {now - self._started:.0f} s: " + (", ".join(running) or "-")
        if self._waiting:
            line += f"; waiting: {', '.join(self._waiting)}"
        width = _columns(self.stream)
        return line if len(line) < width else line[:width - 4] + "..."

    def _tick(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.stream.write("\r" + self._line() + "\x1b[K")
                self.stream.flush()
            self._stop.wait(0.5)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _columns(stream: Any) -> int:
    """The terminal's width: a longer live line would wrap, and "\\r" would not rewrite it."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 80
    return columns if columns >= 20 else 80  # a new pseudo-terminal says 0
