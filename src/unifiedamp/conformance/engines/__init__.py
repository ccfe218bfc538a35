"""Scalers under real distributed engines: several processes, an inf on one rank only.

Each framework module (``torch``, ``jax``, ``tensorflow``, ``paddle``) runs one
*engine* (DDP, FSDP, ``jax.distributed``, MultiWorkerMirroredStrategy, fleet ...)
with one *scaler* (``"unifiedamp"`` or the framework's own) as ``world`` processes
on this machine's CPU, and returns an :class:`Outcome`: what every rank recorded
after every step, or how the run ended (an error, a deadlock, an abort). The
records are framework-neutral:

``{"rank": r, "world": n, "steps": [{"kind", "scale", "growth", "hysteresis",
"stepped", "weights"}, ...]}``

where ``kind`` is the step's gradient kind on that rank (``"F"`` finite, ``"I"``
inf, ``"N"`` NaN, ``"-"`` no gradient at all), ``scale`` the float32 scale and
``growth``/``hysteresis`` the trackers after the step's update, ``stepped``
whether the step changed the rank's weights, and ``weights`` the whole model's
weights after the step (gathered, for a sharded engine), flattened.

:func:`check` compares those records with the spec, step by step, and names the
first step and rank that diverged; :func:`verdict` says it in one line.
Every run can be repeated from a shell::

    python -m unifiedamp.conformance.engines torch ddp torch.amp

prints each rank's trajectory and the verdict (exit status 1 when it is not
"follows the spec").

The ranks are plain interpreters (:func:`launch`); a deadlock is found by the framework's
collective timeout (:data:`COLLECTIVE_TIMEOUT`) or the launch's, with each rank's stacks.

Example:
    >>> from unifiedamp.spec import ScalerConfig
    >>> config = ScalerConfig(1024.0, growth_interval=2)
    >>> records = [{"rank": r, "world": 2, "steps": [
    ...     {"kind": k, "scale": 512.0, "growth": 0, "hysteresis": 0, "stepped": False,
    ...      "weights": [0.1]}]} for r, k in enumerate("FI")]
    >>> check(config, ["F", "I"], Outcome("ok", records))
    []
    >>> records[0]["steps"][0]["scale"] = 1024.0
    >>> check(config, ["F", "I"], Outcome("ok", records))[0]
    'step 0, rank 0: scale 1024.0, trackers 0, 0 (the spec: 512.0, 0, 0)'
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import unifiedamp
from unifiedamp import spec
from unifiedamp._atomic_write import write_bytes
from unifiedamp.spec import ScalerConfig, ScalerState

#: The frameworks with a module here, by the name the command line takes.
FRAMEWORKS = ("torch", "jax", "tensorflow", "paddle")

#: A step whose rank gets no gradient at all (its loss reaches no parameter).
NO_GRADIENT = "-"

#: What every engine runs unless told otherwise: backs off at steps 1 and 3 (an inf
#: on one rank only, a different rank each time) and grows at steps 0 -> 2 -> 5.
DEFAULT_CONFIG = ScalerConfig(1024.0, growth_interval=2)
DEFAULT_KINDS = ("FIFFFF", "FFFIFF")

#: Seconds a rank waits in one collective before its framework ends it with an error (the
#: run is then a deadlock), where the framework takes a timeout: torch's
#: ``init_process_group(timeout=)``, TensorFlow's ``CommunicationOptions(timeout_seconds=)``.
#: Well past what a rank waits in a run that works: a peer still importing or compiling
#: at the first collectives, a few seconds on two busy cores.
COLLECTIVE_TIMEOUT = 30.0

#: Seconds before the launch's timeout at which each rank prints its threads' stacks.
STACKS_BEFORE_TIMEOUT = 2.0

#: The exit statuses of ranks that launch() killed (or that ended before it did).
KILLED = frozenset({None, 0, -signal.SIGKILL})


def default_kinds(world: int) -> list[str]:
    """:data:`DEFAULT_KINDS` for ``world`` ranks: ranks past the second stay finite.

    Example:
        >>> default_kinds(4)
        ['FIFFFF', 'FFFIFF', 'FFFFFF', 'FFFFFF']
    """
    steps = len(DEFAULT_KINDS[0])
    return [DEFAULT_KINDS[r] if r < len(DEFAULT_KINDS) else "F" * steps for r in range(world)]


@dataclass
class Outcome:
    """How a run ended.

    Attributes:
        status: ``"ok"`` (every rank wrote its records and exited 0), ``"error"`` (a
            rank raised: ``detail`` has its exception, the first in time), ``"deadlock"``
            (a rank's framework ended a collective that waited past its timeout before
            any rank raised otherwise, or no result within the launch's timeout: every
            rank still running was killed), ``"abort at exit"`` (every rank wrote its
            records, then a rank died, e.g. SIGABRT at teardown). A deadlock's logs say
            where each rank waited: the traceback of its collective's timeout, or its
            threads' stacks printed before the launch's timeout.
        records: Per rank, its records (None for a rank that wrote none).
        detail: The error, or what timed out, in one line.
        returncodes: Per rank, its exit status (negative: killed by that signal).
        logs: Per rank, the tail of its stdout and stderr.
        seconds: Wall time of the run.
    """

    status: str
    records: list[dict[str, Any] | None]
    detail: str = ""
    returncodes: list[int | None] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    seconds: float = 0.0


def free_port() -> int:
    """A free TCP port on the loopback interface, for a rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on the loopback interface.

    Example:
        >>> len(set(free_ports(3)))
        3
    """
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def check_kinds(kinds: Sequence[str], world: int, allowed: str = "FIN") -> None:
    """Raises ``ValueError`` naming the fix unless ``kinds`` is ``world`` strings of one
    length made of ``allowed`` gradient kinds.

    Example:
        >>> check_kinds(["FI", "FF"], 2)
        >>> check_kinds(["FI", "F"], 2)
        Traceback (most recent call last):
        ValueError: kinds=['FI', 'F']: give 2 strings of one length, ...
    """
    if len(kinds) != world or len({len(k) for k in kinds}) != 1:
        raise ValueError(f"kinds={list(kinds)!r}: give {world} strings of one length, one "
                         "per rank (one character per step)")
    unknown = sorted({c for k in kinds for c in k} - set(allowed))
    if unknown:
        raise ValueError(f"kinds {unknown} in {list(kinds)!r}: this engine takes "
                         f"{', '.join(allowed)} (F finite, I inf, N NaN, - no gradient)")


def _pythonpath() -> str:
    # The ranks import this very copy of unifiedamp, also from a source checkout.
    src = os.path.dirname(os.path.dirname(os.path.abspath(unifiedamp.__file__)))
    return os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])


def launch(module: str, job: Mapping[str, Any], world: int, timeout: float = 120.0,
           env: Callable[[int], Mapping[str, str]] | None = None,
           grace: float = 15.0) -> Outcome:
    """Runs ``python -m module JOB`` as ``world`` processes; ``JOB`` is ``job`` as JSON
    with ``rank``, ``world``, ``port`` (one free port for the rendezvous), ``out`` and
    ``deadline`` (the run's end, as :func:`time.time`) added. A rank writes its records
    with :func:`rank_main`.

    Each rank is a fresh interpreter in a process group of its own, run from a temp folder
    (nothing beside it shadows a framework). Every rank's group is killed when the run
    outlives ``timeout`` seconds (the ranks of :func:`rank_main` print their threads'
    stacks to their logs shortly before, which say where each one waited), and ``grace``
    seconds after a rank failed (its peers would wait for it in a collective), and when
    the launching process is interrupted. :class:`Outcome` says how the run is judged: a
    rank whose framework ended a collective at its timeout makes it a deadlock.

    Args:
        env: Per rank, environment variables to add (e.g. ``TF_CONFIG``).

    Example:
        >>> outcome = launch("this", {}, 2, timeout=60)
        >>> outcome.status, outcome.returncodes, outcome.records  # ranks that wrote nothing
        ('error', [0, 0], [None, None])
        >>> outcome.logs[1].splitlines()[0]
        'The Zen of Python, by Tim Peters'
    """
    start = time.monotonic()
    deadline = time.time() + timeout
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="unifiedamp-engine-") as out:
        procs: list[subprocess.Popen[bytes]] = []
        logs = []
        timed_out = False
        try:
            for rank in range(world):
                rank_job = {**job, "rank": rank, "world": world, "port": port, "out": out,
                            "deadline": deadline}
                rank_env = {**os.environ, "PYTHONPATH": _pythonpath(), "PYTHONUNBUFFERED": "1",
                            **(env(rank) if env else {})}
                log = open(os.path.join(out, f"{rank}.log"), "w+b")  # noqa: SIM115
                logs.append(log)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", module, json.dumps(rank_job)], cwd=out,
                    env=rank_env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))
            failed_at = None
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                    failed_at = now
                if now - start > timeout or (failed_at is not None
                                             and now - failed_at > grace):
                    timed_out = True
                    break
                time.sleep(0.05)
        finally:
            # Every rank killed before waiting on any: a rank that outlived a killed peer
            # would see its connection closed and write that as its error.
            for p in procs:
                if p.poll() is None:  # its group: the rank and what it started
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.wait()
        tails = []
        for log in logs:
            log.seek(0)
            tails.append(log.read().decode(errors="replace")[-8000:])
            log.close()
        records: list[dict[str, Any] | None] = []
        for rank in range(world):
            path = os.path.join(out, f"{rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    records.append(json.load(f))
            else:
                records.append(None)
    returncodes = [p.returncode for p in procs]
    status, detail = _judge(records, returncodes, tails, timed_out, timeout)
    return Outcome(status, records, detail, returncodes, tails, time.monotonic() - start)


def _judge(records: list[dict[str, Any] | None], returncodes: list[int | None],
           tails: list[str], timed_out: bool, timeout: float) -> tuple[str, str]:
    """The status and detail of :class:`Outcome`: the first error in time decides (a rank
    that lost its peer fails after it, of a closed connection or its own timeout)."""
    errors = sorted((r for r in records if r is not None and "error" in r),
                    key=lambda r: r.get("at", 0.0))
    complete = all(r is not None and "steps" in r for r in records)
    waiting = [rank for rank, r in enumerate(records) if r is None or "steps" not in r]
    if errors and errors[0].get("timed_out"):
        timed = sorted(r["rank"] for r in errors if r.get("timed_out"))
        return "deadlock", (f"a collective timed out on rank(s) {timed} ({errors[0]['error']}); "
                            f"no result from rank(s) {waiting}")
    if errors:
        return "error", errors[0]["error"]
    if timed_out and all(code in KILLED for code in returncodes):
        return "deadlock", (f"no result within {timeout:g} s from rank(s) {waiting}; every "
                            "rank killed" if not complete else
                            f"a rank did not exit within {timeout:g} s of its results")
    if complete and all(code == 0 for code in returncodes):
        return "ok", ""
    if complete:
        return "abort at exit", "; ".join(f"rank {r}: {_describe_exit(code)}"
                                          for r, code in enumerate(returncodes) if code != 0)
    return "error", "; ".join(f"rank {r}: {_describe_exit(code)}: {_last_line(tails[r])}"
                              for r, code in enumerate(returncodes) if code != 0) or "no records"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def rank_main(train: Callable[[dict[str, Any]], list[dict[str, Any]]],
              argv: Sequence[str] | None = None,
              timed_out: Callable[[BaseException], bool] | None = None) -> None:
    """A rank's program: ``train(job)`` returns its step records, written to
    ``OUT/RANK.json`` for :func:`launch`; an exception is written there as
    ``{"error": "Type: message"}`` (the process then exits 1, its traceback in the log),
    marked as a collective's timeout when ``timed_out(exception)`` says it is the
    framework's error for a collective that waited past its timeout. Shortly before the
    job's ``deadline`` (the launch's timeout) the rank prints its threads' stacks to its
    log (:func:`faulthandler.dump_traceback_later`), in case it is still running then."""
    job = json.loads((sys.argv[1:] if argv is None else argv)[0])
    path = os.path.join(job["out"], f"{job['rank']}.json")
    if "deadline" in job:
        faulthandler.dump_traceback_later(
            max(job["deadline"] - time.time() - STACKS_BEFORE_TIMEOUT, 0.1))
    try:
        steps = train(job)
    except BaseException as exc:
        # The message's first line: frameworks append notes (JAX's traceback note) after it.
        message = str(exc).strip().splitlines()
        line = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
        record = {"rank": job["rank"], "error": line, "at": time.time()}
        if timed_out is not None and timed_out(exc):
            record["timed_out"] = True
        write_bytes(path, json.dumps(record).encode())
        traceback.print_exc()
        sys.stderr.flush()
        raise SystemExit(1) from None
    write_bytes(path, json.dumps(
        {"rank": job["rank"], "world": job["world"], "steps": steps}).encode())


def step_record(kind: str, state: Sequence[Any], stepped: bool,
                weights: Sequence[Any]) -> dict[str, Any]:
    """One step's record from a scaler's ``(scale, growth, hysteresis)`` and the weights.

    Example:
        >>> step_record("F", (1024.0, 1, 0), True, [np.float32(0.25)])["weights"]
        [0.25]
    """
    scale, growth, hysteresis = state
    flat = np.concatenate([np.asarray(w, np.float64).ravel() for w in weights]) \
        if len(weights) else np.zeros(0)
    return {"kind": kind, "scale": float(scale), "growth": int(growth),
            "hysteresis": int(hysteresis), "stepped": bool(stepped),
            "weights": [float(w) for w in flat]}


def expected_states(config: ScalerConfig, kinds_per_rank: Sequence[str]) -> list[ScalerState]:
    """The spec's state after each step: found_inf is any rank's inf or NaN.

    Example:
        >>> [s.scale for s in expected_states(DEFAULT_CONFIG, DEFAULT_KINDS)]
        [1024.0, 512.0, 512.0, 256.0, 256.0, 512.0]
    """
    state, out = ScalerState.initial(config), []
    for step in range(len(kinds_per_rank[0])):
        state = spec.update(config, state, any(k[step] in "IN" for k in kinds_per_rank))
        out.append(state)
    return out


def check(config: ScalerConfig, kinds_per_rank: Sequence[str], outcome: Outcome,
          replicas: bool = True, reference: Sequence[Sequence[float]] | None = None,
          rtol: float = 1e-5) -> list[str]:
    """What in ``outcome`` departs from the spec, first step first; ``[]`` if nothing.

    Checked for every step and rank: the scale (as float32) and both trackers equal
    the spec's after found_inf = "any rank's gradient is inf or NaN"; the rank
    stepped exactly when no rank's gradient was (and it had a gradient); its weights
    are finite; with ``replicas`` every rank holds the same weights; with a
    ``reference`` (the weights a single process reaches taking the spec's steps on
    the mean gradient) each step's weights are within ``rtol`` of it.
    """
    if outcome.status != "ok":
        return [f"{outcome.status}: {outcome.detail}"]
    problems = []
    for step, want in enumerate(expected_states(config, kinds_per_rank)):
        found_inf = any(k[step] in "IN" for k in kinds_per_rank)
        rows = []
        for rank, record in enumerate(outcome.records):
            steps = record["steps"] if record else []
            if step >= len(steps):
                problems.append(f"step {step}, rank {rank}: no record")
                continue
            got = steps[step]
            rows.append(got)
            state = (got["scale"], got["growth"], got["hysteresis"])
            if (spec.f32(got["scale"]) != spec.f32(want.scale)
                    or state[1:] != (want.growth_tracker, want.hysteresis_tracker)):
                problems.append(
                    f"step {step}, rank {rank}: scale {got['scale']!r}, trackers {got['growth']}, "
                    f"{got['hysteresis']} (the spec: {want.scale!r}, {want.growth_tracker}, "
                    f"{want.hysteresis_tracker})")
            should_step = not found_inf and kinds_per_rank[rank][step] != NO_GRADIENT
            if got["stepped"] != should_step:
                problems.append(
                    f"step {step}, rank {rank}: {'stepped' if got['stepped'] else 'skipped'} "
                    f"(the spec {'steps' if should_step else 'skips'}: "
                    f"{'an inf or NaN on a rank' if found_inf else 'every rank finite'})")
            if not all(math.isfinite(w) for w in got["weights"]):
                problems.append(f"step {step}, rank {rank}: non-finite weights")
            if reference is not None and not np.allclose(got["weights"], reference[step],
                                                         rtol=rtol, atol=rtol * 1e-2):
                problems.append(f"step {step}, rank {rank}: weights differ from a single "
                                "process taking the spec's steps")
        if replicas and rows and any(r["weights"] != rows[0]["weights"] for r in rows[1:]):
            problems.append(f"step {step}: the ranks' weights differ")
    return problems


def verdict(problems: Sequence[str]) -> str:
    """One line: ``"follows the spec"`` or the first problem (and how many more).

    Example:
        >>> verdict([])
        'follows the spec'
        >>> verdict(["step 1: the ranks' weights differ", "step 2: ..."])
        "step 1: the ranks' weights differ (and 1 more)"
    """
    if not problems:
        return "follows the spec"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m unifiedamp.conformance.engines FRAMEWORK [ENGINE SCALER]``: runs one
    setting and prints each rank's trajectory and the verdict; without an engine, lists the
    framework's engines and scalers. ``-h`` prints the usage; a wrong call exits 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = (f"usage: python -m {__name__} FRAMEWORK [ENGINE SCALER]  "
             f"(FRAMEWORK: {', '.join(FRAMEWORKS)})")
    if "-h" in args or "--help" in args:
        print(f"{usage}\nRuns ENGINE with SCALER as several processes, an inf on one rank only; "
              "FRAMEWORK alone lists them.\nexit status: 1 when the run departs from the spec, "
              "2 for a usage error.")
        return 0
    error = next((f"unknown option {a!r}" for a in args if a.startswith("-")), "")
    if not error and len(args) not in (1, 3):
        error = f"give FRAMEWORK, or FRAMEWORK ENGINE SCALER; got {len(args)} arguments"
    if not error and args[0] not in FRAMEWORKS:
        error = f"unknown framework {args[0]!r}: one of {', '.join(FRAMEWORKS)}"
    if error:
        print(f"{usage}\nerror: {error}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__name__}.{args[0]}")
    if len(args) == 1:
        print("engines:")
        for name, text in module.ENGINES.items():
            print(f"  {name:<20} {text}")
        print("scalers:")
        for name, text in module.SCALERS.items():
            print(f"  {name:<20} {text}")
        return 0
    engine, scaler = args[1:]
    for name, table in (("engine", module.ENGINES), ("scaler", module.SCALERS)):
        value = engine if name == "engine" else scaler
        if value not in table:
            print(f"unknown {name} {value!r} for {args[0]}: one of {', '.join(table)}",
                  file=sys.stderr)
            return 2
    try:
        run = module.run(engine, scaler)
    except ValueError as exc:  # a pairing the engine cannot run, named with the fix
        print(exc, file=sys.stderr)
        return 2
    for rank, record in enumerate(run.outcome.records):
        print(f"rank {rank}:")
        for step, got in enumerate((record or {}).get("steps", [])):
            print(f"  step {step} {got['kind']}: scale {got['scale']!r} trackers "
                  f"{got['growth']}, {got['hysteresis']} "
                  f"{'stepped' if got['stepped'] else 'skipped'}")
    problems = run.problems()
    print(f"{args[0]} {engine} with {scaler}, {len(run.kinds)} ranks "
          f"{list(run.kinds)}: {verdict(problems)}")
    return 0 if not problems else 1


@dataclass
class Run:
    """One setting's run: what ran, its outcome, and how to check it against the spec."""

    config: ScalerConfig
    kinds: list[str]
    outcome: Outcome
    replicas: bool = True
    reference: list[list[float]] | None = None
    #: How close to the reference (e.g. looser for a float16 forward).
    rtol: float = 1e-5

    def problems(self) -> list[str]:
        """:func:`check` of this run."""
        return check(self.config, self.kinds, self.outcome, self.replicas, self.reference,
                     self.rtol)
