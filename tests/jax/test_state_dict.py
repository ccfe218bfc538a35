"""State dicts on the JAX backend: the checks every backend shares
(tests/support/state_dict_checks.py)."""

from __future__ import annotations

from state_dict_checks import TrackerBoundContract


class TestStateDict(TrackerBoundContract):
    backend = "jax"
