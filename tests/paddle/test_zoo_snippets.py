"""The snippet of the zoo's paddle column runs with Paddle alone and shows what the zoo's
page explains: a disabled paddle.amp.GradScaler reports a scale of 1.0, and on a CPU place
every one is disabled."""

from __future__ import annotations

import importlib.util

import pytest

from unifiedamp.conformance.zoo import ZOO


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason=ZOO["paddle"].install)
def test_paddle_snippet_shows_its_cause() -> None:
    import paddle
    from zoo_snippets import run_snippets

    device = paddle.get_device()
    try:
        lines = run_snippets(["paddle"])  # it runs on a CPU place, whatever the build
    finally:
        paddle.set_device(device)
    assert list(lines) == ["a_disabled_scaler_reports_a_scale_of_1.py"]
    assert lines["a_disabled_scaler_reports_a_scale_of_1.py"].startswith(
        "paddle.amp.GradScaler(init_loss_scaling=1024.0) on CPU (is_enable() False)")
