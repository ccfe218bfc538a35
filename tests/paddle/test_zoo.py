"""The zoo's adapter of Paddle drives the real ``paddle.amp.GradScaler``.

The check looks at the native object after the adapter's steps (the class it is, whether it
is enabled, the parameters), so an adapter that fell back on this project's own scalers, or
skipped the native calls, fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from unifiedamp.conformance.zoo import ZOO
from unifiedamp.spec import ScalerConfig


def test_paddle_on_cpu_runs_the_native_scaler_disabled_and_says_why() -> None:
    paddle = pytest.importorskip("paddle", reason=ZOO["paddle"].install)
    from unifiedamp.conformance.contract import fit
    from unifiedamp.conformance.zoo.paddle_grad_scaler import CPU_SKIP, PaddleGradScaler

    adapter = PaddleGradScaler()
    if adapter.scales:
        pytest.skip(f"paddle scales on {adapter.device}: the CPU behaviour is not shown there")
    # What the adapter reports is what paddle does: a scaler built on CPU disables itself.
    with pytest.warns(UserWarning, match="CUDAPlace"):
        assert paddle.amp.GradScaler(init_loss_scaling=1024.0).is_enable() is False
    assert adapter.expresses(ScalerConfig()) == CPU_SKIP and "only on GPU" in CPU_SKIP
    assert fit(adapter, ScalerConfig()) is None
    with pytest.raises(ValueError, match="disables itself on a CPU place"):
        adapter.new(ScalerConfig())

    handle = adapter.new(ScalerConfig(1024.0, enabled=False))
    assert type(handle[0]) is paddle.amp.GradScaler and handle[0].is_enable() is False
    handle = adapter.iterate(handle, "I")
    # The disabled scaler steps with the inf: the weights are no longer finite.
    assert not all(np.isfinite(a).all() for a in adapter.snapshot(handle))
    assert handle[0].state_dict() == {} and adapter.read(handle).scale == 1.0
    assert adapter.save(handle)["config"]["enabled"] is False
