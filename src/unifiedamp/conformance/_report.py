"""Reading a run's report: its tests in order, one matrix cell, a compact list of test ids."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["cell", "compact", "tests_of"]

_CELL = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip",
         "xfailed": "xfail", "xpassed": "XPASS"}


def cell(result: dict[str, Any], test: str) -> str:
    """One cell of the matrix: ``pass``, ``FAIL at step k``, ``skip``, ``not installed``...

    Example:
        >>> cell({"status": "ok", "tests": {"t": {"outcome": "failed",
        ...       "detail": "v: diverged at step 3 of 'FFF'"}}}, "t")
        'FAIL at step 3'
    """
    if result["status"] != "ok":
        return result["status"]
    t = result["tests"].get(test)
    if t is None:
        return "-"
    step = re.search(r"diverged at step (\d+)", t["detail"])
    return f"FAIL at step {step.group(1)}" if t["outcome"] == "failed" and step else _CELL[
        t["outcome"]]


def tests_of(report: dict[str, Any]) -> list[str]:
    """Every test of a multi-column report, in the order the suite ran them."""
    tests: list[str] = []
    for r in report["backends"].values():
        tests += [t for t in r.get("tests", {}) if t not in tests]
    return tests


def compact(tests: list[str], quote: str = "") -> str:
    """Test ids, with more than three of one parametrized test counted instead of listed.

    Example:
        >>> compact(["test_a", "test_v[x]", "test_v[y]", "test_v[z]", "test_v[w]"])
        'test_a, test_v (4 vectors)'
    """
    groups: dict[str, list[str]] = {}
    for test in tests:
        groups.setdefault(test.partition("[")[0], []).append(test)
    return ", ".join(f"{quote}{name}{quote} ({len(ids)} vectors)" if len(ids) > 3
                     else ", ".join(f"{quote}{i}{quote}" for i in ids)
                     for name, ids in groups.items())
