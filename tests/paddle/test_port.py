"""Porting on paddle (``unifiedamp.porting``): a paddle constructor call's config follows
paddle's own trajectory (GradScaler and AmpScaler, real optimizer) over a forced-overflow
sequence; a torch config ported to paddle needs the explicit hysteresis; native_call's
keyword arguments build a real scaler and from_native keeps its state; the natives table
holds the installed signatures. Paddle's AMP dtype is reset around each test by
tests/paddle/conftest.py."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from port_runs import KINDS, check_installed_signatures, hexes, reference  # noqa: E402

from unifiedamp.porting import config_from_call, from_native, native_call  # noqa: E402
from unifiedamp.spec import ScalerConfig, ScalerState  # noqa: E402


def test_the_table_holds_the_installed_signatures():
    # Positional order and defaults as inspect reads them from the installed paddle.
    classes = {"paddle.amp.GradScaler": paddle.amp.GradScaler,
               "paddle.amp.AmpScaler": paddle.amp.AmpScaler}
    assert check_installed_signatures(classes) == 2


class _GpuPlace:
    def is_gpu_place(self):
        return True


def paddle_native(cls_name: str, *args, **kwargs):
    """A real, enabled paddle scaler on this CPU-only build (as tests/paddle/conftest.py's
    ``native_scaler``: the place check answers "GPU" for the constructor only). Its scale
    becomes a 0-d tensor: paddle 3.3.1's backoff prints float(scale), which NumPy 2 refuses
    for shape [1]; the arithmetic is the same."""
    import paddle.amp.grad_scaler as grad_scaler

    saved = grad_scaler._dygraph_tracer
    grad_scaler._dygraph_tracer = lambda: SimpleNamespace(_expected_place=_GpuPlace())
    try:
        native = getattr(paddle.amp, cls_name)(*args, **kwargs)
    finally:
        grad_scaler._dygraph_tracer = saved
    assert native.is_enable()
    native._scale = paddle.to_tensor(np.float32(native._scale.numpy().reshape(-1)[0]))
    return native


def paddle_run(native, kinds: str, model=None, opt=None):
    if model is None:
        paddle.seed(0)
        model = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    scales = []
    for kind in kinds:
        x = paddle.ones([2, 4])
        if kind == "I":
            x[0, 0] = float("inf")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with paddle.amp.auto_cast(dtype="float16"):  # paddle's scale() wants it
                scaled = native.scale(model(x).sum())
        scaled.backward()
        if hasattr(native, "step"):
            native.step(opt)
            native.update()
        else:  # AmpScaler: minimize unscales, steps and updates
            native.minimize(opt, scaled)
        opt.clear_grad()
        scales.append(float(native._scale.numpy().reshape(-1)[0]))  # ours keeps it there too
    return scales, model, opt


PADDLE_CALLS = [
    ("GradScaler", (True, 1024.0, 2.0, 0.5, 3, 2), {}),
    ("GradScaler", (), {"init_loss_scaling": 2048.0, "incr_every_n_steps": 2}),
    ("GradScaler", (), {"init_loss_scaling": 512.0, "incr_ratio": 3.0, "decr_ratio": 0.25,
                        "incr_every_n_steps": 4, "decr_every_n_nan_or_inf": 1}),
    ("AmpScaler", (True, 1024.0), {"incr_every_n_steps": 3}),
]


@pytest.mark.parametrize(("cls_name", "args", "kwargs"), PADDLE_CALLS)
def test_paddle_call_config_follows_paddles_own_trajectory(cls_name, args, kwargs):
    config, _ = config_from_call(f"paddle.amp.{cls_name}", args, kwargs)
    scales, _, _ = paddle_run(paddle_native(cls_name, *args, **kwargs), KINDS)
    assert hexes(scales) == reference(config, KINDS)


def test_paddle_torch_port_needs_the_explicit_hysteresis():
    # What a paddle 2.x port without decr_every_n_nan_or_inf=1 would run instead.
    config = ScalerConfig(1024.0, growth_interval=3)
    kwargs, _ = native_call(config, "paddle")
    ported = paddle_run(paddle_native("GradScaler", **kwargs), KINDS)[0]
    assert hexes(ported) == reference(config, KINDS)
    paddle2 = config_from_call("paddle.amp.GradScaler", (), {k: v for k, v in kwargs.items()
                               if k != "decr_every_n_nan_or_inf"}, version="2")[0]
    assert reference(paddle2, KINDS) != reference(config, KINDS)


def test_paddle_native_call_round_trips_and_from_native_keeps_state():
    config = ScalerConfig(1024.0, 3.0, 0.25, 3, hysteresis=2)
    kwargs, problems = native_call(config, "paddle")
    assert problems == []
    native = paddle_native("GradScaler", **kwargs)
    assert from_native(native).config == config
    _, model, opt = paddle_run(native, "FFIFFI")  # a pending non-finite update
    ours = from_native(native)
    assert ours.backend == "paddle" and ours.state == ScalerState(1024.0, 0, 1)
    a, _, _ = paddle_run(native, KINDS, model, opt)
    b, _, _ = paddle_run(ours, KINDS)
    assert hexes(a) == hexes(b)


def test_paddle_disabled_on_cpu_is_a_disabled_scaler():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native = paddle.amp.GradScaler()  # paddle 3.3.1 disables it on CPU
    assert not from_native(native).is_enabled()
