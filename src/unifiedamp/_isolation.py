"""Frameworks that cannot share a process in some import orders, as data.

Measured: importing paddle 3.3.1 after tensorflow 2.21 segfaults the process;
the other order works. Where a later import would crash, we raise instead.
"""

from __future__ import annotations

import sys

from unifiedamp.errors import FrameworkConflictError

# framework -> modules that must not be imported before it
MUST_NOT_PRECEDE: dict[str, tuple[str, ...]] = {"paddle": ("tensorflow",)}



def ensure_importable(framework: str) -> None:
    """Raises instead of letting ``import framework`` crash the interpreter.

    A framework already imported is fine: the crash happens at its import, and
    paddle imported before tensorflow works.

    Example:
        >>> ensure_importable("numpy")
    """
    if sys.modules.get(framework) is not None:
        return
    clash = [m for m in MUST_NOT_PRECEDE.get(framework, ()) if m in sys.modules]
    if clash:
        raise FrameworkConflictError(
            f"{framework} cannot be imported after {', '.join(clash)} in one process "
            f"(it segfaults with paddle 3.3.1 and tensorflow 2.21): import {framework} "
            f"before {', '.join(clash)}, or run the {framework} code in a process of its own"
        )


def import_rank(framework: str) -> int:
    """Sort key: frameworks that must come first get the lowest rank.

    Example:
        >>> sorted(["tensorflow", "numpy", "paddle"], key=import_rank)
        ['paddle', 'numpy', 'tensorflow']
    """
    if framework in MUST_NOT_PRECEDE:
        return 0
    if any(framework in before for before in MUST_NOT_PRECEDE.values()):
        return 2
    return 1
