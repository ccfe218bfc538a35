"""Runs the zoo's snippets in process: each shows one cause of a zoo column's departures
from the spec with the native scaler alone (``docs/snippets/zoo/<column>/*.py``).

A snippet asserts what the scaler does against the spec's values computed by hand, and
prints one line; :func:`run_snippets` runs every snippet of some columns and checks both,
and that the snippets are exactly those the columns' ``DIFFERENCES`` link to.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pathlib
import runpy

ROOT = pathlib.Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets" / "zoo"


def snippets(columns: list[str]) -> list[pathlib.Path]:
    """The snippet files of ``columns``, sorted; a column without any is an error."""
    found = []
    for column in columns:
        paths = sorted((SNIPPETS / column).glob("*.py"))
        if not paths:
            raise ValueError(f"no snippets for zoo column {column!r} in "
                             f"{SNIPPETS.relative_to(ROOT)}/{column}/")
        found += paths
    return found


def linked(columns: list[str]) -> set[pathlib.Path]:
    """The snippets the ``DIFFERENCES`` of ``columns``' zoo modules link to."""
    from unifiedamp.conformance.zoo import ZOO

    out = set()
    for column in columns:
        module = importlib.import_module(ZOO[column].target.partition(":")[0])
        out |= {ROOT / d.snippet for d in module.DIFFERENCES
                if not d.columns or column in d.columns}
    return out


def run_snippets(columns: list[str]) -> dict[str, str]:
    """Runs every snippet of ``columns`` in this process (``runpy.run_path``, as
    ``python snippet.py`` would): each must pass its assertions and print one line.
    Checks that the snippets are exactly those the columns' differences link to.
    Returns snippet file name -> the line it printed.

    Example::

        lines = run_snippets(["flax"])
        assert "grows_one_step_late.py" in lines
    """
    paths = snippets(columns)
    unlinked = sorted(str(p.relative_to(ROOT)) for p in set(paths) - linked(columns))
    missing = sorted(str(p.relative_to(ROOT)) for p in linked(columns) - set(paths))
    assert not unlinked and not missing, (
        f"snippets no Difference links to: {unlinked}; linked snippets missing: {missing}")
    return {path.name: run_one(path) for path in paths}


def run_one(path: pathlib.Path) -> str:
    """Runs one snippet as a script; the one line it prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")
    printed = out.getvalue().splitlines()
    assert len(printed) == 1, f"{path.relative_to(ROOT)} printed {printed!r}, not one line"
    return printed[0]
