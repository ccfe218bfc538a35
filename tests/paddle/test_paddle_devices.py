"""The Paddle backend's devices: a CPU-only build refuses the GPU naming the fix, a bad
device string or object is named, and every CPU spelling keeps the scale on the CPU."""

from __future__ import annotations

import pytest

paddle = pytest.importorskip("paddle")

from paddle_helpers import paddle_scalar, scaler_of  # noqa: E402


def test_gpu_on_a_cpu_only_build_raises_naming_the_fix():
    # Paddle's own message here is '<re.Match object ...>'; ours names the fix.
    if paddle.is_compiled_with_cuda():
        pytest.skip("measures the CPU-only build")
    for device in ("gpu", "gpu:0", "cuda", "cuda:1"):
        with pytest.raises(RuntimeError, match=r"built without CUDA.*pass device='cpu' or "
                                               r"enabled=False, or install paddlepaddle-gpu"):
            scaler_of(device=device)


@pytest.mark.parametrize("device", ["tpu", "npu", "", "cpu:abc", "xpu:0"])
def test_a_bad_device_string_raises_value_error(device):
    # A typo, or a device this build lacks, is a ValueError that lists what is valid
    # (Paddle's own message for xpu on a CPU build shows a regex match object).
    with pytest.raises(ValueError, match=rf"device={device!r} is not a device this paddle can "
                                         r"use: pass 'cpu'") as info:
        scaler_of(device=device)
    assert "re.Match" not in str(info.value)


def test_cpu_devices_and_places():
    # `unifiedamp backends` lists devices(), cpu first; every CPU spelling keeps the scale
    # on the CPU.
    from unifiedamp.backends.paddle import PaddleGradScaler

    devices = PaddleGradScaler.devices()
    assert devices[0] == "cpu"
    if not paddle.is_compiled_with_cuda():
        assert devices == ["cpu"]
    for device in (None, "cpu", "CPU", paddle.CPUPlace()):
        scaler = scaler_of(1024.0, device=device)
        assert scaler._scale.place.is_cpu_place()
        assert scaler.scale(paddle_scalar(1.0)).item() == 1024.0


def test_a_device_that_is_neither_a_string_nor_a_place_is_named_with_the_fix():
    with pytest.raises(TypeError, match=r"device=3 \(int\): .*'gpu:3'"):
        scaler_of(1024.0, device=3)
    assert scaler_of(1024.0, device=paddle.CPUPlace()).get_scale() == 1024.0
