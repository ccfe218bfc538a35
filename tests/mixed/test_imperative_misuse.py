"""Misuse of the imperative scalers (NumPy, torch, Paddle) gets one clear error on every backend
and changes nothing: a load between an iteration's checks and its update, a history ring too
large for any device, a process group that is not one, a non-finite manual scale, and two
threads driving one scaler.

Each backend trains a real one-parameter model with its real optimizer and autodiff (NumPy:
the reference SGD with hand-written gradients).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import unifiedamp as ua
from unifiedamp._scaler import MAX_HISTORY


def iteration(backend):
    """A scaler and one iteration's ``step`` on an inf gradient: ``(scaler, step)``."""
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend=backend)
    if backend == "numpy":
        from unifiedamp.backends.numpy import SGD

        opt = SGD([np.ones(2, np.float32)], lr=0.1)

        def step():
            scaler.scale(np.float32(1.0))
            opt.grads = [np.array([np.inf, 1.0], np.float32)]
            scaler.step(opt)
    elif backend == "torch":
        torch = pytest.importorskip("torch")
        w = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([w], lr=0.1)

        def step():
            scaler.scale((w * torch.tensor([float("inf"), 1.0])).sum()).backward()
            scaler.step(opt)
    else:
        paddle = pytest.importorskip("paddle")
        layer = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=layer.parameters())

        def step():
            x = paddle.to_tensor([[float("inf"), 1.0]])
            scaler.scale(layer(x).sum()).backward()
            scaler.step(opt)
    return scaler, step


BACKENDS = ["numpy", pytest.param("torch", marks=pytest.mark.framework("torch")),
            pytest.param("paddle", marks=pytest.mark.framework("paddle"))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_load_between_step_and_update_is_refused_and_changes_nothing(backend):
    scaler, step = iteration(backend)
    checkpoint = ua.GradScaler(4096.0, backend="numpy").state_dict()
    step()
    before = scaler.state_dict()
    with pytest.raises(RuntimeError, match="between step\\(\\)/unscale_\\(\\) and update\\(\\)"):
        scaler.load_state_dict(checkpoint)
    assert scaler.state_dict() == before
    scaler.update()  # the inf of this iteration backs off the scale it was checked under
    assert scaler.get_scale() == 512.0
    scaler.load_state_dict(checkpoint)  # between iterations a load is what it always was
    assert scaler.get_scale() == 4096.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_history_past_the_maximum_is_refused_at_construction(backend):
    if backend != "numpy":
        pytest.importorskip(backend)
    with pytest.raises(ValueError, match=f"at most {MAX_HISTORY} \\(MAX_HISTORY\\), got "
                                         f"{2**40}"):
        ua.GradScaler(backend=backend, history=2**40)
    assert ua.GradScaler(backend=backend, history=4).history() is not None


@pytest.mark.parametrize("backend", ["jax", "mlx"])
def test_a_functional_history_ring_past_the_maximum_is_refused(backend):
    module = pytest.importorskip(f"unifiedamp.backends.{backend}")
    with pytest.raises(ValueError, match=f"at most {MAX_HISTORY}"):
        module.history_init(2**40)


@pytest.mark.parametrize("backend", [pytest.param("torch", marks=pytest.mark.framework("torch")),
                                     pytest.param("paddle",
                                                  marks=pytest.mark.framework("paddle"))])
def test_a_process_group_that_is_not_a_group_is_refused(backend):
    pytest.importorskip(backend)
    with pytest.raises(TypeError, match=f"process_group must be a {backend}.distributed group "
                                        ".* got 'x'"):
        ua.GradScaler(backend=backend, process_group="x")


@pytest.mark.framework("torch")
@pytest.mark.parametrize("value", [float("nan"), -4.0, float("inf")])
def test_a_non_finite_or_negative_manual_scale_tensor_is_refused(value):
    torch = pytest.importorskip("torch")
    scaler, step = iteration("torch")
    step()
    scaler.update()
    before = scaler.state_dict()
    with pytest.raises(ValueError, match="new_scale must be finite and > 0"):
        scaler.update(new_scale=torch.tensor(value))
    assert scaler.state_dict() == before
    scaler.update(new_scale=torch.tensor(64.0))
    ua.GradScaler(backend="torch").load_state_dict(scaler.state_dict())  # reloads its own


@pytest.mark.framework("paddle")
def test_two_threads_driving_one_paddle_scaler_fail_loudly():
    pytest.importorskip("paddle")
    scaler, step = iteration("paddle")
    first_began, second_done, errors = threading.Event(), threading.Event(), []

    def first():
        step()  # begins an iteration...
        first_began.set()
        second_done.wait(timeout=60)
        scaler.update()  # ...and ends it: its one inf, one backoff

    def second():
        first_began.wait(timeout=60)
        try:
            step()
        except RuntimeError as exc:
            errors.append(str(exc))
        second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(errors) == 1 and "not thread-safe" in errors[0], errors
    assert scaler.get_scale() == 512.0
    step()  # after the update, any thread may begin the next iteration
    scaler.update()
    assert scaler.get_scale() == 256.0
