"""JAX engines: two processes under ``jax.distributed``, one CPU device each.

Every engine starts its ranks with ``jax.distributed.initialize(coordinator_address=
"127.0.0.1:PORT", num_processes=2, process_id=rank)`` and builds one mesh (axis ``"d"``)
over both processes' devices; each rank holds its own batch shard, whose gradient is
inf or NaN at the steps its kinds say. The model, ``loss = sum(x @ w + b) / 16`` on
``w`` (4 weights) and ``b``, is linear: its gradient does not depend on the weights, so
plain SGD on the mean gradient (the :func:`reference`) shows a skipped step, an unscale
left out or an inf written into a weight.

Engines (:data:`ENGINES`) differ in where the ranks' gradients meet the finite check:

- ``processes``: a default ``jax.shard_map`` over the global mesh; each device checks
  the gradient of its own batch shard (the parameters cast to varying over ``"d"``, as
  for sharded parameters), then ``lax.pmean`` averages the unscaled gradients. The flag
  must be agreed: ``unscale(grads, axis_name="d")``.
- ``processes-unchecked``: the same in ``shard_map(check_vma=False)``, which is what
  ``pmap`` runs as: JAX does not track which values differ across devices.
- ``processes-pmean``: a default ``shard_map`` that averages the gradients first and
  checks the average (jmp's recipe): the flag agrees with no axis.
- ``processes-jit``: ``jax.jit`` on global arrays (the batch on a ``NamedSharding`` over
  the mesh, ``jax.make_array_from_process_local_data``): XLA reduces the gradient, one
  global array; no axis.
- ``processes-no-axis`` and ``processes-unchecked-no-axis``: ``processes`` and
  ``processes-unchecked`` with ``axis_name`` left out (what the library catches: a
  ``ValueError`` and a warning that name ``axis_name``).
- ``processes-local``: each process steps outside ``jit`` on arrays of its own device and
  averages the unscaled gradients with ``multihost_utils.process_allgather``; the check
  before the average has no mapped axis to agree over (the library warns).

Where a step's inf or NaN arises is the run's ``overflow`` (:data:`OVERFLOWS`): in one
rank's batch shard (``"input"``, every engine), or, under ``processes-pmean`` only, added to
one rank's averaged gradient after ``lax.pmean`` (``"gradient"``: the batch is finite). A
default ``shard_map`` types the average as equal on every device, so the second placement
runs with ``check_vma=False`` (as ``pmap``), and the library's scaler agrees with
``axis_name="d"``. Every other engine checks before it reduces (the input's inf is already
one rank's own at the check) or holds one global gradient: there the placement means
nothing and is refused.

Scalers (:data:`SCALERS`): ``"unifiedamp"`` and ``"jmp"`` (``jmp.DynamicLossScale``, whose
``all_finite`` takes no axis). Each step record also lists the warnings the step raised
(``"warnings"``). ``python -m unifiedamp.conformance.engines jax processes unifiedamp``
runs one setting from a shell.

JAX's CPU collectives take no timeout: ``collective_timeout`` bounds what
``jax.distributed`` does take, the wait for every process at ``initialize``
(``initialization_timeout``) and at ``shutdown`` (``shutdown_timeout_seconds``); a rank
that hangs in a step is ended by the launch's timeout, its stacks printed shortly before.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

from unifiedamp.conformance.engines import (
    COLLECTIVE_TIMEOUT,
    DEFAULT_CONFIG,
    Run,
    default_kinds,
    launch,
    rank_main,
    step_record,
)
from unifiedamp.conformance.interface import STEP_KINDS
from unifiedamp.spec import ScalerConfig

#: Engine name -> what it runs (every one: 2 processes, one CPU device each).
ENGINES: dict[str, str] = {
    "processes": "shard_map over one global mesh; each device's gradient checked before "
                 "lax.pmean, unscale(grads, axis_name='d')",
    "processes-unchecked": "the same in shard_map(check_vma=False), as pmap runs",
    "processes-pmean": "shard_map; gradients averaged (lax.pmean) first, then checked: no "
                       "axis",
    "processes-jit": "jax.jit on global arrays (NamedSharding over the mesh): no axis",
    "processes-no-axis": "processes with axis_name left out",
    "processes-unchecked-no-axis": "processes-unchecked with axis_name left out",
    "processes-local": "outside jit on each process's own arrays, gradients averaged with "
                       "multihost_utils.process_allgather after the check",
}

#: Where a step's inf or NaN arises (see the module).
OVERFLOWS: dict[str, str] = {
    "input": "in one rank's batch shard",
    "gradient": "added to one rank's averaged gradient after lax.pmean (processes-pmean)",
}

#: Scaler name -> what it is.
SCALERS: dict[str, str] = {
    "unifiedamp": "unifiedamp.backends.jax.JaxGradScaler",
    "jmp": "jmp.DynamicLossScale (all_finite takes no axis)",
}

WORLD = 2
LEARNING_RATE = 0.5
_INITIAL = {"w": np.full(4, 0.1), "b": np.array(0.1)}
_AXIS = "d"


def batch(kind: str) -> np.ndarray:
    """A rank's batch shard (2 rows) whose gradient is of ``kind`` (``"F"``, ``"I"``, ``"N"``)."""
    x = np.full((2, 4), 0.5, np.float32)
    x[0, 1] = STEP_KINDS[kind]
    return x


def reference(kinds_per_rank: list[str]) -> list[list[float]]:
    """The weights after each step of one process taking SGD on the ranks' mean gradient
    wherever every rank's is finite (and keeping them where one is not)."""
    w, b, out = _INITIAL["w"].copy(), float(_INITIAL["b"]), []
    for step in range(len(kinds_per_rank[0])):
        kinds = [k[step] for k in kinds_per_rank]
        if not any(k in "IN" for k in kinds):
            w = w - LEARNING_RATE * np.mean([batch(k).sum(0) for k in kinds], 0) / 16
            b = b - LEARNING_RATE * 2 / 16
        out.append([*w.tolist(), b])
    return out


def run(engine: str, scaler: str, kinds: list[str] | None = None,
        config: ScalerConfig | None = None, timeout: float = 120.0,
        collective_timeout: float = COLLECTIVE_TIMEOUT, overflow: str = "input") -> Run:
    """Runs ``engine`` with ``scaler`` as two processes; :meth:`Run.problems` checks it.
    ``timeout`` ends the run (every rank killed: a deadlock); ``collective_timeout``
    bounds ``jax.distributed``'s waits for every process (see the module); ``overflow``
    is where a step's inf arises (:data:`OVERFLOWS`).

    Example (two processes: about 10 s):
        >>> run("processes", "unifiedamp").problems()  # doctest: +SKIP
        []
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")
    if scaler not in SCALERS:
        raise ValueError(f"unknown scaler {scaler!r}: one of {', '.join(SCALERS)}")
    if overflow not in OVERFLOWS:
        raise ValueError(f"overflow={overflow!r}: one of {', '.join(OVERFLOWS)}")
    if overflow == "gradient" and engine != "processes-pmean":
        raise ValueError(f"overflow='gradient' needs a reduction before the check: only "
                         f"processes-pmean has one ({engine} checks first or holds one "
                         f"global gradient); use overflow='input'")
    config = config or DEFAULT_CONFIG
    kinds = list(kinds or default_kinds(WORLD))
    if len(kinds) != WORLD or any(set(k) - set(STEP_KINDS) for k in kinds):
        raise ValueError(f"kinds: one string of {''.join(STEP_KINDS)} per rank, {WORLD} ranks; "
                         f"got {kinds!r}")
    job = {"engine": engine, "scaler": scaler, "kinds": kinds, "config": config.to_dict(),
           "collective_timeout": collective_timeout, "overflow": overflow}
    outcome = launch(__name__, job, WORLD, timeout, env=_rank_env)
    return Run(config, kinds, outcome, replicas=True, reference=reference(kinds))


def _rank_env(rank: int) -> dict[str, str]:
    # One CPU device per process: the mesh spans the processes, not forced host devices.
    return {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


# ------------------------------------------------------------ the rank program


def train(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One rank: initializes ``jax.distributed``, runs the job's steps, returns its records."""
    import jax

    wait = max(1, round(job["collective_timeout"]))
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{job['port']}",
                               num_processes=job["world"], process_id=job["rank"],
                               initialization_timeout=wait, shutdown_timeout_seconds=wait)
    try:
        return _Rank(job).train()
    finally:
        jax.distributed.shutdown()


class _Rank:
    """The engine's step for one rank, built once, and the records of its steps."""

    def __init__(self, job: dict[str, Any]):
        import jax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.jax = jax
        self.rank, self.engine, self.kinds = job["rank"], job["engine"], job["kinds"][job["rank"]]
        self.in_gradient = job["overflow"] == "gradient"
        self.mesh = Mesh(np.array(jax.devices()), (_AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        self.sharded = NamedSharding(self.mesh, P(_AXIS))
        self.scaler = _scaler(job["scaler"], ScalerConfig(**job["config"]))
        self.params = {k: np.asarray(v, np.float32) for k, v in _INITIAL.items()}
        self.local = self.engine == "processes-local"
        if not self.local:
            self.scaler = self.jax.tree.map(self._replicate, self.scaler)
            self.params = self.jax.tree.map(self._replicate, self.params)
        self.step = self._local_step if self.local else self._global_step()

    def _replicate(self, value: Any) -> Any:
        return self.jax.make_array_from_process_local_data(self.replicated, np.asarray(value))

    def train(self) -> list[dict[str, Any]]:
        records = []
        for kind in self.kinds:
            x = batch("F" if self.in_gradient else kind)
            # Added to this rank's averaged gradient: its inf, or 0 (overflow="gradient").
            bad = np.array([STEP_KINDS[kind] if kind in "IN" else 0.0], np.float32)
            if not self.local:
                x = self.jax.make_array_from_process_local_data(self.sharded, x)
                bad = self.jax.make_array_from_process_local_data(self.sharded, bad)
            before = _host(self.params)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.params, self.scaler = self.step(self.scaler, self.params, x, bad)
            for w in caught:  # shown in the rank's log too
                print(f"{w.category.__name__}: {w.message}", file=sys.stderr)
            after = _host(self.params)
            record = step_record(kind, _state(self.scaler), _changed(before, after),
                                 [after["w"], after["b"]])
            record["warnings"] = [str(w.message) for w in caught]
            records.append(record)
        return records

    # -------------------------------------------------------- the steps

    def _global_step(self) -> Any:
        jax = self.jax
        from jax.sharding import PartitionSpec as P

        if self.engine == "processes-jit":
            def global_step(scaler: Any, params: Any, x: Any, bad: Any) -> Any:
                # The global batch's mean loss: its gradient is the ranks' mean gradient.
                return _sgd(scaler, params, jax.grad(
                    lambda p: scaler.scale(_loss(p, x) / WORLD))(params), None)

            return jax.jit(global_step)

        unchecked = self.engine.startswith("processes-unchecked") or self.in_gradient
        axis = None if self.engine.endswith("no-axis") else _AXIS
        pmean_first = self.engine == "processes-pmean"
        in_gradient = self.in_gradient

        def step(scaler: Any, params: Any, x: Any, bad: Any) -> Any:
            from jax import lax

            from unifiedamp.backends.jax._compat import cast_varying

            # Without the cast, a default shard_map sums the gradient of replicated
            # parameters over the axis itself (the transpose of their broadcast).
            local = params if unchecked else jax.tree.map(
                lambda a: cast_varying(a, frozenset({_AXIS})), params)
            grads = jax.grad(lambda p: scaler.scale(_loss(p, x)))(local)
            if pmean_first:
                grads = lax.pmean(grads, _AXIS)
                if in_gradient:  # this rank's own: the flags must agree over "d"
                    grads = {**grads, "b": grads["b"] + bad[0]}
                    return _sgd(scaler, params, grads, _AXIS)
                return _sgd(scaler, params, grads, None)
            return _sgd(scaler, params, grads, axis, reduce=lambda g: lax.pmean(g, _AXIS))

        return jax.jit(jax.shard_map(step, mesh=self.mesh,
                                     in_specs=(P(), P(), P(_AXIS), P(_AXIS)),
                                     out_specs=(P(), P()), check_vma=not unchecked))

    def _local_step(self, scaler: Any, params: Any, x: Any, bad: Any) -> Any:
        jax = self.jax
        from jax.experimental import multihost_utils

        grads = jax.grad(lambda p: scaler.scale(_loss(p, x)))(
            jax.tree.map(jax.numpy.asarray, params))

        def across_processes(g: Any) -> Any:
            return jax.tree.map(lambda a: np.mean(multihost_utils.process_allgather(a), 0), g)

        return _sgd(scaler, params, grads, None, reduce=across_processes)


def _scaler(name: str, config: ScalerConfig) -> Any:
    if name == "unifiedamp":
        from unifiedamp.backends.jax import JaxGradScaler

        return JaxGradScaler(**config.to_dict())
    import jax.numpy as jnp
    import jmp

    plain = ScalerConfig(config.init_scale, growth_factor=config.growth_factor,
                         backoff_factor=1 / config.growth_factor,
                         growth_interval=config.growth_interval)
    if config != plain:
        raise ValueError(f"jmp.DynamicLossScale has one factor (backoff = 1 / growth), no "
                         f"hysteresis and no scale bounds but min 1: {config} is not one")
    return jmp.DynamicLossScale(jnp.float32(config.init_scale), period=config.growth_interval,
                                factor=int(config.growth_factor))


def _loss(params: Any, x: Any) -> Any:
    return (x @ params["w"] + params["b"]).sum() / 16


def _sgd(scaler: Any, params: Any, grads: Any, axis_name: Any, reduce: Any = None) -> Any:
    """Unscale, check, average (``reduce``, after the check), SGD where finite, update."""
    import jax

    if hasattr(scaler, "update"):  # unifiedamp
        from unifiedamp.backends.jax import step_if_finite

        grads, finite = scaler.unscale(grads, axis_name=axis_name)
        grads = reduce(grads) if reduce else grads
        new = step_if_finite(finite, lambda p: jax.tree.map(
            lambda w, g: w - LEARNING_RATE * g, p, grads), params)
        return new, scaler.update(finite)
    import jmp

    grads = scaler.unscale(grads)
    finite = jmp.all_finite(grads)
    grads = reduce(grads) if reduce else grads
    stepped = jax.tree.map(lambda w, g: w - LEARNING_RATE * g, params, grads)
    return jmp.select_tree(finite, stepped, params), scaler.adjust(finite)


def _host(tree: Any) -> Any:
    """This process's copy of every leaf, as NumPy."""
    import jax

    return jax.tree.map(lambda a: np.asarray(
        a.addressable_data(0) if isinstance(a, jax.Array) else a, np.float64), tree)


def _changed(before: Any, after: Any) -> bool:
    return any(not np.array_equal(before[k], after[k], equal_nan=True) for k in before)


def _state(scaler: Any) -> tuple[float, int, int]:
    leaves = _host({"scale": scaler.loss_scale, "growth": getattr(
        scaler, "growth_tracker", getattr(scaler, "counter", 0)),
        "hysteresis": getattr(scaler, "hysteresis_tracker", 0)})
    return float(leaves["scale"]), int(leaves["growth"]), int(leaves["hysteresis"])


if __name__ == "__main__":
    rank_main(train)
