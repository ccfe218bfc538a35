"""The bounds on what reading an untrusted checkpoint may cost, and the zip checks made
before a reader opens one.

A small file can describe a large amount of work: a zip member that decompresses a
thousandfold, containers that share children (a 1 KB pickle can hold 2**40 paths), a
nesting deeper than Python's stack. :class:`ReadLimits` names each cap; a file past one
is refused with an error that names the cap and how to lift it, before the work is done.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any, NamedTuple

__all__ = ["ReadLimits", "check_tree", "check_zip"]

_CONTAINERS = (dict, list, tuple, set, frozenset)


class ReadLimits(NamedTuple):
    """Caps on the work of reading one checkpoint file (``load_file(limits=...)``, CLI
    ``--limit NAME=VALUE``).

    Attributes:
        max_unpack_ratio: a zip-based file (torch, ``.npz``, ``.keras``) may decompress to
            at most this many times its own size...
        unpack_allowance: ...plus this many bytes (small files compress well).
        max_entries: containers and values in the file's data, each counted once per
            path that reaches it (a shared child counts as often as it is shared: the
            work of every later walk, a JSON dump or a save, is that count).
        max_depth: containers nested in containers.

    Reading within these caps costs memory and time in proportion to the file's size
    (a pickle: about three times its size; a zip: the sizes its members unpack to).

    Example:
        >>> ReadLimits().max_depth, ReadLimits(max_depth=500).max_depth
        (100, 500)
    """

    max_unpack_ratio: int = 64
    unpack_allowance: int = 64 << 20
    max_entries: int = 10_000_000
    max_depth: int = 100

    def lift(self, name: str) -> str:
        """How to lift cap ``name``: the words every refusal ends with."""
        return (f"if the file is trusted and this is expected, raise the cap: "
                f"limits=ReadLimits({name}=...) (CLI: --limit {name}=N; now "
                f"{getattr(self, name)})")


class Exceeded(Exception):
    """A file asks for more work than a :class:`ReadLimits` cap allows."""


def _check_unpacked_size(z: zipfile.ZipFile, size: int, limits: ReadLimits) -> None:
    """Refuses a zip archive of ``size`` bytes whose members together unpack past the caps.

    The sizes are those the archive's directory records; a member that unpacks to more
    than its recorded size fails its CRC-32 check (zipfile stops at the recorded size).
    """
    unpacked = sum(info.file_size for info in z.infolist())
    cap = size * limits.max_unpack_ratio + limits.unpack_allowance
    if unpacked > cap:
        raise Exceeded(
            f"its members unpack to {unpacked:,} bytes, more than max_unpack_ratio="
            f"{limits.max_unpack_ratio} times its {size:,} bytes plus unpack_allowance="
            f"{limits.unpack_allowance:,} ({cap:,}): a zip bomb, or a file that compresses "
            f"unusually well; {limits.lift('max_unpack_ratio')}")


def check_tree(obj: Any, limits: ReadLimits) -> None:
    """Refuses data nested past ``max_depth`` (or containing itself) or holding more than
    ``max_entries`` entries counted along every path.

    Each container is visited once (shared children are counted, not walked again), so
    this costs time in proportion to the distinct objects, whatever the count.
    """
    counts: dict[int, int] = {}

    def count(x: Any, depth: int) -> int:
        if not isinstance(x, _CONTAINERS):
            return 1
        if id(x) in counts:
            return counts[id(x)]
        if depth > limits.max_depth:
            raise Exceeded(f"its data is nested more than max_depth={limits.max_depth} "
                           f"deep (or contains itself); {limits.lift('max_depth')}")
        children = [*x.keys(), *x.values()] if isinstance(x, dict) else x
        total = 1
        for child in children:
            total += count(child, depth + 1)
        counts[id(x)] = total
        return total

    total = count(obj, 0)
    if total > limits.max_entries:
        raise Exceeded(f"its containers share children that, counted along every path, "
                       f"hold {total:,} entries, more than max_entries={limits.max_entries:,}"
                       f" (every later walk of the data, a save included, would visit them "
                       f"all); {limits.lift('max_entries')}")


def check_zip(path: Any, limits: ReadLimits | None) -> None:
    """Refuses a damaged zip archive, one whose data fails the CRC-32 it records, and
    (with ``limits``) one that unpacks past them: before any reader opens it."""
    # torch's zip reader does not check the CRC-32 it wrote: a flipped bit in tensor data
    # loads silently. Checking every member costs one read of the file.
    try:
        with zipfile.ZipFile(path) as z:
            if limits is not None:  # from the directory, before anything is unpacked
                _check_unpacked_size(z, os.path.getsize(path), limits)
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise ValueError(f"{path} is a damaged zip archive ({exc}); nothing was read") from None
    if bad is not None:
        raise ValueError(f"{path}: the data of its member {bad!r} does not match the "
                         "CRC-32 the file records for it: the file is damaged; nothing "
                         "was read")
