"""How the conformance suite drives the torch backend: real models, optimizers and autograd."""

from __future__ import annotations

import gc
import importlib
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from unifiedamp.conformance.adapters.torch_ranks import PINNING_MODULES, spawn_ranks
from unifiedamp.conformance.interface import STEP_KINDS, ImperativeAdapter, Problem
from unifiedamp.spec import ScalerState

OPTIMIZERS = {
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw_fused": lambda params: torch.optim.AdamW(params, lr=1e-3, fused=True),
    "sgd_foreach": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=True),
}


def _loss(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # |loss| < 1 and d(loss)/d(weight) = x.sum(0) / 16 do not depend on the
    # parameters, so a finite step stays finite at every float32 scale.
    return torch.nn.functional.linear(x, weight, bias).sum() * 2.0**-4


_compiled_loss = None


def compiled_loss() -> Any:
    global _compiled_loss
    if _compiled_loss is None:
        _compiled_loss = torch.compile(_loss, fullgraph=True)
    return _compiled_loss


def make_problem(optimizer: str, device: str) -> tuple[Problem, Any]:
    model = torch.nn.Linear(4, 1).to(device)
    with torch.no_grad():
        model.weight.fill_(0.1)
        model.bias.fill_(0.1)
    opt = OPTIMIZERS[optimizer](model.parameters())

    def backward(kind: str, scaler: Any, loss_fn: Any = _loss) -> None:
        opt.zero_grad(set_to_none=True)
        x = torch.full((2, 4), 0.5, device=device)
        x[0, 1] = STEP_KINDS[kind]
        scaler.scale(loss_fn(model.weight, model.bias, x)).backward()

    def snapshot() -> list[np.ndarray]:
        out = [p.detach().cpu().numpy().copy() for p in model.parameters()]
        for state in opt.state.values():
            out += [v.detach().cpu().numpy().copy() for _, v in sorted(state.items())
                    if isinstance(v, torch.Tensor)]
        return out

    return Problem(opt, backward, snapshot), model


class TorchAdapter(ImperativeAdapter):
    """Real ``torch.nn.Linear`` + optimizer per problem; ``scale(loss).backward()`` each step.

    Args:
        scaler_cls: The torch backend's scaler class, or a subclass.
        optimizer: ``"adam"`` (plain), ``"adamw_fused"`` or ``"sgd_foreach"``.
        device: ``"cpu"`` or ``"cuda"``.
    """

    def __init__(self, scaler_cls: Any, optimizer: str = "adam", device: str = "cpu"):
        self.optimizer, self.device = optimizer, device
        capabilities = {"multi_optimizer", "inplace_unscale", "functional_unscale", "scale_tree",
                        "set_config", "disable", "state_dict", "jit", "distributed"}
        super().__init__(
            lambda **config: scaler_cls(**config, device=device),
            lambda: make_problem(optimizer, device)[0],
            name=f"torch[{optimizer},{device}]",
            to_native=lambda a: torch.from_numpy(a.copy()).to(device),
            to_numpy=lambda t: t.detach().cpu().numpy(),
            capabilities=frozenset(capabilities),
            info={"framework": "torch", "version": torch.__version__, "device": device},
        )
        self.scaler_type = scaler_cls

    def compiled_iterate(self, handle: Any, kinds: str) -> Any:
        """One iteration whose loss runs through ``torch.compile(fullgraph=True)``."""
        scaler, problems = handle
        for kind, problem in zip(kinds, problems, strict=True):
            problem.set_grads(kind, scaler, compiled_loss())
            scaler.step(problem.optimizer)
        scaler.update()
        return handle

    def distributed_iterate(self, handle: Any, kinds_per_rank: list[str]) -> list[ScalerState]:
        """One iteration on len(kinds_per_rank) gloo ranks, each with its own gradients."""
        results = run_ranks(handle[0].config.to_dict(), kinds_per_rank, self.optimizer)
        return [ScalerState(*r["state"]) for r in results]


def run_ranks(config: dict[str, Any], kinds_per_rank: list[str], optimizer: str = "adam",
              iterations: int = 1) -> list[dict[str, Any]]:
    """Runs one gloo process per rank; rank r trains on gradients of kind kinds[r].

    Returns per rank: ``state`` (scale, trackers), ``stepped`` (did any parameter
    change) and ``skipped`` (skipped steps).
    """
    return spawn_ranks(_rank_main, len(kinds_per_rank), config, kinds_per_rank, optimizer,
                       iterations)


def _rank_main(rank: int, world: int, port: int, config: dict[str, Any], kinds: list[str],
               optimizer: str, iterations: int) -> dict[str, Any]:
    init_gloo_rank(rank, world, port)
    return run_then_leave(lambda: _train_rank(config, kinds[rank], optimizer, iterations))


def _train_rank(config: dict[str, Any], kind: str, optimizer: str,
                iterations: int) -> dict[str, Any]:
    # The model, optimizer and scaler live in this frame only: they are gone before the
    # group is destroyed.
    from unifiedamp.backends.torch import TorchGradScaler

    scaler = TorchGradScaler(**config, device="cpu")
    problem, model = make_problem(optimizer, "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(iterations):
        problem.set_grads(kind, scaler)
        scaler.step(problem.optimizer)
        scaler.update()
    stepped = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    return {"state": list(scaler.state), "stepped": stepped, "skipped": scaler.num_skipped_steps}



def init_gloo_rank(rank: int, world: int, port: int) -> None:
    """Joins the gloo group of ``world`` ranks that meet on ``127.0.0.1:port``, once
    :data:`PINNING_MODULES` are imported (so that none of them holds the group later,
    and :func:`destroy_process_group` can end it).

    Example:
        >>> import torch.distributed as dist
        >>> from unifiedamp.conformance.engines import free_port
        >>> init_gloo_rank(0, 1, free_port())
        >>> dist.get_world_size()
        1
        >>> destroy_process_group()
        >>> dist.is_initialized()
        False
    """
    import torch.distributed as dist

    for module in PINNING_MODULES:
        importlib.import_module(module)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)


_T = TypeVar("_T")


def run_then_leave(work: Callable[[], _T], check: bool = True) -> _T:
    """``work()`` on a rank that has joined the default group, then leaves the group:
    with :func:`destroy_process_group` (checked: ``work``'s frame, and what in it held the
    group, is gone by then) when it returned and ``check`` is true, else with torch's own
    (an exception's traceback still holds those frames; report the error itself)."""
    import torch.distributed as dist

    try:
        result = work()
    except BaseException:
        dist.destroy_process_group()
        raise
    if check:
        destroy_process_group()
    else:
        dist.destroy_process_group()
    return result


def destroy_process_group() -> None:
    """``torch.distributed.destroy_process_group()``, then a check that the default group
    is gone, its gloo worker threads with it.

    The group's destructor stops and joins those threads while the interpreter still
    runs. A group that outlives this call (something still holds it) keeps them running
    into interpreter exit; a worker that then drops the last reference to a tensor
    Python has already released (a finished collective's, freed after the caller moved
    on) must take the GIL, which CPython refuses during finalization by ending the
    thread, and the unwinding through a C++ destructor aborts the process: "terminate
    called without an active exception" (SIGABRT), after all the work is done.

    Raises:
        RuntimeError: The group outlived ``destroy_process_group()``; the message says
            what can hold it.

    Example:
        >>> import torch.distributed as dist
        >>> from unifiedamp.conformance.engines import free_port
        >>> init_gloo_rank(0, 1, free_port())
        >>> held = dist.group.WORLD
        >>> destroy_process_group()
        Traceback (most recent call last):
        ...
        RuntimeError: the default process group outlived destroy_process_group(): ...
        >>> del held
    """
    import torch.distributed as dist

    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    if group() is not None:
        gc.collect()  # a holder in a reference cycle
    if group() is not None:
        raise RuntimeError(
            "the default process group outlived destroy_process_group(): something still "
            "holds it, and its gloo worker threads would run into interpreter exit, where "
            "one can abort the process ('terminate called without an active exception'). "
            "Free every object that holds the group before destroying it (a DDP or FSDP "
            "model, a ShardedGradScaler, a DeviceMesh, a scaler given process_group=), and "
            f"import {', '.join(PINNING_MODULES)} before init_process_group (imported "
            "after it, they keep it in default arguments)")
