"""How the conformance suite drives the Paddle backend: real layers, optimizers and autograd."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import paddle

import unifiedamp
from unifiedamp.conformance.interface import STEP_KINDS, ImperativeAdapter, Problem
from unifiedamp.spec import ScalerState

__all__ = ["PaddleAdapter", "make_problem", "run_ranks"]

OPTIMIZERS: dict[str, Callable[[Any], paddle.optimizer.Optimizer]] = {
    "adam": lambda params: paddle.optimizer.Adam(learning_rate=1e-3, parameters=params),
    "adamw": lambda params: paddle.optimizer.AdamW(learning_rate=1e-3, parameters=params),
    "sgd": lambda params: paddle.optimizer.SGD(learning_rate=1e-2, parameters=params),
    "momentum": lambda params: paddle.optimizer.Momentum(learning_rate=1e-2, momentum=0.9,
                                                         parameters=params),
}


def make_problem(optimizer: str = "adam") -> tuple[Problem, paddle.nn.Layer]:
    """A ``paddle.nn.Linear(4, 1)`` and an optimizer; gradients from ``scale(loss).backward()``."""
    model = paddle.nn.Linear(4, 1)
    for param in model.parameters():
        param.set_value(paddle.full(param.shape, 0.1, dtype=param.dtype))
    opt = OPTIMIZERS[optimizer](model.parameters())

    def set_grads(kind: str, scaler: Any) -> None:
        opt.clear_grad(set_to_zero=False)
        x = np.full((2, 4), 0.5, np.float32)
        x[0, 1] = STEP_KINDS[kind]
        # |loss| < 1 and d(loss)/d(weight) = x.sum(0) / 16 do not depend on the
        # parameters, so a finite step stays finite at every float32 scale.
        loss = model(paddle.to_tensor(x)).sum() * 2.0**-4
        scaler.scale(loss).backward()

    def snapshot() -> list[np.ndarray]:
        # Parameters, then every optimizer tensor a step changes (moments, beta powers).
        out = [p.numpy().copy() for p in model.parameters()]
        state = opt.state_dict()
        out += [state[k].numpy().copy() for k in sorted(state)
                if isinstance(state[k], paddle.Tensor)]
        return out

    return Problem(opt, set_grads, snapshot), model


class PaddleAdapter(ImperativeAdapter):
    """Real ``paddle.nn.Linear`` + optimizer per problem; ``scale(loss).backward()`` each step.

    Args:
        scaler_cls: The Paddle backend's scaler class, or a subclass.
        optimizer: ``"adam"`` (default), ``"adamw"``, ``"sgd"`` or ``"momentum"``.
        device: ``"cpu"`` (default) or a GPU such as ``"gpu:0"``.

    Example:
        >>> from unifiedamp.backends.paddle import PaddleGradScaler
        >>> PaddleAdapter(PaddleGradScaler).name
        'paddle[adam,cpu]'
    """

    def __init__(self, scaler_cls: Any, optimizer: str = "adam", device: str = "cpu"):
        self.optimizer, self.device = optimizer, device
        capabilities = {"multi_optimizer", "inplace_unscale", "functional_unscale", "scale_tree",
                        "set_config", "disable", "state_dict", "distributed"}

        def new_scaler(**config: Any) -> Any:
            paddle.set_device(device)
            return scaler_cls(**config, device=device)

        super().__init__(
            new_scaler,
            lambda: make_problem(optimizer)[0],
            name=f"paddle[{optimizer},{device}]",
            to_native=lambda a: paddle.to_tensor(a.copy()),
            to_numpy=lambda t: t.numpy(),
            capabilities=frozenset(capabilities),
            info={"framework": "paddle", "version": paddle.__version__, "device": device},
        )
        self.scaler_type = scaler_cls

    def distributed_iterate(self, handle: Any, kinds_per_rank: list[str]) -> list[ScalerState]:
        """One iteration on len(kinds_per_rank) CPU ranks (``paddle.distributed.launch``,
        gloo), each with its own gradients; the states the ranks end with."""
        results = run_ranks(handle[0].config.to_dict(), kinds_per_rank, self.optimizer)
        return [ScalerState(*r["state"]) for r in results]


def _tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError as exc:
        return f"<unreadable: {exc}>"


def _kill_ranks(out: str) -> None:
    # The launcher starts each rank in a session of its own: killing the launcher
    # leaves a rank stuck in a collective running. Each rank wrote its pid first.
    for path in glob.glob(os.path.join(out, "pid.*")):
        try:
            with open(path) as f:
                os.kill(int(f.read().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def run_ranks(config: dict[str, Any], kinds_per_rank: list[str], optimizer: str = "adam",
              iterations: int = 1, scaler_options: dict[str, Any] | None = None,
              timeout: float = 300) -> list[dict[str, Any]]:
    """Runs ``python -m paddle.distributed.launch --nproc_per_node N`` on CPU (gloo);
    rank r trains on gradients of kind ``kinds_per_rank[r]``.

    ``kinds_per_rank[r]`` is one kind (``"F"``, ``"I"``, ``"N"``, or ``"-"`` for no
    gradient at all) or one per iteration (the last repeated). ``scaler_options`` go
    to ``PaddleGradScaler`` besides the config (e.g. ``{"distributed": False}``).

    Returns per rank: ``state`` (scale, trackers), ``stepped`` (did any parameter
    change), ``skipped`` (skipped steps) and ``iterations`` (the same after each one).

    Raises:
        RuntimeError: The launch failed or outlived ``timeout`` seconds (with the tail
            of each rank's log); every rank is killed first.
    """
    world = len(kinds_per_rank)
    src = os.path.dirname(os.path.dirname(os.path.abspath(unifiedamp.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory(prefix="unifiedamp-paddle-ranks-") as tmp:
        logs = os.path.join(tmp, "log")
        job = {"config": config, "options": scaler_options or {}, "kinds": list(kinds_per_rank),
               "optimizer": optimizer, "iterations": iterations, "out": tmp}
        # The rank program runs with -m and from tmp: run as a file, its own folder
        # (this one, with paddle.py and torch.py in it) would shadow the frameworks.
        command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
                   str(world), "--log_dir", logs, sys.executable, "-m",
                   "unifiedamp.conformance.adapters.paddle_ranks", json.dumps(job)]
        proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
            failure = f"exit code {proc.returncode}" if proc.returncode else None
        except subprocess.TimeoutExpired:
            _kill_ranks(tmp)
            proc.terminate()  # the launcher stops its ranks (also one not yet started)
            try:
                output, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
            failure = f"no result within {timeout} s (a rank hung?); every rank was killed"
        paths = [os.path.join(tmp, f"{rank}.json") for rank in range(world)]
        if failure is None and not all(os.path.exists(p) for p in paths):
            failure = "a rank wrote no result"
        if failure is not None:
            _kill_ranks(tmp)
            logs_tail = "".join(
                f"\n--- {os.path.basename(p)} ---\n{_tail(p)}"
                for p in sorted(glob.glob(os.path.join(logs, "workerlog.*"))))
            raise RuntimeError(
                f"paddle.distributed.launch with {world} ranks ({kinds_per_rank}) failed: "
                f"{failure}\n--- launcher ---\n{(output or '')[-2000:]}{logs_tail}")
        results = []
        for path in paths:
            with open(path) as f:
                results.append(json.load(f))
    return results
