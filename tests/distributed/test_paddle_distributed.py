"""PaddleGradScaler on two CPU ranks (``paddle.distributed.launch``, gloo): found_inf agreed.

Each launch costs about 6 s, so a launch runs several iterations and each one is
checked against the spec's reference rule (found_inf: any rank's inf). The ``run``
fixture is one launch: an inf on rank 1 only at iteration 0, then all finite.

Every launch has a timeout: a rank that fails to join the all-reduce makes the run
raise (every rank killed) instead of hanging the suite.
"""

from __future__ import annotations

import pytest
from _shared_child import shared_result

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState

CONFIG = ScalerConfig(1024.0, growth_interval=2)
KINDS = ["FFFF", "IFFF"]
pytestmark = pytest.mark.distributed

TIMEOUT = 120  # a launch takes about 6 s; a rank left waiting in a collective never ends


def run_ranks(*args, **kwargs):
    pytest.importorskip("paddle")
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
def run(tmp_path_factory):
    return shared_result(tmp_path_factory, "paddle_distributed", lambda: run_ranks(
        CONFIG.to_dict(), KINDS, iterations=len(KINDS[0])))


@pytest.mark.framework("paddle")
def test_the_launch_runs_two_ranks_with_their_own_gradients(run):
    assert [r["rank"] for r in run] == [0, 1]
    assert all(r["world_size"] == 2 for r in run)
    for rank, result in enumerate(run):
        assert "".join(it["kind"] for it in result["iterations"]) == KINDS[rank]


@pytest.mark.framework("paddle")
def test_inf_on_rank_1_only_skips_the_same_step_on_both_ranks(run):
    expected = spec.update(CONFIG, ScalerState.initial(CONFIG), True)
    assert expected == ScalerState(512.0, 0, 0)
    for rank, result in enumerate(run):
        first = result["iterations"][0]
        assert first["kind"] == "FI"[rank]
        assert not first["stepped"], f"rank {rank} changed its parameters at the inf step"
        assert first["skipped"] == 1, f"rank {rank}: {first}"
        assert_state(first["state"], expected, f"rank {rank} after an inf on rank 1 only")


@pytest.mark.framework("paddle")
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


@pytest.mark.framework("paddle")
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


@pytest.mark.framework("paddle")
def test_distributed_false_keeps_ranks_independent():
    results = run_ranks(CONFIG.to_dict(), ["F", "I"], scaler_options={"distributed": False})
    initial = ScalerState.initial(CONFIG)
    rank0, rank1 = results
    assert rank0["stepped"] and rank0["skipped"] == 0
    assert_state(rank0["state"], spec.update(CONFIG, initial, False), "rank 0 (finite)")
    assert not rank1["stepped"] and rank1["skipped"] == 1
    assert_state(rank1["state"], spec.update(CONFIG, initial, True), "rank 1 (inf)")


@pytest.mark.framework("paddle")
def test_a_failing_rank_raises_with_its_log():
    with pytest.raises(RuntimeError, match="(?s)workerlog.0.*no_such_option"):
        run_ranks(CONFIG.to_dict(), ["F", "F"], scaler_options={"no_such_option": 1})
