"""Fixtures of the paddle session: Paddle's process-wide AMP dtype reset around each test,
and the native ``paddle.amp.GradScaler`` built enabled on this CPU-only build."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


@pytest.fixture(autouse=True)
def _paddle_amp_dtype():
    """Paddle's process-wide AMP dtype, reset to its initial value for each test.

    ``paddle.amp.auto_cast(dtype=...)`` sets ``amp_global_state().amp_dtype`` and never
    restores it (3.3.1), and the native scaler's ``scale()`` reads it: every test of this
    session runs in one process per worker, so one test's auto_cast would reach the next.
    """
    pytest.importorskip("paddle")
    from paddle.amp.auto_cast import amp_global_state

    saved = amp_global_state().amp_dtype
    amp_global_state().amp_dtype = "float32"  # Paddle's initial value
    try:
        yield
    finally:
        amp_global_state().amp_dtype = saved


class _GpuPlace:
    """Answers the one question paddle.amp.GradScaler.__init__ asks the tracer's place."""

    def is_gpu_place(self):
        return True


@pytest.fixture
def native_scaler(monkeypatch):
    """Builds a real, enabled ``paddle.amp.GradScaler`` on this CPU-only build.

    Its constructor disables it on a CPU place (3.3.1); the place check is answered
    "GPU" for the constructor call only, so Paddle's own enabled branch builds every
    attribute. All that runs afterwards is Paddle's code, untouched.
    """
    paddle = pytest.importorskip("paddle")
    import paddle.amp.grad_scaler as grad_scaler

    def build(**kwargs):
        tracer = SimpleNamespace(_expected_place=_GpuPlace())
        with monkeypatch.context() as patch:
            patch.setattr(grad_scaler, "_dygraph_tracer", lambda: tracer)
            native = paddle.amp.GradScaler(**kwargs)
        assert native.is_enable()
        return native

    return build
