"""Misuse of the Paddle scaler gets one clear error and changes nothing: the checks every
imperative backend shares (tests/support/imperative_misuse_checks.py), and two threads
driving one scaler."""

from __future__ import annotations

import threading

import pytest
from imperative_misuse_checks import FrameworkMisuseContract, iteration


class TestImperativeMisuse(FrameworkMisuseContract):
    backend = "paddle"


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
