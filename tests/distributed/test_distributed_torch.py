"""torch's distributed engines on CPU processes (gloo), with an inf on one rank only.

The unifiedamp scaler follows the spec in every engine of
``unifiedamp.conformance.engines.torch``: each rank's scale and trackers, its skip
decisions and the whole model's weights, step by step (and, where the engine
averages the ranks' gradients, the weights of a single process taking the spec's
steps). The ``test_native_*`` tests show what torch's own scalers do in the same
settings, so that what the docs say of them stays true as torch changes.

Each test is one launch of 2 processes (HSDP: 4), 6 steps, bounded by the
launch's timeout: about 5 s (HSDP 9 s), up to 20 s on two busy cores; the
deadlock ends 15 s after its ranks stop using the CPU (about 16 s). The whole file:
about a minute.
"""

from __future__ import annotations

import pytest

from unifiedamp.conformance.engines import NO_GRADIENT, Run, verdict
from unifiedamp.conformance.engines import torch as engines

pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

pytestmark = [pytest.mark.distributed, pytest.mark.framework("torch")]

# The optional variants of FSDP1: slow (one launch each), left out by -m "not slow".
_SLOW = {"fsdp1-orig", "fsdp1-clip"}
# The run ends as a deadlock when its ranks have used no CPU for 15 s; should they
# never stop (a rank spinning), at this timeout. The ranks reach step 1 in 5 s, 15 s
# on two busy cores, and once took over 20 s.
DEADLOCK_TIMEOUT = 60


def _explain(run: Run) -> str:
    logs = "\n".join(f"--- rank {rank}:\n{log[-1500:]}"
                     for rank, log in enumerate(run.outcome.logs))
    return f"{verdict(run.problems())}\n{run.outcome.detail}\n{logs}"


def _scales(run: Run, step: int) -> list[float]:
    return [record["steps"][step]["scale"] for record in run.outcome.records]


@pytest.mark.parametrize("engine", [
    pytest.param(name, marks=[pytest.mark.slow] if name in _SLOW else [])
    for name in engines.ENGINES])
def test_unifiedamp_follows_the_spec_in_the_engine(engine):
    run = engines.run(engine, "unifiedamp")
    assert run.outcome.status == "ok", _explain(run)
    assert run.problems() == [], _explain(run)
    # A run that never stepped or never skipped would check little.
    stepped = [s["stepped"] for record in run.outcome.records for s in record["steps"]]
    assert any(stepped) and not all(stepped)
    assert (run.reference is not None) == (engine != "no-grad")


def test_native_torch_amp_under_ddp_leaves_the_replicas_with_different_weights():
    """torch.amp.GradScaler reads found_inf on its own rank only: with an inf on rank 0
    only, rank 1 steps and grows its scale while rank 0 skips and backs off, so the
    DDP replicas hold different weights from then on."""
    run = engines.run("ddp", "torch.amp")
    assert run.outcome.status == "ok", _explain(run)
    problems = run.problems()
    assert "step 1: the ranks' weights differ" in problems, _explain(run)
    assert _scales(run, 1) == [512.0, 2048.0]


def test_native_torch_amp_under_zero_deadlocks_in_zeros_broadcast():
    """ZeroRedundancyOptimizer's step broadcasts each rank's shard: torch.amp skips
    the step on the rank with the inf only, which goes on to the next backward's
    all-reduce while its peer waits in ZeRO's broadcast (_sync_params): no rank ends."""
    run = engines.run("zero", "torch.amp", timeout=DEADLOCK_TIMEOUT)
    assert run.outcome.status == "deadlock", _explain(run)
    # The ranks' stacks, printed before the timeout, say where each one waits.
    logs = run.outcome.logs
    assert any("in _sync_params" in log for log in logs), _explain(run)
    assert any("in backward" in log for log in logs), _explain(run)


def test_native_torch_amp_with_a_rank_without_gradients_raises_no_inf_checks():
    """A rank whose loss reaches no parameter has no gradient for torch.amp to check:
    its step() raises, where the unifiedamp scaler still joins the ranks' found_inf."""
    run = engines.run("no-grad", "torch.amp")
    assert run.kinds[0][1] == NO_GRADIENT
    assert run.outcome.status == "error", _explain(run)
    assert run.outcome.detail == ("AssertionError: No inf checks were recorded for this "
                                  "optimizer."), _explain(run)


def test_native_sharded_grad_scaler_under_fsdp1_with_a_fused_optimizer_splits_the_scale():
    """ShardedGradScaler all-reduces found_inf in unscale_() only; a fused optimizer's
    step takes torch.amp's path, which checks the rank's own shard: the rank with the
    inf backs off, its peer grows, and the ranks' scales differ."""
    run = engines.run("fsdp1-fused", "sharded")
    assert run.outcome.status == "ok", _explain(run)
    assert _scales(run, 1) == [512.0, 2048.0], _explain(run)
    assert any("stepped (the spec skips" in p for p in run.problems())


def test_native_torch_amp_under_fsdp2_follows_the_spec():
    """Under fully_shard the gradients are DTensors, and DTensor's handler of the
    unscale kernel all-reduces found_inf over the mesh's sharded dimension: torch.amp
    follows the spec there (the unifiedamp scaler adds its own all-reduce of the
    0-d flag)."""
    run = engines.run("fsdp2", "torch.amp")
    assert run.problems() == [], _explain(run)


@pytest.mark.slow
def test_native_torch_amp_under_hsdp_splits_the_replicas():
    """DTensor's found_inf handler reduces over sharded mesh dimensions only, not over
    replicated ones: under HSDP (2 x 2 mesh) an inf on rank 0's shard reaches rank 1
    (same replica) but not ranks 2 and 3 (the other replica), which step and grow."""
    run = engines.run("hsdp", "torch.amp")
    assert run.outcome.status == "ok", _explain(run)
    assert _scales(run, 1) == [512.0, 512.0, 2048.0, 2048.0], _explain(run)


def test_an_engine_refuses_a_scaler_it_cannot_run_and_kinds_for_another_world():
    with pytest.raises(ValueError, match="does not run with scaler 'torch.amp'"):
        engines.run("ddp-hysteresis", "torch.amp")
    with pytest.raises(ValueError, match="does not run with scaler 'sharded'"):
        engines.run("ddp", "sharded")
    with pytest.raises(ValueError, match="give 4 strings"):
        engines.run("hsdp", "unifiedamp", kinds=["FF", "FF"])
    with pytest.raises(ValueError, match="no hysteresis"):
        engines.run("ddp", "torch.amp", config=engines.config_of("ddp-hysteresis"))
    with pytest.raises(ValueError, match=r"kinds \['-'\] .* this engine takes F, I, N"):
        engines.run("ddp", "unifiedamp", kinds=["F-", "FF"])
    with pytest.raises(ValueError, match="unknown torch engine 'fsdp3'"):
        engines.run("fsdp3", "unifiedamp")
