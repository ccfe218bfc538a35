"""torch's distributed engines on the CPU (gloo), with the unifiedamp scaler or torch's own.

Each engine trains the same small model (``Linear(4, 4)``, ``Tanh``, ``Linear(4, 2)``,
a mean squared error) on ``world`` processes, every rank on its own batch. Where a
step's ``"I"`` (or ``"N"``) arises is the run's ``overflow`` (:data:`OVERFLOWS`):

- ``"input"``: an inf (NaN) in that rank's batch, in its target, so its loss is inf
  and every gradient it computes is inf or NaN, as when a float16 forward or loss
  overflows. The engine's reduction carries it to every rank (the ordinary case).
- ``"gradient"``: an inf (NaN) written into that rank's own gradient after
  ``backward()``, that is after the engine's reduction: into its shard under FSDP
  (as when an overflow reaches only parameters of that rank's shard), into its copy
  of the averaged gradient under DDP (and ZeRO), as a rank-local gradient hook or a
  fault would. Only that rank sees it; the ranks must still agree to skip.

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
- ``ddp-two-optimizers``: DDP, one SGD for the first layer (A) and one for the second
  (B), one scaler stepping both (each optimizer skips on its own gradients, as torch
  documents). A ``"gradient"`` inf goes into B's gradients on even ranks and A's on
  odd ones; the rank's step counts as stepped when both optimizers stepped (each
  one's is recorded as ``"optimizers_stepped"``), and the reference skips only the
  optimizer whose gradients held an inf on some rank;
- ``ddp-no-sync``: DDP with gradient accumulation, two micro-batches a step, the first
  under ``no_sync()``; the ``"input"`` overflow is in the first micro-batch, the
  ``"gradient"`` one written after the second (syncing) micro-step;
- ``ddp-unused``: DDP with ``find_unused_parameters=True``; the model has a second head
  that rank 0's loss uses and the other ranks' do not;
- ``ddp-static``: DDP with ``static_graph=True``;
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
their tracker is recorded as 0. :func:`runs` runs several scalers and overflows of one
engine in one launch, one after another (each with a new model, optimizer and scaler).

From a shell::

    python -m unifiedamp.conformance.engines torch fsdp1-fused sharded

Length: one framework's engines are one module: every setting trains the same model with
the same rank loop, overflow placement and reference, and differs only in how it wraps
the model and the optimizer.

Example:
    >>> from unifiedamp.conformance.engines import torch as engines
    >>> engines.world_of("hsdp"), "sharded" in engines.scalers_of("ddp")
    (4, False)
"""

from __future__ import annotations

import contextlib
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
    Outcome,
    Run,
    check_kinds,
    default_kinds,
    launch,
    rank_main,
    step_record,
)
from unifiedamp.spec import ScalerConfig

__all__ = ["ENGINES", "OVERFLOWS", "SCALERS", "collective_timed_out", "config_of", "kinds_of",
           "reference", "run", "runs", "scalers_of", "train", "world_of"]

#: The rank program's module, for ``python -m``.
MODULE = "unifiedamp.conformance.engines.torch"

SCALERS = {
    "unifiedamp": "unifiedamp.backends.torch.TorchGradScaler(device='cpu')",
    "torch.amp": "torch.amp.GradScaler('cpu')",
    "sharded": "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler('cpu') "
               "(FSDP engines)",
}

#: Where a step's inf or NaN arises (the runs' ``overflow``).
OVERFLOWS = {
    "input": "in the rank's batch (its target): its loss and every gradient it computes "
             "are inf or NaN, and the engine's reduction carries them to every rank",
    "gradient": "written into the rank's own gradient after backward(), after the "
                "engine's reduction: only that rank sees it",
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
    # Step 1: an inf in B's gradients on rank 0 and in A's on rank 1 (the "gradient"
    # overflow); step 3: in A's on rank 1 only.
    "ddp-two-optimizers": _Engine(
        "DistributedDataParallel, SGD for the first layer (A) and for the second (B), one "
        "scaler; a gradient inf in B's gradients on even ranks, A's on odd ones", "ddp",
        options={"optimizers": 2}, kinds=("FIFFFF", "FIFIFF")),
    "ddp-no-sync": _Engine(
        "DistributedDataParallel, SGD, two micro-batches a step, the first under no_sync() "
        "(the input inf in it; the gradient inf after the syncing micro-step)", "ddp",
        options={"micro_batches": 2}),
    "ddp-unused": _Engine(
        "DistributedDataParallel(find_unused_parameters=True), SGD; a second head that "
        "rank 0's loss uses and the other ranks' do not", "ddp",
        options={"find_unused_parameters": True, "head": True}),
    "ddp-static": _Engine("DistributedDataParallel(static_graph=True), SGD", "ddp",
                          options={"static_graph": True}),
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
        collective_timeout: float = COLLECTIVE_TIMEOUT, overflow: str = "gradient") -> Run:
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
        overflow: Where a step's inf or NaN arises (:data:`OVERFLOWS`).
    """
    setting = _setting(engine, scaler, overflow, kinds, config)
    return _launch([setting], timeout, collective_timeout)[0]


def runs(settings: Sequence[tuple[str, str, str]], timeout: float = 300.0,
         collective_timeout: float = COLLECTIVE_TIMEOUT) -> dict[tuple[str, str, str], Run]:
    """Runs each ``(engine, scaler, overflow)`` of ``settings`` (with the engine's kinds
    and config), one after another in one launch, each with a new model, optimizer and
    scaler; returns each one's :class:`Run`. The engines must run as many ranks. A launch
    costs seconds of imports and joining, a setting about one; a launch that does not end
    ``"ok"`` (a setting raised or deadlocked) is every setting's outcome. ``timeout`` and
    ``collective_timeout`` are :func:`run`'s.

    Example (one launch of two ranks: about 10 s):
        >>> settings = [("ddp", "unifiedamp", "gradient"), ("zero", "torch.amp", "input")]
        >>> [r.problems() for r in runs(settings).values()]  # doctest: +SKIP
        [[], []]
    """
    if not settings or len(set(settings)) != len(settings):
        raise ValueError(f"settings={list(settings)!r}: give one or more distinct "
                         "(engine, scaler, overflow) triples")
    checked = [_setting(engine, scaler, overflow) for engine, scaler, overflow in settings]
    worlds = sorted({world_of(s["engine"]) for s in checked})
    if len(worlds) > 1:
        raise ValueError(f"settings={list(settings)!r}: their engines run {worlds} ranks; "
                         "give engines of one world to a launch")
    return dict(zip(settings, _launch(checked, timeout, collective_timeout), strict=True))


def _setting(engine: str, scaler: str, overflow: str, kinds: Sequence[str] | None = None,
             config: ScalerConfig | None = None) -> dict[str, Any]:
    """One run of a launch's job, checked: raises ``ValueError`` naming the fix."""
    spec = _engine(engine)
    if scaler not in SCALERS:
        raise ValueError(f"unknown torch scaler {scaler!r}: one of {', '.join(SCALERS)}")
    if scaler not in scalers_of(engine):
        raise ValueError(f"engine {engine!r} does not run with scaler {scaler!r}: it runs "
                         f"with {', '.join(scalers_of(engine))}")
    if overflow not in OVERFLOWS:
        raise ValueError(f"overflow={overflow!r}: one of {', '.join(OVERFLOWS)}")
    kinds = list(kinds) if kinds is not None else kinds_of(engine)
    config = config if config is not None else config_of(engine)
    # A wrapped engine's reduction waits for every rank's backward: no "-" there.
    check_kinds(kinds, spec.world, "FIN-" if spec.wrapper == "none" else "FIN")
    if scaler != "unifiedamp" and (config.hysteresis != 1 or not config.dynamic
                                   or config.min_scale is not None
                                   or config.max_scale is not None):
        raise ValueError(f"{scaler} has no hysteresis, min/max scale or static mode: "
                         f"{config} is for the unifiedamp scaler only")
    return {"engine": engine, "scaler": scaler, "overflow": overflow, "kinds": kinds,
            "config": config.to_dict()}


def _launch(settings: list[dict[str, Any]], timeout: float,
            collective_timeout: float) -> list[Run]:
    """One launch running ``settings`` one after another; each one's :class:`Run`."""
    engines = [_engine(s["engine"]) for s in settings]
    job = {"settings": settings, "collective_timeout": collective_timeout,
           # fully_shard on the whole world's mesh keeps the group past the destroy.
           "check_destroy": not any(e.group_outlives_destroy for e in engines)}
    outcome = launch(MODULE, job, engines[0].world, timeout=timeout)
    out, start = [], 0
    for spec, setting in zip(engines, settings, strict=True):
        kinds, end = setting["kinds"], start + len(setting["kinds"][0])
        # This setting's records of every rank.
        records = [record if record is None or "steps" not in record
                   else {**record, "steps": record["steps"][start:end]}
                   for record in outcome.records]
        part = Outcome(outcome.status, records, outcome.detail, outcome.returncodes,
                       outcome.logs, outcome.seconds)
        ref = (reference(setting["engine"], kinds, setting["overflow"])
               if spec.reference and part.status == "ok" else None)
        out.append(Run(ScalerConfig(**setting["config"]), kinds, part, spec.replicas, ref,
                       spec.rtol))
        start = end
    return out


# ------------------------------------------------------------------ the model and data


def _model(spec: _Engine) -> Any:
    import torch

    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(_IN, _HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(_HIDDEN, _OUT))
    if not spec.options.get("head"):
        return body

    class TwoHeads(torch.nn.Module):
        # The second head is used by the ranks the forward's argument says.
        def __init__(self) -> None:
            super().__init__()
            self.body = body
            self.head = torch.nn.Linear(_IN, _OUT)

        def forward(self, x: Any, use_head: bool) -> Any:
            return self.body(x) + self.head(x) if use_head else self.body(x)

    return TwoHeads()


def _forward(spec: _Engine, model: Any, x: Any, rank: int) -> Any:
    return model(x, rank == 0) if spec.options.get("head") else model(x)


def _groups(spec: _Engine, model: Any) -> list[list[Any]]:
    """The parameters of each optimizer: A (the first layer) and B (the rest), or one."""
    params = list(model.parameters())
    return [params[:2], params[2:]] if spec.options.get("optimizers") == 2 else [params]


def _planted_group(spec: _Engine, rank: int) -> int:
    """Which optimizer's gradients hold a rank's "gradient" inf: B on even ranks, A on odd."""
    return (rank + 1) % 2 if spec.options.get("optimizers") == 2 else 0


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


def reference(engine: str, kinds: Sequence[str], overflow: str = "gradient") -> list[list[float]]:
    """The weights after each step of a single process that takes the spec's steps on
    the ranks' mean gradient: an optimizer skips where any rank's kind is inf or NaN in
    its gradients (with one optimizer, or an ``"input"`` overflow: every optimizer)."""
    import torch

    spec = _engine(engine)
    model = _model(spec)
    groups = _groups(spec, model)
    optimizers = [_optimizer(spec.optimizer, group, fused=False) for group in groups]
    out = []
    for step in range(len(kinds[0])):
        grads = None
        for rank in range(len(kinds)):
            model.zero_grad(set_to_none=True)
            x, y = _batch(step, rank)
            torch.nn.functional.mse_loss(_forward(spec, model, x, rank), y).backward()
            local = [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                     for p in model.parameters()]
            grads = local if grads is None else [g + h for g, h in zip(grads, local,
                                                                         strict=True)]
        assert grads is not None
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g / len(kinds)
        bad = [rank for rank, k in enumerate(kinds) if k[step] in "IN"]
        skipped = ({_planted_group(spec, rank) for rank in bad} if overflow == "gradient"
                   else set(range(len(groups))) if bad else set())
        if "clip" in spec.options and not skipped:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.options["clip"])
        for index, optimizer in enumerate(optimizers):
            if index not in skipped:
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

        return DistributedDataParallel(
            model, find_unused_parameters=spec.options.get("find_unused_parameters", False),
            static_graph=spec.options.get("static_graph", False)), plain
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
    """One rank's steps (run by :func:`launch`): each setting's records, one setting
    after another."""
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

    def every_setting() -> list[dict[str, Any]]:
        records = []
        for setting in job["settings"]:
            # In the rank's log: where a run that failed was.
            print("{engine} with {scaler}, the overflow in the {overflow}".format(**setting),
                  flush=True)
            records += _steps(setting, rank, world)
        return records

    return run_then_leave(every_setting, check=job["check_destroy"])


def collective_timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is gloo's error for a collective that waited past the group's
    timeout (``[...gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for
    recv operation to complete``), or the peer's side of it: gloo closes the pair of a
    timed-out collective, and a rank waiting on that pair may see the closure first
    (``Application timeout caused pair closure``).

    Example:
        >>> collective_timed_out(RuntimeError("[unbound_buffer.cc:78] Timed out waiting "
        ...                                   "15000ms for recv operation to complete"))
        True
        >>> collective_timed_out(RuntimeError("Application timeout caused pair closure"))
        True
        >>> collective_timed_out(RuntimeError("Connection closed by peer [127.0.0.1]:4242"))
        False
    """
    return isinstance(exc, RuntimeError) and any(
        text in str(exc) for text in ("Timed out waiting", "Application timeout caused pair"))


def _steps(setting: dict[str, Any], rank: int, world: int) -> list[dict[str, Any]]:
    import torch

    spec = _engine(setting["engine"])
    scaler_name, overflow = setting["scaler"], setting["overflow"]
    kinds = setting["kinds"][rank]
    model = _model(spec)
    wrapped, weights = _wrap(spec, model, world)
    groups = _groups(spec, model)
    if spec.wrapper == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizers = [ZeroRedundancyOptimizer(wrapped.parameters(),
                                              optimizer_class=torch.optim.SGD, lr=_LR)]
        groups = [list(wrapped.parameters())]
    elif len(groups) == 1:
        optimizers = [_optimizer(spec.optimizer, wrapped.parameters())]
        groups = [list(wrapped.parameters())]  # FSDP1's flat parameter
    else:
        optimizers = [_optimizer(spec.optimizer, group) for group in groups]
    scaler = _scaler(scaler_name, ScalerConfig(**setting["config"]))
    clip = spec.options.get("clip")
    micro_batches = spec.options.get("micro_batches", 1)
    records = []
    for step, kind in enumerate(kinds):
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        before = [[_local(p).detach().clone() for p in group] for group in groups]
        x, y = _batch(step, rank)
        if overflow == "input" and kind in "IN":
            y[0, 0] = float("inf") if kind == "I" else float("nan")  # in the first micro-batch
        for micro, (xs, ys) in enumerate(zip(x.chunk(micro_batches), y.chunk(micro_batches),
                                             strict=True)):
            last = micro == micro_batches - 1
            with contextlib.nullcontext() if last else wrapped.no_sync():
                loss = torch.nn.functional.mse_loss(
                    _forward(spec, wrapped, xs, rank).float(), ys) / micro_batches
                if kind == NO_GRADIENT:
                    loss = loss.detach().requires_grad_()  # reaches no parameter
                scaler.scale(loss).backward()
        if overflow == "gradient" and kind in "IN":
            _poison(groups[_planted_group(spec, rank)], kind)
        if clip is not None:
            scaler.unscale_(optimizers[0])
            wrapped.clip_grad_norm_(clip)
        for optimizer in optimizers:
            scaler.step(optimizer)
        scaler.update()
        each = [any(not torch.equal(a, _local(b)) for a, b in zip(old, group, strict=True))
                for old, group in zip(before, groups, strict=True)]
        record = step_record(kind, _state(scaler_name, scaler), all(each),
                             [w.float().numpy() for w in weights()])
        if len(optimizers) > 1:
            record["optimizers_stepped"] = each
        records.append(record)
    return records


if __name__ == "__main__":
    rank_main(train, timed_out=collective_timed_out)
