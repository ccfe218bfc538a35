"""Misuse of the torch scaler gets one clear error and changes nothing: the checks every
imperative backend shares (tests/support/imperative_misuse_checks.py), and a manual scale
tensor that is not finite and positive."""

from __future__ import annotations

import pytest
from imperative_misuse_checks import FrameworkMisuseContract, iteration

import unifiedamp as ua


class TestImperativeMisuse(FrameworkMisuseContract):
    backend = "torch"


@pytest.mark.parametrize("value", [float("nan"), -4.0, float("inf")])
def test_a_non_finite_or_negative_manual_scale_tensor_is_refused(value):
    torch = pytest.importorskip("torch")
    scaler, step = iteration("torch")
    step()
    scaler.update()
    before = scaler.state_dict()
    with pytest.raises(ValueError, match="new_scale must be finite and > 0"):
        scaler.update(new_scale=torch.tensor(value))
    assert scaler.state_dict() == before
    scaler.update(new_scale=torch.tensor(64.0))
    ua.GradScaler(backend="torch").load_state_dict(scaler.state_dict())  # reloads its own
