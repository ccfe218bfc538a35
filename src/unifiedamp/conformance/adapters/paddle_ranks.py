"""One rank of a Paddle data-parallel run; run as a program of its own, one per rank.

``python -m paddle.distributed.launch --nproc_per_node N --log_dir LOGS PYTHON -m
unifiedamp.conformance.adapters.paddle_ranks JOB`` (:func:`run_ranks` in
:mod:`unifiedamp.conformance.adapters.paddle` builds that command). ``JOB`` is a
JSON object: ``config`` (the scaler's canonical config), ``options`` (more keyword
arguments for ``PaddleGradScaler``, e.g. ``{"distributed": false}``), ``kinds`` (per
rank, a string of gradient kinds: iteration ``i`` uses ``kinds[rank][i]``, the last
one repeated; ``"F"``, ``"I"``, ``"N"`` as in the suite, or ``"-"`` for no gradient at
all), ``optimizer``, ``iterations`` and ``out`` (a folder). Each rank writes
``OUT/RANK.json``: the state after the run, whether any parameter changed, the
skipped-step count, and the same per iteration. Importing this module does nothing.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: The gradient kind of a rank whose optimizer gets no gradient at all.
NO_GRADIENT = "-"


def _kind(kinds: str, iteration: int) -> str:
    return kinds[min(iteration, len(kinds) - 1)]


def main(argv: list[str]) -> None:
    """Trains this rank (``PADDLE_TRAINER_ID``) as ``argv[0]`` (the JSON job) says."""
    job = json.loads(argv[0])
    out = job["out"]
    # The launching process kills the ranks by these ids if the run outlives its timeout.
    with open(os.path.join(out, f"pid.{os.environ.get('PADDLE_TRAINER_ID', 'x')}"), "w") as f:
        f.write(str(os.getpid()))

    import numpy as np
    import paddle
    import paddle.distributed as dist

    from unifiedamp.backends.paddle import PaddleGradScaler
    from unifiedamp.conformance.adapters.paddle import make_problem

    paddle.set_device("cpu")
    # Built first: a bad config fails every rank at once, none left waiting for a peer.
    scaler = PaddleGradScaler(**job["config"], **job.get("options", {}), device="cpu")
    problem, model = make_problem(job["optimizer"])
    dist.init_parallel_env()
    rank = dist.get_rank()
    start = [p.numpy().copy() for p in model.parameters()]
    iterations = []
    for i in range(job["iterations"]):
        kind = _kind(job["kinds"][rank], i)
        before = [p.numpy().copy() for p in model.parameters()]
        if kind == NO_GRADIENT:
            # A loss that reaches no parameter: every grad stays None, and the rank
            # still has to join found_inf's all-reduce in step().
            problem.optimizer.clear_grad(set_to_zero=False)
            scaler.scale(paddle.zeros([1]))
        else:
            problem.set_grads(kind, scaler)
        scaler.step(problem.optimizer)
        scaler.update()
        after = [p.numpy() for p in model.parameters()]
        iterations.append({
            "kind": kind,
            "state": list(scaler.state),
            "stepped": any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True)),
            "skipped": scaler.num_skipped_steps,
        })
    end = [p.numpy() for p in model.parameters()]
    result: dict[str, Any] = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "state": list(scaler.state),
        "stepped": any(not np.array_equal(a, b) for a, b in zip(start, end, strict=True)),
        "skipped": scaler.num_skipped_steps,
        "iterations": iterations,
    }
    path = os.path.join(out, f"{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)  # a partly written file is never read as a result


if __name__ == "__main__":
    main(sys.argv[1:])
