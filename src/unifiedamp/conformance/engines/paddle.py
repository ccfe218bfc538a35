"""Paddle data parallelism on CPU (gloo): two rank processes, an inf on one rank only.

Engines (each rank runs ``paddle.nn.Linear(4, 1)`` and SGD in dygraph mode; the ranks are
started as ``paddle.distributed.launch`` starts them, from the environment it sets:
``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``, ``PADDLE_TRAINER_ENDPOINTS``,
``PADDLE_CURRENT_ENDPOINT``, ``PADDLE_MASTER``, ``PADDLE_DISTRI_BACKEND=gloo``...):

- ``fleet``: ``fleet.init(is_collective=True)``, ``fleet.distributed_model`` and
  ``fleet.distributed_optimizer``.
- ``data-parallel``: ``paddle.distributed.init_parallel_env()`` and
  ``paddle.DataParallel``.

Both all-reduce the gradients (their mean) in ``backward``, so an inf on one rank
reaches every rank's gradients; the reference is a single process taking the spec's
steps on the mean gradient.

Scalers:

- ``unifiedamp``: ``PaddleGradScaler(..., device="cpu")``, which all-reduces found_inf
  over the default group before it decides.
- ``paddle``: ``paddle.amp.GradScaler``. On a CPU place Paddle disables it when it is
  made (a warning, "makes no effect"): ``scale`` returns the loss as it is, ``step`` is
  the optimizer's own step, ``update`` does nothing. Recorded as it behaves: scale 1.0
  (the loss's factor), trackers 0, and every step taken, the inf one included (so the
  weights turn inf on every rank).

Records follow :mod:`unifiedamp.conformance.engines`; each rank prints one line per
step, so a run that hangs shows where it got to. Paddle's gloo group on CPU takes no
timeout (``PADDLE_PG_TIMEOUT`` is NCCL's): a rank that hangs is ended by the launch's
timeout, its threads' stacks printed shortly before.

Example:
    >>> sorted(ENGINES), sorted(SCALERS)
    (['data-parallel', 'fleet'], ['paddle', 'unifiedamp'])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from unifiedamp.conformance.engines import (
    DEFAULT_CONFIG,
    Run,
    check_kinds,
    default_kinds,
    free_ports,
    launch,
    rank_main,
    step_record,
)
from unifiedamp.conformance.engines._linear import (
    FEATURES,
    LEARNING_RATE,
    LOSS_FACTOR,
    START,
    example,
    reference,
)
from unifiedamp.spec import ScalerConfig

ENGINES: dict[str, str] = {
    "fleet": "paddle.distributed.fleet (is_collective, distributed_model/optimizer), "
             "2 CPU ranks, gloo",
    "data-parallel": "paddle.distributed.init_parallel_env + paddle.DataParallel, "
                     "2 CPU ranks, gloo",
}
SCALERS: dict[str, str] = {
    "unifiedamp": "unifiedamp.backends.paddle.PaddleGradScaler(..., device='cpu')",
    "paddle": "paddle.amp.GradScaler (on CPU Paddle disables it: no scaling, no skipping)",
}

WORLD = 2

_MODULE = "unifiedamp.conformance.engines.paddle"


def run(engine: str, scaler: str, kinds: Sequence[str] | None = None,
        config: ScalerConfig | None = None, timeout: float = 120.0) -> Run:
    """Runs ``engine`` with ``scaler`` as two rank processes; see the module.

    Args:
        kinds: Per rank, one gradient kind per step (default
            :func:`~unifiedamp.conformance.engines.default_kinds`).
        config: The scaler's config (default
            :data:`~unifiedamp.conformance.engines.DEFAULT_CONFIG`).
        timeout: Seconds before every rank is killed and the run is a deadlock
            (:func:`~unifiedamp.conformance.engines.launch`).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    if scaler not in SCALERS:
        raise ValueError(f"scaler {scaler!r}: one of {', '.join(SCALERS)}")
    kinds = list(default_kinds(WORLD) if kinds is None else kinds)
    config = DEFAULT_CONFIG if config is None else config
    check_kinds(kinds, WORLD)
    # The store's (rank 0 serves it) and each rank's endpoint.
    master, *ports = free_ports(WORLD + 1)
    endpoints = [f"127.0.0.1:{p}" for p in ports]

    def env(rank: int) -> dict[str, str]:
        # What `python -m paddle.distributed.launch --nproc_per_node 2` sets on CPU.
        return {
            "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(WORLD),
            "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
            "PADDLE_CURRENT_ENDPOINT": endpoints[rank], "PADDLE_MASTER": f"127.0.0.1:{master}",
            "PADDLE_DISTRI_BACKEND": "gloo", "PADDLE_GLOBAL_RANK": str(rank),
            "PADDLE_GLOBAL_SIZE": str(WORLD), "PADDLE_LOCAL_RANK": str(rank),
            "PADDLE_LOCAL_SIZE": str(WORLD), "PADDLE_RANK_IN_NODE": str(rank),
            "PADDLE_NNODES": "1", "CUDA_VISIBLE_DEVICES": ""}

    job = {"engine": engine, "scaler": scaler, "kinds": kinds, "config": config.to_dict()}
    outcome = launch(_MODULE, job, WORLD, timeout=timeout, env=env)
    return Run(config, kinds, outcome, replicas=True, reference=reference(kinds))


# ------------------------------------------------------------ the rank program


class _Native:
    """``paddle.amp.GradScaler`` with the spec's config, and its state as recorded."""

    @staticmethod
    def check(config: ScalerConfig) -> None:
        if config != ScalerConfig(config.init_scale, config.growth_factor,
                                  config.backoff_factor, config.growth_interval,
                                  hysteresis=config.hysteresis):
            raise ValueError(f"config {config}: paddle.amp.GradScaler has no min_scale, "
                             "max_scale or static scale; leave them out")

    def __init__(self, config: ScalerConfig):
        import paddle

        self.scaler = paddle.amp.GradScaler(
            init_loss_scaling=config.init_scale, incr_ratio=config.growth_factor,
            decr_ratio=config.backoff_factor, incr_every_n_steps=config.growth_interval,
            decr_every_n_nan_or_inf=config.hysteresis)

    def state(self) -> tuple[float, int, int]:
        s = self.scaler
        if not s.is_enable():
            # Disabled (a CPU place): the loss is multiplied by nothing.
            return 1.0, 0, 0
        scale: Any = s._scale
        return float(scale.numpy().item()), int(s._incr_count), int(s._decr_count)


def train(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One rank: its records, one per step (run by :func:`run` through ``launch``)."""
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet

    from unifiedamp.backends.paddle import PaddleGradScaler

    paddle.set_device("cpu")
    config = ScalerConfig(**job["config"])
    # Checked first: a bad config fails every rank at once, none left waiting for a peer.
    if job["scaler"] == "paddle":
        _Native.check(config)
    else:
        PaddleGradScaler(**job["config"], device="cpu")
    model = paddle.nn.Linear(FEATURES, 1)
    for param in model.parameters():
        param.set_value(paddle.full(param.shape, START, dtype=param.dtype))
    # Any: fleet's distributed_optimizer returns the Fleet, annotated without the optimizer's API
    opt: Any = paddle.optimizer.SGD(learning_rate=LEARNING_RATE, parameters=model.parameters())
    wrapped: Any
    if job["engine"] == "fleet":
        fleet.init(is_collective=True)
        wrapped = fleet.distributed_model(model)
        opt = fleet.distributed_optimizer(opt)
    else:
        dist.init_parallel_env()
        wrapped = paddle.DataParallel(model)
    # Made once the parallel environment is, as a user would.
    native = _Native(config) if job["scaler"] == "paddle" else None
    if native is not None and job["engine"] == "fleet":
        # Fleet's recipe for a native scaler (found_inf over the check group, when enabled).
        native.scaler = fleet.distributed_scaler(native.scaler)
    scaler: Any = native.scaler if native is not None else PaddleGradScaler(
        **job["config"], device="cpu")
    rank = dist.get_rank()
    if rank != job["rank"] or dist.get_world_size() != job["world"]:
        raise RuntimeError(f"paddle sees rank {rank} of {dist.get_world_size()}, launched as "
                           f"rank {job['rank']} of {job['world']}")

    def weights() -> list[np.ndarray]:
        return [p.numpy().copy() for p in model.parameters()]

    records = []
    for kind in job["kinds"][rank]:
        before = weights()
        opt.clear_grad()
        loss = wrapped(paddle.to_tensor(example(kind))).sum() * LOSS_FACTOR
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        after = weights()
        state = native.state() if native is not None else tuple(scaler.state)
        stepped = any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
        records.append(step_record(kind, state, stepped, after))
        print(f"step {len(records) - 1} {kind} done: scale {state[0]!r}", flush=True)
    return records


if __name__ == "__main__":
    rank_main(train)
