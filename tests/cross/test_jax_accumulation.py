"""``loss_scaled_accumulate`` (JAX) step for step as torch's accumulation recipe
(``scaler.scale(loss / k).backward()`` per micro-batch, ``scaler.step`` and ``scaler.update``
once per k) run by a real torch loop, and as the spec's rule applied once per window. The
rest of the JAX side: tests/jax/test_jax_accumulation.py, whose micro-batches this repeats.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
torch = pytest.importorskip("torch")


from jax_accumulation import BAD, MICRO, K, batch, bits, train  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.backends.jax import (  # noqa: E402
    JaxGradScaler,
    loss_scaled_accumulate,
)

CONFIGS = {
    "doc": dict(init_scale=1024.0, growth_interval=2),
    # factors that round in float32, so the bits compare more than powers of two
    "rounding": dict(init_scale=1000.0, growth_factor=1.1, backoff_factor=0.7,
                     growth_interval=1),
}


def torch_scales(config, lr=0.05):
    """The scale after each optimizer step of torch's accumulation recipe."""
    scaler = ua.GradScaler(**config, backend="torch")
    w = torch.full((3,), 0.5, requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    opt = torch.optim.SGD([w, b], lr=lr)
    scales = []
    for i in range(MICRO):
        x = torch.from_numpy(batch(i))
        scaler.scale(((x @ w + b - 1.0) ** 2).mean() / K).backward()
        if (i + 1) % K == 0:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
    return scales, {"w": w.detach().numpy(), "b": b.detach().numpy()}


def spec_scales(config):
    """spec.update once per window, found_inf = any bad micro-batch in the window."""
    cfg = spec.ScalerConfig(**config)
    state = spec.ScalerState.initial(cfg)
    scales = []
    for start in range(0, MICRO, K):
        state = spec.update(cfg, state, start <= BAD < start + K)
        scales.append(state.scale)
    return scales


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_scale_per_optimizer_step_equals_torch_and_the_spec_bit_for_bit(name):
    config = CONFIGS[name]
    tx = loss_scaled_accumulate(optax.sgd(0.05), JaxGradScaler(**config), every_k=K)
    params, _, scales = train(tx, divide=K)
    per_step = scales[K - 1::K]
    expected_torch, torch_params = torch_scales(config)
    assert bits(per_step) == bits(expected_torch) == bits(spec_scales(config))
    # the scale only moves at the end of a window
    assert all(scales[i] == scales[i - 1] for i in range(1, MICRO) if (i + 1) % K)
    # the same training run as torch's, up to float32 rounding
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(params[key]), torch_params[key], rtol=1e-5)
