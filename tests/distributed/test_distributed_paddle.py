"""Paddle data parallelism on two CPU ranks (gloo), an inf on one rank only
(``unifiedamp.conformance.engines.paddle``).

Each test is one launch of two ranks (about 7 s), six steps; the launch kills every rank at
its timeout. Each rank's records are checked against the spec step by step: scale and
trackers, the skip decision, the weights equal across ranks and equal to one process taking
the spec's steps on the mean gradient.

Under fleet and DataParallel the gradients are all-reduced in ``backward``, so an inf on one
rank reaches every rank's gradients before the scaler checks them; the scaler's own
all-reduce of found_inf is what ``tests/test_paddle_distributed.py`` checks, on ranks that
keep their own gradients. Same command by hand: ``python -m unifiedamp.conformance.engines
paddle fleet unifiedamp`` (or ``data-parallel``, and ``paddle`` for the native scaler).
"""

from __future__ import annotations

import importlib.util
import math

import pytest

from unifiedamp.conformance.engines import DEFAULT_CONFIG, default_kinds, expected_states

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.framework("paddle"),
    pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                       reason="paddle not installed"),
]

TIMEOUT = 120  # a launch takes about 7 s; a rank left waiting in a collective never ends


def run(engine: str, scaler: str):
    # The engine module imports no framework; its ranks import Paddle.
    from unifiedamp.conformance.engines import paddle as engines

    return engines.run(engine, scaler, timeout=TIMEOUT)


def assert_ok(result) -> None:
    outcome = result.outcome
    assert outcome.status == "ok", f"{outcome.status}: {outcome.detail}\n" + "\n".join(
        outcome.logs)


@pytest.mark.parametrize("engine", ["fleet", "data-parallel"])
def test_data_parallel_engines_follow_the_spec_with_an_inf_on_one_rank(engine):
    result = run(engine, "unifiedamp")
    assert_ok(result)
    assert result.problems() == []
    kinds = default_kinds(2)
    for rank, record in enumerate(result.outcome.records):
        assert "".join(s["kind"] for s in record["steps"]) == kinds[rank]
        assert [s["scale"] for s in record["steps"]] == [
            s.scale for s in expected_states(DEFAULT_CONFIG, kinds)]


def test_native_grad_scaler_under_fleet_on_cpu_never_scales_and_steps_on_the_inf():
    """paddle.amp.GradScaler made on a CPU place disables itself (a warning: "so it makes
    no effect"): under fleet on CPU it never scales the loss, never skips, and the inf on
    rank 0 at step 1, all-reduced into both ranks' gradients, goes into both ranks'
    weights."""
    result = run("fleet", "paddle")
    assert_ok(result)
    assert all("so it makes no effect" in log for log in result.outcome.logs)
    for record in result.outcome.records:
        steps = record["steps"]
        assert [(s["scale"], s["growth"], s["hysteresis"]) for s in steps] == [(1.0, 0, 0)] * 6
        assert all(s["stepped"] for s in steps)
        assert all(math.isfinite(w) for w in steps[0]["weights"])
        assert not all(math.isfinite(w) for w in steps[1]["weights"])
    problems = result.problems()
    assert problems[0] == "step 0, rank 0: scale 1.0, trackers 0, 0 (the spec: 1024.0, 1, 0)"
    assert "step 1, rank 1: stepped (the spec skips: an inf or NaN on a rank)" in problems
    assert "step 1, rank 1: non-finite weights" in problems
