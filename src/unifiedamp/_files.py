"""Atomic file writes: every file unifiedamp writes goes through :func:`atomic_path`.

The new content goes to a temp file beside the target, which is renamed over the
target only when it is complete, so a failure (a full disk, a file-size limit, a
SIGKILL) leaves the original byte for byte. A symlink is written through: its
target gets the new content and the link stays a link. Temp files are removed on
every exit path the process controls; one left by a killed process is removed by
the next write to the same target (its name carries the writer's pid).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator

__all__ = ["atomic_path", "write_bytes"]

_TAG = ".unifiedamp-tmp-"


def _prefix(real: str) -> str:
    return f".{os.path.basename(real)}{_TAG}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(real: str) -> None:
    # Temp files of this target whose writer no longer runs (killed mid-write).
    folder, name = os.path.split(real)
    pattern = re.compile(re.escape(f".{name}{_TAG}") + r"(\d+)-")
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry)
        if match and not _alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, entry))


def _target(path: str | os.PathLike) -> str:
    """The file a write to ``path`` replaces (symlinks followed), checked writable."""
    path = os.fspath(path)
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    if os.path.isdir(real):
        raise IsADirectoryError(f"{path} is a directory: name a file to write")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: the folder {folder} does not exist; create it "
                                "first (nothing was written)")
    return real


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[str]:
    """Yields a temp path beside ``path``; renames it over ``path`` when the block ends
    without an error, removes it otherwise.

    The new file gets the mode of the file it replaces (an ordinary ``open()``'s mode
    for a new file). ``suffix`` ends the temp name, for writers that pick the format
    from the extension.

    Example:
        >>> import os, tempfile
        >>> target = os.path.join(tempfile.mkdtemp(), "out.txt")
        >>> with atomic_path(target) as tmp:
        ...     with open(tmp, "w") as f:
        ...         _ = f.write("whole")
        >>> open(target).read(), sorted(os.listdir(os.path.dirname(target)))
        ('whole', ['out.txt'])
    """
    real = _target(path)
    _remove_stale(real)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=_prefix(real), suffix=suffix)
    os.close(fd)
    try:
        try:
            mode = os.stat(real).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, real)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (see :func:`atomic_path`).

    Example:
        >>> import os, tempfile
        >>> target = os.path.join(tempfile.mkdtemp(), "b.bin")
        >>> write_bytes(target, b"\\x00\\x01")
        >>> open(target, "rb").read()
        b'\\x00\\x01'
    """
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
