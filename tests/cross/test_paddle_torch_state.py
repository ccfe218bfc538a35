"""A paddle scaler loads the canonical and the native dicts of torch's scalers."""

from __future__ import annotations

import pytest

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")

from paddle_helpers import scaler_of  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402

INF = float("inf")

def test_canonical_and_native_dicts_from_the_torch_backend_load():
    source = ua.GradScaler(256.0, 3.0, 0.25, 4, backend="torch", hysteresis=2)
    native = torch.amp.GradScaler("cpu", 256.0, 2.0, 0.5, 4)
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    for value in (1.0, INF, 1.0, INF, INF, 1.0):
        for scaler in (source, native):
            scaler.scale((param * value).sum()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    target = scaler_of()
    target.load_state_dict(source.state_dict())
    assert (target.config, target.state) == (source.config, source.state)
    assert source.state == spec.ScalerState(64.0, 1, 0)
    target.load_state_dict(native.state_dict())
    assert target.state == spec.ScalerState(native.get_scale(), 1, 0)
    assert target.state.scale == 32.0 and target.config.growth_factor == 2.0
