"""torch's distributed engines on the CPU (gloo), with the unifiedamp scaler or torch's own.

Each engine trains the same small model (``Linear(4, 4)``, ``Tanh``, ``Linear(4, 2)``,
a mean squared error) on ``world`` processes, every rank on its own batch. The inf
of a step's ``"I"`` kind is written into that rank's own gradient after
``backward()``, that is after the engine's reduction: into its shard under FSDP, into
its copy of the averaged gradient under DDP (and ZeRO). So only that rank sees it, as
when one rank's shard overflows (FSDP) or a rank-local hook, clip or fault touches its
gradients after the all-reduce (DDP); the ranks must still agree to skip.

A rank records after each step its scaler's scale and trackers, whether its own
parameters (its shard) changed, and the whole model's weights (gathered). Where the
engine averages the ranks' gradients, :func:`reference` gives the weights of a single
process taking the spec's steps on the mean gradient: a gradient left scaled shows.
The gloo group waits at most ``collective_timeout`` seconds in a collective
(``init_process_group(timeout=)``); a rank whose collective times out ends with gloo's
"Timed out waiting" error and its traceback, so a deadlock says which collective each
rank waited in.

Engines (:data:`ENGINES`), each launched as ``world`` processes by
:func:`unifiedamp.conformance.engines.launch`:

- ``ddp``, ``ddp-hysteresis``, ``ddp-fused``: ``DistributedDataParallel`` with SGD,
  with SGD and a config of ``hysteresis=2, min_scale=1`` (the scaler's tensor-op
  rule; torch's scalers have no such config), with ``AdamW(fused=True)``;
- ``fsdp1``, ``fsdp1-fused``, ``fsdp1-fp16``, ``fsdp1-orig``, ``fsdp1-clip``:
  ``FullyShardedDataParallel`` with SGD, with ``Adam(fused=True)``, with
  ``MixedPrecision`` in float16, with ``use_orig_params=True``, and with its
  ``clip_grad_norm_`` after ``unscale_``;
- ``fsdp2``: ``fully_shard`` (DTensor parameters and gradients), SGD;
- ``hsdp``: ``fully_shard`` on a 2 x 2 ``DeviceMesh`` (replicate x shard), 4 ranks;
- ``zero``: ``ZeroRedundancyOptimizer`` (SGD) under DDP;
- ``no-grad``: a model per rank (no wrapper), where a rank's loss reaches no
  parameter at some step (kind ``"-"``): its optimizer has no gradient at all.

Scalers (:data:`SCALERS`): ``"unifiedamp"`` (``TorchGradScaler(device="cpu")``),
``"torch.amp"`` (``torch.amp.GradScaler("cpu")``) and ``"sharded"`` (FSDP's
``ShardedGradScaler``, on the FSDP engines). torch's scalers have no hysteresis:
their tracker is recorded as 0.

From a shell::

    python -m unifiedamp.conformance.engines torch fsdp1-fused sharded

Example:
    >>> from unifiedamp.conformance.engines import torch as engines
    >>> engines.world_of("hsdp"), "sharded" in engines.scalers_of("ddp")
    (4, False)
"""

from __future__ import annotations

import datetime
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from unifiedamp.conformance.adapters.torch_ranks import PINNING_MODULES
from unifiedamp.conformance.engines import (
    COLLECTIVE_TIMEOUT,
    DEFAULT_CONFIG,
    NO_GRADIENT,
    Run,
    check_kinds,
    default_kinds,
    launch,
    rank_main,
    step_record,
)
from unifiedamp.spec import ScalerConfig

__all__ = ["ENGINES", "SCALERS", "collective_timed_out", "config_of", "kinds_of", "reference",
           "run", "scalers_of", "train", "world_of"]

#: The rank program's module, for ``python -m``.
MODULE = "unifiedamp.conformance.engines.torch"

SCALERS = {
    "unifiedamp": "unifiedamp.backends.torch.TorchGradScaler(device='cpu')",
    "torch.amp": "torch.amp.GradScaler('cpu')",
    "sharded": "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler('cpu') "
               "(FSDP engines)",
}

_NATIVES = ("torch.amp",)
_SHARDED = ("torch.amp", "sharded")


@dataclass(frozen=True)
class _Engine:
    text: str
    wrapper: str  # "ddp", "fsdp1", "fsdp2", "zero", "none"
    optimizer: str = "sgd"  # "sgd", "adam-fused", "adamw-fused"
    world: int = 2
    natives: tuple[str, ...] = _NATIVES
    options: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] | None = None
    # Whether a single process on the mean gradient reaches the same weights (the
    # engine averages the ranks' gradients), and how close (rtol, as check takes it).
    reference: bool = True
    rtol: float = 1e-5
    replicas: bool = True
    # fully_shard on a 1-D mesh of the whole world keeps the default group alive past
    # destroy_process_group() (held outside Python: no referrer is found), so the checked
    # destroy would refuse it; those ranks leave with the plain one.
    group_outlives_destroy: bool = False


_ENGINES = {
    "ddp": _Engine("DistributedDataParallel, SGD", "ddp"),
    "ddp-hysteresis": _Engine(
        "DistributedDataParallel, SGD, hysteresis=2 and min_scale=1 (the tensor-op rule; "
        "torch's scalers cannot express it)", "ddp", natives=(),
        config={"hysteresis": 2, "min_scale": 1.0}),
    "ddp-fused": _Engine("DistributedDataParallel, AdamW(fused=True)", "ddp", "adamw-fused"),
    "fsdp1": _Engine("FullyShardedDataParallel, SGD", "fsdp1", natives=_SHARDED),
    "fsdp1-fused": _Engine("FullyShardedDataParallel, Adam(fused=True)", "fsdp1",
                           "adam-fused", natives=_SHARDED),
    "fsdp1-fp16": _Engine(
        "FullyShardedDataParallel, MixedPrecision(float16 parameters, reduction and "
        "buffers), SGD", "fsdp1", natives=_SHARDED, options={"fp16": True},
        rtol=1e-2),  # the float16 forward: the float32 reference within about 2e-5
    "fsdp1-orig": _Engine("FullyShardedDataParallel(use_orig_params=True), SGD", "fsdp1",
                          natives=_SHARDED, options={"use_orig_params": True}),
    # The mean gradient's norm is 0.5 to 1.4: 0.8 clips some steps, and gradients left
    # scaled (a missing unscale) at every step, so the reference tells them apart.
    "fsdp1-clip": _Engine("FullyShardedDataParallel, SGD, clip_grad_norm_(0.8) after "
                          "unscale_", "fsdp1", natives=_SHARDED, options={"clip": 0.8}),
    "fsdp2": _Engine("fully_shard (FSDP2, DTensor gradients), SGD", "fsdp2",
                     natives=_SHARDED, group_outlives_destroy=True),
    "hsdp": _Engine("fully_shard on a 2 x 2 DeviceMesh (replicate x shard, HSDP), SGD, "
                    "4 ranks", "fsdp2", world=4, natives=_SHARDED, options={"mesh": (2, 2)}),
    "zero": _Engine("ZeroRedundancyOptimizer(SGD) under DistributedDataParallel", "zero"),
    "no-grad": _Engine(
        "a model per rank, SGD; at steps 1 and 5 a rank's loss reaches no parameter "
        "(no gradient at all)", "none", kinds=("F-FIFF", "FIFFF-"), reference=False,
        replicas=False),
}

#: Engine name -> what it runs.
ENGINES = {name: engine.text for name, engine in _ENGINES.items()}

_IN, _HIDDEN, _OUT, _BATCH, _LR = 4, 4, 2, 4, 0.05


def _engine(name: str) -> _Engine:
    if name not in _ENGINES:
        raise ValueError(f"unknown torch engine {name!r}: one of {', '.join(_ENGINES)}")
    return _ENGINES[name]


def world_of(engine: str) -> int:
    """How many ranks ``engine`` runs."""
    return _engine(engine).world


def scalers_of(engine: str) -> tuple[str, ...]:
    """The scalers ``engine`` runs with: ``"unifiedamp"`` and the native ones that can."""
    return ("unifiedamp", *_engine(engine).natives)


def kinds_of(engine: str) -> list[str]:
    """The engine's default gradient kinds per rank."""
    spec = _engine(engine)
    return list(spec.kinds) if spec.kinds else default_kinds(spec.world)


def config_of(engine: str) -> ScalerConfig:
    """The engine's default config: :data:`DEFAULT_CONFIG` with its changes."""
    return DEFAULT_CONFIG.replace(**_engine(engine).config)


def run(engine: str, scaler: str, kinds: Sequence[str] | None = None,
        config: ScalerConfig | None = None, timeout: float = 120.0,
        collective_timeout: float = COLLECTIVE_TIMEOUT) -> Run:
    """Runs ``engine`` with ``scaler`` as its ranks and returns the :class:`Run` to check.

    Args:
        kinds: Per rank, a string of gradient kinds, one per step (default: the
            engine's, :func:`kinds_of`).
        config: The scaler's config (default: :func:`config_of`); a native scaler
            takes its init_scale, factors and interval.
        timeout: Seconds before every rank is killed and the run is a deadlock
            (:func:`~unifiedamp.conformance.engines.launch`).
        collective_timeout: Seconds a rank waits in one collective before gloo ends it
            with an error: the run is then a deadlock, found before ``timeout``.
    """
    spec = _engine(engine)
    if scaler not in SCALERS:
        raise ValueError(f"unknown torch scaler {scaler!r}: one of {', '.join(SCALERS)}")
    if scaler not in scalers_of(engine):
        raise ValueError(f"engine {engine!r} does not run with scaler {scaler!r}: it runs "
                         f"with {', '.join(scalers_of(engine))}")
    kinds = list(kinds) if kinds is not None else kinds_of(engine)
    config = config if config is not None else config_of(engine)
    # A wrapped engine's reduction waits for every rank's backward: no "-" there.
    check_kinds(kinds, spec.world, "FIN-" if spec.wrapper == "none" else "FIN")
    if scaler != "unifiedamp" and (config.hysteresis != 1 or not config.dynamic
                                   or config.min_scale is not None
                                   or config.max_scale is not None):
        raise ValueError(f"{scaler} has no hysteresis, min/max scale or static mode: "
                         f"{config} is for the unifiedamp scaler only")
    job = {"engine": engine, "scaler": scaler, "kinds": kinds, "config": config.to_dict(),
           "collective_timeout": collective_timeout}
    outcome = launch(MODULE, job, spec.world, timeout=timeout)
    ref = reference(engine, kinds) if spec.reference and outcome.status == "ok" else None
    return Run(config, kinds, outcome, spec.replicas, ref, spec.rtol)


# ------------------------------------------------------------------ the model and data


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(_IN, _HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(_HIDDEN, _OUT))


def _batch(step: int, rank: int) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(_BATCH, _IN, generator=gen), torch.randn(_BATCH, _OUT, generator=gen)


def _optimizer(kind: str, params: Any, fused: bool = True) -> Any:
    import torch

    if kind == "sgd":
        return torch.optim.SGD(params, lr=_LR)
    cls = torch.optim.Adam if kind == "adam-fused" else torch.optim.AdamW
    return cls(params, lr=_LR, fused=True) if fused else cls(params, lr=_LR, foreach=False)


def reference(engine: str, kinds: Sequence[str]) -> list[list[float]]:
    """The weights after each step of a single process that takes the spec's steps on
    the ranks' mean gradient (skipping when any rank's kind is inf or NaN)."""
    import torch

    spec = _engine(engine)
    model = _model()
    optimizer = _optimizer(spec.optimizer, model.parameters(), fused=False)
    out = []
    for step in range(len(kinds[0])):
        grads = None
        for rank in range(len(kinds)):
            model.zero_grad(set_to_none=True)
            x, y = _batch(step, rank)
            torch.nn.functional.mse_loss(model(x), y).backward()
            local = [p.grad.clone() for p in model.parameters()]
            grads = local if grads is None else [g + h for g, h in zip(grads, local,
                                                                         strict=True)]
        assert grads is not None
        if not any(k[step] in "IN" for k in kinds):
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g / len(kinds)
            if "clip" in spec.options:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.options["clip"])
            optimizer.step()
        out.append([float(v) for p in model.parameters() for v in p.detach().reshape(-1)])
    return out


# ------------------------------------------------------------------ the rank program


def _scaler(name: str, config: ScalerConfig) -> Any:
    import torch

    if name == "unifiedamp":
        from unifiedamp.backends.torch import TorchGradScaler

        return TorchGradScaler(**config.to_dict(), device="cpu")
    args: dict[str, Any] = {"init_scale": config.init_scale, "growth_factor": config.growth_factor,
            "backoff_factor": config.backoff_factor, "growth_interval": config.growth_interval}
    if name == "torch.amp":
        return torch.amp.GradScaler("cpu", **args)
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler("cpu", **args)


def _state(name: str, scaler: Any) -> tuple[float, int, int]:
    if name == "unifiedamp":
        return tuple(scaler.state)
    # torch's scalers have no hysteresis.
    tracker = scaler._growth_tracker
    return scaler.get_scale(), int(tracker.item()) if tracker is not None else 0, 0


def _local(tensor: Any) -> Any:
    """A rank's own part of a parameter or gradient (a DTensor's local shard)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def _wrap(spec: _Engine, model: Any, world: int) -> tuple[Any, Any]:
    """The engine's module, and a function returning the whole model's weights."""
    import torch

    named = [(module, name) for module in model.modules()
             for name, _ in module.named_parameters(recurse=False)]

    def plain() -> list[Any]:
        return [getattr(module, name).detach().clone() for module, name in named]

    if spec.wrapper == "none":
        return model, plain
    if spec.wrapper in ("ddp", "zero"):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model), plain
    if spec.wrapper == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

        precision = (MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16,
                                    buffer_dtype=torch.float16)
                     if spec.options.get("fp16") else None)
        wrapped = FullyShardedDataParallel(
            model, device_id=torch.device("cpu"), mixed_precision=precision,
            use_orig_params=spec.options.get("use_orig_params", False))

        def gathered() -> list[Any]:
            with FullyShardedDataParallel.summon_full_params(wrapped):
                return plain()

        return wrapped, gathered
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    shape = spec.options.get("mesh", (world,))
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    fully_shard(model, mesh=init_device_mesh("cpu", shape, mesh_dim_names=names))

    def full() -> list[Any]:
        return [p.full_tensor().detach().clone() for p in model.parameters()]

    return model, full


def _poison(params: Any, kind: str) -> None:
    """Writes an inf (or a NaN) into this rank's first gradient element it holds."""
    for p in params:
        grad = None if p.grad is None else _local(p.grad)
        if grad is not None and grad.numel():
            grad.view(-1)[0] = float("inf") if kind == "I" else float("nan")
            return
    raise AssertionError("no gradient on this rank to write an inf into")


def train(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One rank's steps (run by :func:`launch`); returns its step records."""
    import torch
    import torch.distributed as dist

    from unifiedamp.conformance.adapters.torch import run_then_leave

    torch.set_num_threads(1)  # the ranks share the machine's cores
    rank, world = job["rank"], job["world"]
    # The teardown recipe of docs/distributed.md: the model, optimizer and scaler live in
    # _steps' frame only, so nothing holds the group when it is destroyed, and the
    # checked destroy raises if something still does (its threads could abort the exit).
    # It joins as init_gloo_rank does (the pinning modules first), with the timeout.
    for module in PINNING_MODULES:
        importlib.import_module(module)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=job["collective_timeout"]))
    return run_then_leave(lambda: _steps(job, rank, world),
                          check=not _engine(job["engine"]).group_outlives_destroy)


def collective_timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is gloo's error for a collective that waited past the group's
    timeout (``[...gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for
    recv operation to complete``).

    Example:
        >>> collective_timed_out(RuntimeError("[unbound_buffer.cc:78] Timed out waiting "
        ...                                   "15000ms for recv operation to complete"))
        True
        >>> collective_timed_out(RuntimeError("Connection closed by peer [127.0.0.1]:4242"))
        False
    """
    return isinstance(exc, RuntimeError) and "Timed out waiting" in str(exc)


def _steps(job: dict[str, Any], rank: int, world: int) -> list[dict[str, Any]]:
    import torch

    spec = _engine(job["engine"])
    config = ScalerConfig(**job["config"])
    kinds = job["kinds"][rank]
    model = _model()
    wrapped, weights = _wrap(spec, model, world)
    if spec.wrapper == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(wrapped.parameters(),
                                            optimizer_class=torch.optim.SGD, lr=_LR)
    else:
        optimizer = _optimizer(spec.optimizer, wrapped.parameters())
    scaler = _scaler(job["scaler"], config)
    clip = spec.options.get("clip")
    records = []
    for step, kind in enumerate(kinds):
        optimizer.zero_grad(set_to_none=True)
        before = [_local(p).detach().clone() for p in wrapped.parameters()]
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(wrapped(x).float(), y)
        if kind == NO_GRADIENT:
            loss = loss.detach().requires_grad_()  # reaches no parameter
        scaler.scale(loss).backward()
        if kind in "IN":
            _poison(wrapped.parameters(), kind)
        if clip is not None:
            scaler.unscale_(optimizer)
            wrapped.clip_grad_norm_(clip)
        scaler.step(optimizer)
        scaler.update()
        stepped = any(not torch.equal(a, _local(b)) for a, b in
                      zip(before, wrapped.parameters(), strict=True))
        records.append(step_record(kind, _state(job["scaler"], scaler), stepped,
                                   [w.float().numpy() for w in weights()]))
    return records


if __name__ == "__main__":
    rank_main(train, timed_out=collective_timed_out)
