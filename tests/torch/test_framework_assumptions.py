"""What the spec and the facade assume of torch, checked against the installed one
(tests/support/framework_assumptions_checks.py)."""

from __future__ import annotations

from framework_assumptions_checks import NativeScalerContract


class TestNativeScaler(NativeScalerContract):
    framework = "torch"
    native = "torch:amp.GradScaler"
