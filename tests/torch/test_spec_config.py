"""Configuration values given as zero-d torch tensors."""

from __future__ import annotations

import pytest

from unifiedamp.spec import ScalerConfig


def test_zero_d_torch_tensors_are_their_numbers():
    torch = pytest.importorskip("torch")
    c = ScalerConfig(torch.tensor(1024.0), growth_interval=torch.tensor(3))
    assert (c.init_scale, c.growth_interval) == (1024.0, 3)
