"""Paddle on two CPU ranks (gloo), an inf on one rank only: the scaler's own all-reduce of
found_inf on ranks that keep their own gradients, and Paddle's data-parallel engines.

The scaler's agreement (``unifiedamp.conformance.adapters.paddle.run_ranks``: ``python -m
paddle.distributed.launch``, each rank with its own gradients): each launch costs about 6 s,
so a launch runs several iterations and each one is checked against the spec's reference
rule (found_inf: any rank's inf). The ``run`` fixture is one launch per module: an inf on
rank 1 only at iteration 0, then all finite. Every launch has a timeout: a rank that fails
to join the all-reduce makes the run raise (every rank killed) instead of hanging the suite.

The engines (``unifiedamp.conformance.engines.paddle``): each test is one launch of two ranks
(about 7 s), six steps; the launch kills every rank at its timeout. Each rank's records are
checked against the spec step by step: scale and trackers, the skip decision, the weights
equal across ranks and equal to one process taking the spec's steps on the mean gradient.
Under fleet and DataParallel the gradients are all-reduced in ``backward``, so an inf on one
rank reaches every rank's gradients before the scaler checks them; the scaler's own
all-reduce of found_inf is what the tests above check, on ranks that keep their own
gradients. Same command by hand: ``python -m unifiedamp.conformance.engines paddle fleet
unifiedamp`` (or ``data-parallel``, and ``paddle`` for the native scaler).
"""

from __future__ import annotations

import importlib.util
import math

import pytest

from unifiedamp import spec
from unifiedamp.conformance.engines import DEFAULT_CONFIG, default_kinds
from unifiedamp.conformance.engines import expected_states as engine_states
from unifiedamp.spec import ScalerConfig, ScalerState

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                       reason="paddle not installed"),
]

CONFIG = ScalerConfig(1024.0, growth_interval=2)
KINDS = ["FFFF", "IFFF"]

TIMEOUT = 120  # a launch takes about 6 s; a rank left waiting in a collective never ends


def run_ranks(*args, **kwargs):
    # Imports paddle here (the ranks import it too).
    from unifiedamp.conformance.adapters.paddle import run_ranks

    return run_ranks(*args, timeout=TIMEOUT, **kwargs)


def expected_states(kinds_per_rank: list[str], iterations: int) -> list[ScalerState]:
    """The reference state after each iteration: found_inf is any rank's inf/NaN."""
    state, out = ScalerState.initial(CONFIG), []
    for i in range(iterations):
        found_inf = any(k[min(i, len(k) - 1)] in "IN" for k in kinds_per_rank)
        state = spec.update(CONFIG, state, found_inf)
        out.append(state)
    return out


def assert_state(got: list, expected: ScalerState, where: str) -> None:
    scale, growth, hysteresis = got
    assert isinstance(growth, int) and isinstance(hysteresis, int), f"{where}: {got}"
    assert spec.f32(scale) == scale, f"{where}: scale {scale!r} is no float32 value"
    assert ScalerState(scale, growth, hysteresis) == expected, (
        f"{where}: expected {expected}, got {got}")


@pytest.fixture(scope="module")
def run():
    return run_ranks(CONFIG.to_dict(), KINDS, iterations=len(KINDS[0]))


def test_the_launch_runs_two_ranks_with_their_own_gradients(run):
    assert [r["rank"] for r in run] == [0, 1]
    assert all(r["world_size"] == 2 for r in run)
    for rank, result in enumerate(run):
        assert "".join(it["kind"] for it in result["iterations"]) == KINDS[rank]


def test_inf_on_rank_1_only_skips_the_same_step_on_both_ranks(run):
    expected = spec.update(CONFIG, ScalerState.initial(CONFIG), True)
    assert expected == ScalerState(512.0, 0, 0)
    for rank, result in enumerate(run):
        first = result["iterations"][0]
        assert first["kind"] == "FI"[rank]
        assert not first["stepped"], f"rank {rank} changed its parameters at the inf step"
        assert first["skipped"] == 1, f"rank {rank}: {first}"
        assert_state(first["state"], expected, f"rank {rank} after an inf on rank 1 only")


def test_all_finite_steps_both_ranks_and_grows_on_schedule(run):
    expected = expected_states(KINDS, len(KINDS[0]))
    assert [s.scale for s in expected[1:4]] == [512.0, 1024.0, 1024.0]  # grows at iteration 2
    for rank, result in enumerate(run):
        for i in (1, 2, 3):
            it = result["iterations"][i]
            assert it["stepped"] and it["skipped"] == 1, f"rank {rank}, iteration {i}: {it}"
            assert_state(it["state"], expected[i], f"rank {rank}, iteration {i}")
        # The run's totals, as torch's run_ranks reports them.
        assert result["stepped"] and result["skipped"] == 1
        assert_state(result["state"], expected[-1], f"rank {rank} at the end")


def test_a_rank_without_gradients_joins_the_collective():
    # Rank 1's optimizer gets no gradient at all ("-"). Iteration 0: rank 0 finite;
    # iteration 1: rank 0 an inf. Had rank 1 not joined the all-reduce, rank 0 would
    # have waited in it forever: the launch would have timed out and raised.
    kinds = ["FI", "--"]
    expected = expected_states(kinds, 2)
    results = run_ranks(CONFIG.to_dict(), kinds, iterations=2)
    rank0, rank1 = (r["iterations"] for r in results)
    assert rank0[0]["stepped"] and rank0[0]["skipped"] == 0
    assert not rank1[0]["stepped"] and rank1[0]["skipped"] == 0  # nothing to step, not skipped
    assert not rank0[1]["stepped"] and not rank1[1]["stepped"]
    assert rank0[1]["skipped"] == rank1[1]["skipped"] == 1  # rank 1 skips rank 0's inf too
    for i in (0, 1):
        for rank, its in enumerate((rank0, rank1)):
            assert_state(its[i]["state"], expected[i], f"rank {rank}, iteration {i}")


def test_distributed_false_keeps_ranks_independent():
    results = run_ranks(CONFIG.to_dict(), ["F", "I"], scaler_options={"distributed": False})
    initial = ScalerState.initial(CONFIG)
    rank0, rank1 = results
    assert rank0["stepped"] and rank0["skipped"] == 0
    assert_state(rank0["state"], spec.update(CONFIG, initial, False), "rank 0 (finite)")
    assert not rank1["stepped"] and rank1["skipped"] == 1
    assert_state(rank1["state"], spec.update(CONFIG, initial, True), "rank 1 (inf)")


def test_a_failing_rank_raises_with_its_log():
    with pytest.raises(RuntimeError, match="(?s)workerlog.0.*no_such_option"):
        run_ranks(CONFIG.to_dict(), ["F", "F"], scaler_options={"no_such_option": 1})


# -------------------------------------------------------------- the engines


def run_engine(engine: str, scaler: str):
    # The engine module imports no framework; its ranks import Paddle.
    from unifiedamp.conformance.engines import paddle as engines

    return engines.run(engine, scaler, timeout=TIMEOUT)


def assert_ok(result) -> None:
    outcome = result.outcome
    assert outcome.status == "ok", f"{outcome.status}: {outcome.detail}\n" + "\n".join(
        outcome.logs)


@pytest.mark.parametrize("engine", ["fleet", "data-parallel"])
def test_data_parallel_engines_follow_the_spec_with_an_inf_on_one_rank(engine):
    result = run_engine(engine, "unifiedamp")
    assert_ok(result)
    assert result.problems() == []
    kinds = default_kinds(2)
    for rank, record in enumerate(result.outcome.records):
        assert "".join(s["kind"] for s in record["steps"]) == kinds[rank]
        assert [s["scale"] for s in record["steps"]] == [
            s.scale for s in engine_states(DEFAULT_CONFIG, kinds)]


def test_native_grad_scaler_under_fleet_on_cpu_never_scales_and_steps_on_the_inf():
    """paddle.amp.GradScaler made on a CPU place disables itself (a warning: "so it makes
    no effect"): under fleet on CPU it never scales the loss, never skips, and the inf on
    rank 0 at step 1, all-reduced into both ranks' gradients, goes into both ranks'
    weights."""
    result = run_engine("fleet", "paddle")
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
