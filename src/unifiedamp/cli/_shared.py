"""What several subcommands share: the time a subprocess may take, its error line, whether
a framework is installed, and the table they print."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Sequence

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
