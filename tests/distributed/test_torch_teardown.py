"""Two gloo ranks leave torch.distributed without an abort at exit, run after run.

A gloo worker thread drops its finished work (and the tensors in it) after it has woken
the caller. When the process group outlives ``destroy_process_group()`` (something holds
it: torch.distributed.nn's collectives keep ``group.WORLD`` as a default argument when
they are first imported after ``init_process_group``, as building the first optimizer
does), its workers run on into interpreter exit; one that frees a tensor Python has
released, or runs a Python completion callback, then needs the GIL, CPython ends the
thread, and the process aborts: "terminate called without an active exception".

The rank program below is the recipe of ``docs/distributed.md``: join with
``init_gloo_rank`` (the pinning modules imported first), free what holds the group,
leave with the checked ``destroy_process_group``. Its last collective has a Python
completion callback that is still running when the rank moves on, as a DDP Python comm
hook's can be: with the old order (``init_process_group`` ... ``destroy_process_group``)
most runs abort. By hand::

    PYTHONPATH=src:tests python -c "import test_torch_teardown as t; print(t.runs('old', 24))"
"""

from __future__ import annotations

import collections
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import unifiedamp
from unifiedamp.conformance.adapters.torch_ranks import RANK_PRELOAD
from unifiedamp.conformance.engines import Outcome, check, launch, rank_main, step_record
from unifiedamp.spec import ScalerConfig

pytest.importorskip("torch")

pytestmark = [pytest.mark.distributed, pytest.mark.framework("torch")]

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
    # The recipe's ranks fork from an interpreter that imported what the library's own
    # ranks import before they join (the pinning modules among them, as the recipe orders:
    # test_the_recipe_imports_what_would_hold_the_group_before_joining checks that the
    # recipe itself does); the old order's from one that imported torch only, and nothing
    # of torch.distributed's modules the recipe orders.
    preload = RANK_PRELOAD if teardown == "recipe" else ("torch",)
    return launch("test_torch_teardown", {"teardown": teardown}, 2, timeout=120,
                  preload=preload, env=lambda rank: {"PYTHONPATH": os.pathsep.join(
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
    # From an interpreter that imported torch only: building the first optimizer after
    # joining imports torch._dynamo, and with it torch.distributed.nn's collectives, which
    # would hold the group (the checked destroy_process_group raises) had the recipe not
    # imported them before init_process_group.
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
