"""State dicts on the torch backend: a real torch scaler's native dict loads, and the checks
every backend shares (tests/support/state_dict_checks.py)."""

from __future__ import annotations

import pytest
from state_dict_checks import Int32LoadContract, TrackerBoundContract

import unifiedamp as ua
from unifiedamp import spec


class TestStateDict(TrackerBoundContract, Int32LoadContract):
    backend = "torch"


def test_native_torch_state_dict_from_a_real_torch_scaler_is_accepted():
    torch = pytest.importorskip("torch")
    native_scaler = torch.amp.GradScaler("cpu", init_scale=4096.0, growth_factor=4.0,
                                         backoff_factor=0.25, growth_interval=10)
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.1)
    for _ in range(3):
        native_scaler.scale(param.sum()).backward()
        native_scaler.step(opt)
        native_scaler.update()
        opt.zero_grad()
    scaler = ua.GradScaler(backend="numpy")
    scaler.load_state_dict(native_scaler.state_dict())
    assert scaler.state == spec.ScalerState(4096.0, 3, 0)
    c = scaler.config
    assert (c.growth_factor, c.backoff_factor, c.growth_interval) == (4.0, 0.25, 10)
