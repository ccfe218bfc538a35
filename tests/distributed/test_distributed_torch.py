"""torch under gloo on CPU processes: the distributed engines with an inf on one rank only,
and the teardown recipe that leaves torch.distributed without an abort at exit.

The engines: the unifiedamp scaler follows the spec in every engine of
``unifiedamp.conformance.engines.torch``, with the overflow in one rank's input (its loss
inf, carried to every rank by the engine's reduction) and with an inf written into one
rank's gradient after the reduction: each rank's scale and trackers, its skip decisions
and the whole model's weights, step by step (and, where the engine averages the ranks'
gradients, the weights of a single process taking the spec's steps). The
``test_native_*`` tests show what torch's own scalers do in the same settings, so that
what the docs say of them stays true as torch changes.

A launch costs about 5 s of imports and joining (15 s on two busy cores), a setting (an
engine with one scaler and one overflow, 6 steps) a fraction of a second: the settings of
engines that run as many ranks share a launch (:data:`LAUNCHES`), which the tests read
(:func:`setting`). A setting that cannot end (a deadlock, a crash) has a launch of its own;
the deadlock ends when gloo's collective timeout (:data:`DEADLOCK_COLLECTIVE_TIMEOUT`)
ends the ranks' waits, about 30 s in. The engines: about a minute and a half.

The teardown: a gloo worker thread drops its finished work (and the tensors in it) after it
has woken the caller. When the process group outlives ``destroy_process_group()``
(something holds it: torch.distributed.nn's collectives keep ``group.WORLD`` as a default
argument when they are first imported after ``init_process_group``, as building the first
optimizer does), its workers run on into interpreter exit; one that frees a tensor Python
has released, or runs a Python completion callback, then needs the GIL, CPython ends the
thread, and the process aborts: "terminate called without an active exception".

The teardown's rank program (:func:`train`, this module run as ``python -m``) is the recipe
of ``docs/distributed.md``: join with ``init_gloo_rank`` (the pinning modules imported
first), free what holds the group, leave with the checked ``destroy_process_group``. Its
last collective has a Python completion callback that is still running when the rank moves
on, as a DDP Python comm hook's can be: with the old order (``init_process_group`` ...
``destroy_process_group``) most runs abort. By hand::

    PYTHONPATH=src:tests/distributed python -c \
        "import test_distributed_torch as t; print(t.runs('old', 24))"
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import unifiedamp
from unifiedamp.conformance.engines import (
    NO_GRADIENT,
    Outcome,
    Run,
    check,
    launch,
    rank_main,
    step_record,
    verdict,
)
from unifiedamp.conformance.engines import torch as engines
from unifiedamp.spec import ScalerConfig

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed"),
]

#: The engines whose settings share a launch: as many ranks, and the checked teardown
#: (fsdp2's group outlives the destroy, so its launch leaves with the plain one).
LAUNCHES = (
    ("ddp", "ddp-hysteresis", "ddp-fused", "ddp-two-optimizers", "ddp-no-sync", "ddp-unused",
     "ddp-static", "zero", "no-grad"),
    ("fsdp1", "fsdp1-fused", "fsdp1-fp16", "fsdp1-orig", "fsdp1-clip"),
    ("fsdp2",),
    ("hsdp",),
)
#: The settings whose run cannot end: each has a launch of its own, in its test.
OWN_LAUNCH = {("zero", "torch.amp", "gradient"), ("no-grad", "torch.amp", "input"),
              ("no-grad", "torch.amp", "gradient")}
# gloo ends a collective that waited this long: the expected deadlock's end. Its ranks
# reach step 1 in 5 s, 15 s on two busy cores; before that they wait for each other a
# few seconds at most (a peer still importing).
DEADLOCK_COLLECTIVE_TIMEOUT = 15
# Should gloo's timeout not end it (a rank spinning), the launch's does.
DEADLOCK_TIMEOUT = 90


@functools.cache
def _launched(names: tuple[str, ...]) -> dict[tuple[str, str, str], Run]:
    return engines.runs([(engine, scaler, overflow) for engine in names
                         for scaler in engines.scalers_of(engine)
                         for overflow in engines.OVERFLOWS
                         if (engine, scaler, overflow) not in OWN_LAUNCH])


def setting(engine: str, scaler: str, overflow: str) -> Run:
    """The run of ``engine`` with ``scaler`` and ``overflow``, from its shared launch."""
    names = next(names for names in LAUNCHES if engine in names)
    return _launched(names)[(engine, scaler, overflow)]


def _explain(run: Run) -> str:
    logs = "\n".join(f"--- rank {rank}:\n{log[-1500:]}"
                     for rank, log in enumerate(run.outcome.logs))
    return f"{verdict(run.problems())}\n{run.outcome.detail}\n{logs}"


def _scales(run: Run, step: int) -> list[float]:
    return [record["steps"][step]["scale"] for record in run.outcome.records]


def test_every_engine_is_in_one_launch():
    named = [engine for names in LAUNCHES for engine in names]
    assert sorted(named) == sorted(engines.ENGINES)
    for names in LAUNCHES:
        assert len({engines.world_of(engine) for engine in names}) == 1, names


@pytest.mark.parametrize("overflow", list(engines.OVERFLOWS))
@pytest.mark.parametrize("engine", list(engines.ENGINES))
def test_unifiedamp_follows_the_spec_in_the_engine(engine, overflow):
    run = setting(engine, "unifiedamp", overflow)
    assert run.outcome.status == "ok", _explain(run)
    assert run.problems() == [], _explain(run)
    # A run that never stepped or never skipped would check little.
    stepped = [s["stepped"] for record in run.outcome.records for s in record["steps"]]
    assert any(stepped) and not all(stepped)
    assert (run.reference is not None) == (engine != "no-grad")


@pytest.mark.parametrize(("engine", "scaler"), [
    (engine, scaler) for engine in engines.ENGINES if engine != "no-grad"
    for scaler in engines.scalers_of(engine) if scaler != "unifiedamp"])
def test_native_scalers_follow_the_spec_with_an_overflow_in_the_input(engine, scaler):
    """An inf in one rank's target makes its loss, and so every gradient it computes, inf
    or NaN; the engine's reduction (all-reduce, reduce-scatter) carries it into every
    rank's gradients, every shard included, so each rank's own check finds it."""
    run = setting(engine, scaler, "input")
    assert run.problems() == [], _explain(run)


@pytest.mark.parametrize("engine", ["ddp", "ddp-fused", "ddp-no-sync", "ddp-unused",
                                    "ddp-static"])
def test_native_torch_amp_under_ddp_leaves_the_replicas_with_different_weights(engine):
    """torch.amp.GradScaler reads found_inf on its own rank only: with an inf in rank 0's
    gradient after the all-reduce, rank 1 steps and grows its scale while rank 0 skips and
    backs off, so the DDP replicas hold different weights from then on."""
    run = setting(engine, "torch.amp", "gradient")
    assert run.outcome.status == "ok", _explain(run)
    assert "step 1: the ranks' weights differ" in run.problems(), _explain(run)
    assert _scales(run, 1) == [512.0, 2048.0]


def test_native_torch_amp_with_two_optimizers_under_ddp_steps_a_different_one_on_each_rank():
    """One scaler, two optimizers: each one's step() decides on that optimizer's gradients
    on its own rank. Step 1: an inf in B's gradients on rank 0 and in A's on rank 1 after the
    all-reduce: both ranks back off (the scales agree), rank 0 steps A and rank 1 steps B,
    and the weights part. Step 3: an inf in A's on rank 1 only: rank 0 steps both and grows,
    rank 1 backs off. The unifiedamp scaler skips A and B on both ranks at step 1, A at step
    3."""
    run = setting("ddp-two-optimizers", "torch.amp", "gradient")
    assert run.outcome.status == "ok", _explain(run)
    steps = [record["steps"] for record in run.outcome.records]
    assert [s[1]["optimizers_stepped"] for s in steps] == [[True, False], [False, True]]
    assert _scales(run, 1) == [512.0, 512.0]
    assert "step 1: the ranks' weights differ" in run.problems(), _explain(run)
    assert _scales(run, 3) == [1024.0, 256.0]
    ours = [record["steps"] for record in setting("ddp-two-optimizers", "unifiedamp",
                                                  "gradient").outcome.records]
    assert [(s[1]["optimizers_stepped"], s[3]["optimizers_stepped"]) for s in ours] == [
        ([False, False], [False, True])] * 2


@pytest.mark.parametrize("engine", ["fsdp1", "fsdp1-fused", "fsdp1-fp16", "fsdp1-orig",
                                    "fsdp1-clip"])
def test_native_torch_amp_under_fsdp1_leaves_the_shards_apart(engine):
    """torch.amp checks the rank's own shard of the gradient: with an inf in rank 0's shard
    only, rank 0 skips and backs off to 512 while rank 1 grows to 2048 (and, but under
    clip_grad_norm_, whose inf norm zeroes its gradients, steps its shard)."""
    run = setting(engine, "torch.amp", "gradient")
    assert run.outcome.status == "ok", _explain(run)
    assert _scales(run, 1) == [512.0, 2048.0], _explain(run)
    stepped = [record["steps"][1]["stepped"] for record in run.outcome.records]
    assert stepped == [False, engine != "fsdp1-clip"], _explain(run)


@pytest.mark.parametrize(("engine", "scaler"), [
    ("fsdp1", "sharded"), ("fsdp1-fp16", "sharded"), ("fsdp1-orig", "sharded"),
    ("fsdp1-clip", "sharded"), ("fsdp2", "sharded"), ("fsdp2", "torch.amp"),
    ("hsdp", "sharded")])
def test_native_scalers_follow_the_spec_with_an_inf_in_one_ranks_shard(engine, scaler):
    """ShardedGradScaler all-reduces found_inf in unscale_(); under fully_shard the
    gradients are DTensors, and DTensor's handler of the unscale kernel all-reduces
    found_inf over the mesh's sharded dimension, so torch.amp agrees there too."""
    run = setting(engine, scaler, "gradient")
    assert run.problems() == [], _explain(run)


def test_native_sharded_grad_scaler_under_fsdp1_with_a_fused_optimizer_splits_the_scale():
    """ShardedGradScaler all-reduces found_inf in unscale_() only; a fused optimizer's
    step takes torch.amp's path, which checks the rank's own shard: the rank with the
    inf backs off, its peer grows, and the ranks' scales differ."""
    run = setting("fsdp1-fused", "sharded", "gradient")
    assert run.outcome.status == "ok", _explain(run)
    assert _scales(run, 1) == [512.0, 2048.0], _explain(run)
    assert any("stepped (the spec skips" in p for p in run.problems())


def test_native_torch_amp_under_hsdp_splits_the_replicas():
    """DTensor's found_inf handler reduces over sharded mesh dimensions only, not over
    replicated ones: under HSDP (2 x 2 mesh) an inf on rank 0's shard reaches rank 1
    (same replica) but not ranks 2 and 3 (the other replica), which step and grow."""
    run = setting("hsdp", "torch.amp", "gradient")
    assert run.outcome.status == "ok", _explain(run)
    assert _scales(run, 1) == [512.0, 512.0, 2048.0, 2048.0], _explain(run)


def test_native_torch_amp_under_zero_deadlocks_in_zeros_broadcast():
    """ZeroRedundancyOptimizer's step broadcasts each rank's shard: torch.amp skips
    the step on the rank with the inf in its gradient only, which goes on to the next
    backward's all-reduce while its peer waits in ZeRO's broadcast (_sync_params): no
    rank ends."""
    run = engines.run("zero", "torch.amp", timeout=DEADLOCK_TIMEOUT,
                      collective_timeout=DEADLOCK_COLLECTIVE_TIMEOUT)
    assert run.outcome.status == "deadlock", _explain(run)
    # The first rank to give up names gloo's timeout; its peer may record the closed
    # connection first, so the timeout is looked for in the ranks' tracebacks.
    logs = run.outcome.logs
    assert any("Timed out waiting 15000ms" in log for log in logs), _explain(run)
    assert any("in _sync_params" in log for log in logs), _explain(run)
    assert any("in backward" in log for log in logs), _explain(run)


@pytest.mark.parametrize("overflow", list(engines.OVERFLOWS))
def test_native_torch_amp_with_a_rank_without_gradients_raises_no_inf_checks(overflow):
    """A rank whose loss reaches no parameter has no gradient for torch.amp to check:
    its step() raises, where the unifiedamp scaler still joins the ranks' found_inf."""
    run = engines.run("no-grad", "torch.amp", overflow=overflow)
    assert run.kinds[0][1] == NO_GRADIENT
    assert run.outcome.status == "error", _explain(run)
    assert run.outcome.detail == ("AssertionError: No inf checks were recorded for this "
                                  "optimizer."), _explain(run)


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
    with pytest.raises(ValueError, match="overflow='loss': one of input, gradient"):
        engines.run("ddp", "unifiedamp", overflow="loss")
    with pytest.raises(ValueError, match=r"run \[2, 4\] ranks; give engines of one world"):
        engines.runs([("ddp", "unifiedamp", "input"), ("hsdp", "unifiedamp", "input")])
    with pytest.raises(ValueError, match="distinct"):
        engines.runs([("ddp", "unifiedamp", "input")] * 2)


# ------------------------------------------------------------------ teardown

TESTS = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(os.path.abspath(unifiedamp.__file__)))
KINDS = ("FFF", "FIF")  # an inf on rank 1 only, at step 1
CONFIG = ScalerConfig(1024.0, growth_interval=2)
#: Most runs of the old order abort (17 of 24 measured); without the callback about 1
#: run in 17 did (1 in 40 on an idle machine): 16 runs catch the first surely.
RUNS = 16


def train(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One rank: DDP with a Python comm hook and the unifiedamp scaler, then a last
    collective whose completion callback is still running when the rank leaves."""
    import torch
    import torch.distributed as dist

    from unifiedamp.conformance.adapters.torch import destroy_process_group, init_gloo_rank

    if job["teardown"] == "recipe":
        init_gloo_rank(job["rank"], job["world"], job["port"])
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job['port']}",
                                rank=job["rank"], world_size=job["world"])
    steps = _steps(KINDS[job["rank"]])
    flag = torch.zeros(())
    done = dist.all_reduce(flag, async_op=True).get_future()
    done.then(lambda _: time.sleep(0.01))
    done.wait()
    del flag, done
    if job["teardown"] == "recipe":
        destroy_process_group()
    else:
        dist.destroy_process_group()
    return steps


def _steps(kinds: str) -> list[dict[str, Any]]:
    # The model, optimizer and scaler (which hold the group) live in this frame only.
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from unifiedamp.backends.torch import TorchGradScaler

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = TorchGradScaler(**CONFIG.to_dict(), device="cpu")
    records = []
    for kind in kinds:
        optimizer.zero_grad()
        x = torch.full((2, 4), 0.5)
        x[0, 0] = float("inf") if kind == "I" else 0.5
        before = [p.detach().clone() for p in model.parameters()]
        scaler.scale(model(x).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        records.append(step_record(
            kind, scaler.state,
            any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)),
            [p.detach().numpy() for p in model.parameters()]))
    return records


def _launch(teardown: str) -> Outcome:
    # Two ranks running this module's train (python -m test_distributed_torch).
    return launch("test_distributed_torch", {"teardown": teardown}, 2, timeout=120,
                  env=lambda rank: {"PYTHONPATH": os.pathsep.join(
                      [TESTS, SRC, *filter(None, [os.environ.get("PYTHONPATH")])])})


def runs(teardown: str, count: int, parallel: int = 3) -> tuple[collections.Counter, list[str]]:
    """``count`` two-rank runs, ``parallel`` at a time: how many ended how, and what
    departed from the spec or did not end "ok" (one line per run)."""
    with ThreadPoolExecutor(parallel) as pool:
        outcomes = list(pool.map(lambda _: _launch(teardown), range(count)))
    problems = [check(CONFIG, KINDS, outcome) for outcome in outcomes]
    return (collections.Counter(o.status for o in outcomes),
            [f"run {i}: {p[0]}" for i, p in enumerate(problems) if p])


def test_the_recipe_imports_what_would_hold_the_group_before_joining(run_python) -> None:
    # In a fresh interpreter (what is imported is the point) that imported torch only:
    # building the first optimizer after joining imports torch._dynamo, and with it
    # torch.distributed.nn's collectives, which would hold the group (the checked
    # destroy_process_group raises) had the recipe not imported them before
    # init_process_group.
    proc = run_python("""
import sys
import torch
from unifiedamp.conformance.adapters.torch import destroy_process_group, init_gloo_rank
from unifiedamp.conformance.engines import free_port
assert "torch.distributed.nn.functional" not in sys.modules
init_gloo_rank(0, 1, free_port())
torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1).step()
destroy_process_group()
print("left")
""", timeout=120)
    assert proc.returncode == 0 and proc.stdout == "left\n", proc.stderr[-3000:]


@pytest.mark.slow
def test_no_rank_aborts_at_exit_with_the_recipe() -> None:
    start = time.monotonic()
    statuses, problems = runs("recipe", RUNS)
    print(f"{RUNS} two-rank runs in {time.monotonic() - start:.0f} s: {dict(statuses)}")
    assert statuses["ok"] == RUNS and not problems, problems


if __name__ == "__main__":
    rank_main(train)
