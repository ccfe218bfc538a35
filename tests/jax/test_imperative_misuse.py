"""The JAX backend's history ring refuses a size past the maximum (the check the functional
backends share: tests/support/imperative_misuse_checks.py)."""

from __future__ import annotations

from imperative_misuse_checks import FunctionalHistoryContract


class TestFunctionalHistory(FunctionalHistoryContract):
    backend = "jax"
