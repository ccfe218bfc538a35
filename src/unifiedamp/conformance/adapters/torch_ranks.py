"""Gloo ranks for the torch adapters of the suite: one function run on each of ``world``
processes (plain interpreters).

``python -m unifiedamp.conformance.adapters.torch_ranks JOB`` is one rank
(:func:`spawn_ranks` starts them with :func:`unifiedamp.conformance.engines.launch`).
``JOB`` is a JSON object: ``main`` (``"module:function"``), ``args`` (JSON values),
and what ``launch`` adds (``rank``, ``world``, ``port``, ``out``). The rank calls
``function(rank, world, port, *args)`` and its return value (JSON) is the rank's result.
Importing this module does nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from unifiedamp.conformance.engines import launch, rank_main

#: Modules of torch that copy ``torch.distributed.group.WORLD`` into a default argument
#: when first imported: ``torch.distributed.nn``'s collectives (imported through
#: ``torch._dynamo`` when the first optimizer is built), ``ShardedGradScaler.__init__``
#: and ``ZeroRedundancyOptimizer``'s ``_broadcast_object``. Imported after
#: ``init_process_group``, they hold the group for the life of the process, past
#: ``destroy_process_group()``.
PINNING_MODULES = ("torch.distributed.nn.functional", "torch.distributed.fsdp.sharded_grad_scaler",
                   "torch.distributed.optim.zero_redundancy_optimizer")


def spawn_ranks(main: Callable[..., Any], world: int, *args: Any,
                timeout: float = 300.0) -> list[Any]:
    """Runs ``main(rank, world, port, *args)`` on ``world`` processes, which meet on a
    free local port (``port``); returns what each returned, by rank.

    ``main`` is a module-level function (found by name in each rank), ``args`` and its
    return value are JSON values.

    Raises:
        RuntimeError: A rank raised, died or outlived ``timeout`` seconds (every rank is
            then killed): its error and the tail of each rank's output.

    Example:
        >>> spawn_ranks(min, 2)  # min(rank, world, port) on each rank
        [0, 1]
        >>> spawn_ranks(divmod, 2)  # divmod(rank, world, port): one argument too many
        Traceback (most recent call last):
        ...
        RuntimeError: 2 torch ranks of builtins:divmod: error: TypeError: divmod expected 2...
    """
    job = {"main": f"{main.__module__}:{main.__qualname__}", "args": list(args)}
    outcome = launch(__name__, job, world, timeout=timeout)
    if outcome.status != "ok":
        logs = "".join(f"\n--- rank {rank} ---\n{log[-2000:]}"
                       for rank, log in enumerate(outcome.logs))
        raise RuntimeError(f"{world} torch ranks of {job['main']}: {outcome.status}: "
                           f"{outcome.detail}{logs}")
    steps = []
    for record in outcome.records:
        assert record is not None, "an ok outcome holds every rank's records"
        steps.append(record["steps"])
    return steps


def _call(job: dict[str, Any]) -> Any:
    module, _, name = job["main"].partition(":")
    main = getattr(importlib.import_module(module), name)
    return main(job["rank"], job["world"], job["port"], *job["args"])


if __name__ == "__main__":
    rank_main(_call)
