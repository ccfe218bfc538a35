"""Misuse of the imperative scalers (NumPy, torch, Paddle) gets one clear error on every
backend and changes nothing: the checks every backend shares, as classes each session's
``test_imperative_misuse.py`` instantiates with its ``backend``.

Each backend trains a real one-parameter model with its real optimizer and autodiff (NumPy:
the reference SGD with hand-written gradients).
"""

from __future__ import annotations

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


class ImperativeMisuseContract:
    """What every imperative backend (``backend``: numpy, torch or paddle) refuses."""

    backend: str | None = None

    def test_a_load_between_step_and_update_is_refused_and_changes_nothing(self):
        scaler, step = iteration(self.backend)
        checkpoint = ua.GradScaler(4096.0, backend="numpy").state_dict()
        step()
        before = scaler.state_dict()
        with pytest.raises(RuntimeError,
                           match="between step\\(\\)/unscale_\\(\\) and update\\(\\)"):
            scaler.load_state_dict(checkpoint)
        assert scaler.state_dict() == before
        scaler.update()  # the inf of this iteration backs off the scale it was checked under
        assert scaler.get_scale() == 512.0
        scaler.load_state_dict(checkpoint)  # between iterations a load is what it always was
        assert scaler.get_scale() == 4096.0

    def test_a_history_past_the_maximum_is_refused_at_construction(self):
        backend = self.backend
        if backend != "numpy":
            pytest.importorskip(backend)
        with pytest.raises(ValueError, match=f"at most {MAX_HISTORY} \\(MAX_HISTORY\\), got "
                                             f"{2**40}"):
            ua.GradScaler(backend=backend, history=2**40)
        assert ua.GradScaler(backend=backend, history=4).history() is not None


class FrameworkMisuseContract(ImperativeMisuseContract):
    """What the imperative backends of a framework with process groups (torch, paddle) also
    refuse."""

    def test_a_process_group_that_is_not_a_group_is_refused(self):
        backend = self.backend
        pytest.importorskip(backend)
        with pytest.raises(TypeError, match=f"process_group must be a {backend}.distributed "
                                            "group .* got 'x'"):
            ua.GradScaler(backend=backend, process_group="x")


class FunctionalHistoryContract:
    """The history ring of a functional backend (``backend``: jax or mlx)."""

    backend: str | None = None

    def test_a_functional_history_ring_past_the_maximum_is_refused(self):
        module = pytest.importorskip(f"unifiedamp.backends.{self.backend}")
        with pytest.raises(ValueError, match=f"at most {MAX_HISTORY}"):
            module.history_init(2**40)


def check_update_new_scale_types(scaler):
    """``update(new_scale)`` takes a float or a 1-element array/tensor, refuses anything else
    with one message, and counts no step (``scaler``: a fresh one at 1024)."""
    for good in (8, 8.0, np.float32(8.0)):
        scaler.update(good)
        assert scaler.get_scale() == 8.0
    for good in (np.array([8.0]), np.array(8.0)):
        scaler.update(new_scale=good)
        assert scaler.get_scale() == 8.0
    for bad in (True, [8.0], "8", np.ones(2)):
        with pytest.raises(TypeError, match="new_scale must be a float or a 1-element "
                                            "array/tensor, got"):
            scaler.update(new_scale=bad)
        if bad is not True:  # positional, a bool is update(finite)'s flag
            with pytest.raises(TypeError, match=r"as its flag.*new_scale="):
                scaler.update(bad)
    assert scaler.get_scale() == 8.0 and scaler.num_steps == 0


def check_a_non_bool_flag_is_refused(scaler, inf_grads, flag):
    """``update(flag(finite))`` with a non-bool flag made from ``unscale``'s is a TypeError
    that changes nothing; the flag itself then backs off (``scaler``: a fresh one at 1024)."""
    _, finite = scaler.unscale(inf_grads)
    with pytest.raises(TypeError, match=r"as its flag.*new_scale="):
        scaler.update(flag(finite))
    assert (scaler.get_scale(), scaler.num_steps) == (1024.0, 0)
    scaler.update(finite)
    assert (scaler.get_scale(), scaler.num_skipped_steps) == (512.0, 1)


def check_new_scale_positional_number_or_keyword_tensor(scaler, tensor):
    """torch's ``update(new_scale)``: a plain number first, a tensor by keyword; no step."""
    assert scaler.update(256.0).get_scale() == 256.0
    assert scaler.update(new_scale=tensor).get_scale() == 64.0
    assert scaler.num_steps == 0


def check_a_flag_of_another_framework_is_refused(scaler, grads, fix):
    """A 0-d bool array of no known framework is refused, naming ``fix`` (a regex)."""
    class OtherBool:
        dtype, shape = np.dtype(bool), ()

        def __bool__(self):
            return True

    scaler.unscale(grads)
    with pytest.raises(TypeError, match=rf"OtherBool flag.*{fix}"):
        scaler.update(OtherBool())
    assert scaler.num_steps == 0


def check_a_flag_stands_for_the_unscale_checks_it_was_made_from(scaler, inf, one, both,
                                                                  recorded=True):
    """As on jax and mlx, which record no unscale(): ``update(flag)`` decides from the flag.

    ``scaler`` starts at 1024 with ``growth_interval=1``; ``inf`` and ``one`` are gradients
    (with and without an inf), ``both(f1, f2)`` the framework's logical and. ``recorded``:
    the backend records ``unscale``'s checks for a flag-less ``update()`` (Keras does not).
    """
    _, first = scaler.unscale(inf)
    _, second = scaler.unscale(one)
    scaler.update(second)
    assert (scaler.get_scale(), scaler.last_step_skipped) == (2048.0, False)
    _, first = scaler.unscale(inf)
    _, second = scaler.unscale(one)
    scaler.update(both(first, second))
    assert (scaler.get_scale(), scaler.last_step_skipped) == (1024.0, True)
    if recorded:
        scaler.unscale(inf)
        scaler.unscale(one)
        scaler.update()  # no flag: the checks unscale() recorded
        assert (scaler.get_scale(), scaler.last_step_skipped) == (512.0, True)
