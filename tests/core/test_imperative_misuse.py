"""Misuse of the NumPy scaler gets one clear error and changes nothing (the checks every
imperative backend shares: tests/support/imperative_misuse_checks.py)."""

from __future__ import annotations

from imperative_misuse_checks import ImperativeMisuseContract


class TestImperativeMisuse(ImperativeMisuseContract):
    backend = "numpy"
