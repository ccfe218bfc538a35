"""Atomic file writes: every file unifiedamp writes goes through :func:`atomic_path`.

The new content goes to a temp file beside the target, which is renamed over the
target only when it is complete, so a failure (a full disk, a file-size limit, a
SIGKILL) leaves the original byte for byte; the new file keeps the old one's mode (and
owner, where the process may set it). A symlink is written through: its target gets
the new content and the link stays a link, except a link the kernel itself would not
follow (``fs.protected_symlinks``: in a sticky, world-writable folder, a link owned by
neither the folder's owner nor this user), which is refused. A file with other hard
links is refused: a rename would leave its other names on the old content. Temp files
are removed on every exit path the process controls; one left by a killed process is
removed by the next write to the same target (its name carries the writer's pid).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from collections.abc import Iterator

__all__ = ["atomic_path", "write_bytes"]

_TAG = ".unifiedamp-tmp-"


def _prefix(real: str) -> str:
    return f".{os.path.basename(real)}{_TAG}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; no pid that large
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(real: str) -> None:
    # Temp files of this target whose writer no longer runs (killed mid-write).
    folder, name = os.path.split(real)
    pattern = re.compile(re.escape(f".{name}{_TAG}") + r"(\d{1,10})-")
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
    if os.path.islink(path):
        _check_link(path)
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    if os.path.isdir(real):
        raise IsADirectoryError(f"{path} is a directory: name a file to write")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: the folder {folder} does not exist; create it "
                                "first (nothing was written)")
    with contextlib.suppress(FileNotFoundError):
        links = os.stat(real).st_nlink
        if links > 1:
            raise ValueError(
                f"{path} has {links} hard links: writing it replaces the file under this "
                "name only, and its other names would keep the old content; write to "
                "another file (CLI: -o OUT), or give this name a copy of its own first "
                f"(cp {path} {path}.new && mv {path}.new {path}); nothing was written")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(
            f"{path}: its folder {folder} is not writable, and a write goes to a temp file "
            "beside the file, renamed over it when complete (so a failure leaves the file "
            "whole): make the folder writable, or write elsewhere (CLI: -o OUT); nothing "
            "was written")
    return real


def _check_link(path: str) -> None:
    # fs.protected_symlinks: in a sticky, world-writable folder (/tmp) the kernel follows
    # a link only if its owner is the folder's owner or the follower; as root, or where
    # that setting is off, the same link would be written through.
    link = os.lstat(path)
    folder = os.stat(os.path.dirname(os.path.abspath(path)))
    shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
    if shared and link.st_uid not in (folder.st_uid, os.geteuid()):
        raise PermissionError(
            f"{path} is a symlink owned by uid {link.st_uid} in a shared sticky folder: "
            "another user may have planted it to make this write land elsewhere (the "
            "kernel's fs.protected_symlinks refuses to follow it); write to the link's "
            f"target by its own path ({os.path.realpath(path)}) if that is meant; nothing "
            "was written")


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
            old = os.stat(real)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        else:
            os.chmod(tmp, old.st_mode & 0o7777)
            with contextlib.suppress(PermissionError):
                os.chown(tmp, old.st_uid, old.st_gid)
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
