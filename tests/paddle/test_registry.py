"""Detection of the Paddle backend from real Paddle objects."""

from __future__ import annotations

import pytest

import unifiedamp as ua


def test_real_paddle_optimizers_and_tensors_select_the_paddle_backend():
    paddle = pytest.importorskip("paddle")
    from unifiedamp.backends.paddle import PaddleGradScaler

    layer = paddle.nn.Linear(2, 1)
    for obj in (paddle.optimizer.AdamW(parameters=layer.parameters()), paddle.ones([2]), layer):
        assert type(ua.GradScaler(backend=obj)) is PaddleGradScaler
