"""``unifiedamp conformance``: the shipped conformance suite on every backend, as a matrix.

The suite runs with pytest in a subprocess per backend (frameworks that cannot share a
process never do, and a crash in one is an ``error`` cell, not the end of the run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from unifiedamp import __version__, _registry, spec
from unifiedamp.cli._shared import WORKER_TIMEOUT_S, is_installed, last_line, print_table
from unifiedamp.conformance._pytest_process import run_pytest


def run_suite(name: str, max_examples: int | None = None) -> dict[str, Any]:
    """Runs the shipped pytest suite on one backend in a subprocess; its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        args = ["--pyargs", "unifiedamp.conformance", "--unifiedamp-backend", name,
                "--unifiedamp-json", out]
        if max_examples is not None:
            args += ["--unifiedamp-max-examples", str(max_examples)]
        try:
            proc = run_pytest(args, timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"status": "error", "detail": f"timed out after {WORKER_TIMEOUT_S} s"}
        if not os.path.exists(out):
            return {"status": "error",
                    "detail": f"pytest exited with {proc.returncode}: {last_line(proc)}"}
        with open(out) as f:
            report = json.load(f)
    report.setdefault("status", "ok")
    return report


def _failed(result: dict[str, Any], requested: bool) -> bool:
    # Only a framework that is not there at all may be passed over, and only
    # when the run was not asked for it by name: a CI job whose framework
    # failed to install must not go green.
    if result["status"] == "not installed":
        return requested
    return result["status"] != "ok" or any(
        t["outcome"] in ("failed", "error", "xpassed") for t in result.get("tests", {}).values())


def _run_backend(name: str, max_examples: int | None) -> dict[str, Any]:
    row = _registry.resolve(name)
    if not is_installed(row.modules[0]):
        return {"status": "not installed", "detail": row.install}
    result = run_suite(name, max_examples)
    if result["status"] == "not installed":
        # Found on disk, yet its import failed (a broken install): not "missing".
        result["status"] = "not importable"
    return result


def conformance_report(names: list[str] | None = None,
                       max_examples: int | None = None) -> dict[str, Any]:
    """Runs the conformance suite on each backend, each in its own subprocess, as many
    at a time as there are CPUs.

    Args:
        names: Backends (names or ``"module:Class"``) requested by name: any
            of them that does not run fails the report. ``None``: every known
            backend, where one whose framework is not installed is listed in
            ``not_run`` without failing the report.
        max_examples: Hypothesis examples per property (default 200).
    """
    from concurrent.futures import ThreadPoolExecutor

    requested = names is not None
    names = list(_registry.available()) if names is None else names
    # Each backend is a subprocess of its own, mostly spent importing and compiling, so
    # they run side by side, one per CPU (docs/conformance.md has the time it saves). The
    # report keeps the order of ``names``.
    with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1))) as pool:
        futures = {name: pool.submit(_run_backend, name, max_examples) for name in names}
        results = {name: future.result() for name, future in futures.items()}
    not_run = {n: r["status"] for n, r in results.items() if r["status"] in _NOT_RUN}
    return {"unifiedamp": __version__, "spec_version": spec.SPEC_VERSION,
            "passed": not any(_failed(r, requested) for r in results.values()),
            "requested": requested, "not_run": not_run, "backends": results}


_NOT_RUN = ("not installed", "not importable")

_CELL = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip",
         "xfailed": "xfail", "xpassed": "XPASS"}


def _cell(result: dict[str, Any], test: str) -> str:
    if result["status"] != "ok":
        return result["status"]
    t = result["tests"].get(test)
    if t is None:
        return "-"
    step = re.search(r"diverged at step (\d+)", t["detail"])
    return f"FAIL at step {step.group(1)}" if t["outcome"] == "failed" and step else _CELL[
        t["outcome"]]


def _cmd_conformance(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pytest") is None or importlib.util.find_spec("hypothesis") is None:
        print("unifiedamp conformance runs a pytest suite: pip install 'unifiedamp[conformance]'",
              file=sys.stderr)
        return 2
    report = conformance_report(args.backend, args.max_examples)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["passed"] else 1
    names = list(report["backends"])
    tests: list[str] = []
    for r in report["backends"].values():
        tests += [t for t in r.get("tests", {}) if t not in tests]
    print(f"unifiedamp {__version__} conformance, spec version {spec.SPEC_VERSION}")
    reasons: dict[str, str] = {}
    print_table([("test", *names)]
                + [(t, *(_cell(report["backends"][n], t) for n in names)) for t in tests])
    for name in names:
        r = report["backends"][name]
        if r["status"] in _NOT_RUN:
            print(f"\n{name}: {r['status']} ({_why_not_run(r, report['requested'])}): "
                  f"{r.get('detail', '')}")
            continue
        if r["status"] != "ok":
            print(f"\n{name}: {r['status']}: {r.get('detail', '')}")
            continue
        for test, t in r["tests"].items():
            first_line = t["detail"].splitlines()[0] if t["detail"] else ""
            if t["outcome"] in ("failed", "error", "xpassed"):
                print(f"\n{name}: {test}: {first_line}")
            elif t["outcome"] in ("skipped", "xfailed"):
                reasons.setdefault(f"{name}: {t['outcome']}: {first_line}", test)
        for e in r.get("unmatched_xfails", []):
            print(f"\n{name}: xfail entry matched no test: {e['where']}: {e['pattern']}")
    for reason in reasons:
        print(f"\n{reason}")
    result = "PASS" if report["passed"] else "FAIL"
    print(f"\nresult: {result}{_not_run_note(report['not_run'])}")
    return 0 if report["passed"] else 1


def _why_not_run(result: dict[str, Any], requested: bool) -> str:
    if requested:
        return "requested with --backend, so the run fails"
    if _failed(result, requested):
        return "found but broken, so the run fails"
    return "not requested with --backend, so the run does not fail"


def _not_run_note(not_run: dict[str, str]) -> str:
    """`` (not run: torch, jax: not installed; mlx: not importable)``, or nothing."""
    groups: dict[str, list[str]] = {}
    for name, status in not_run.items():
        groups.setdefault(status, []).append(name)
    notes = [f"{', '.join(names)}: {status}" for status, names in groups.items()]
    return f" (not run: {'; '.join(notes)})" if notes else ""


def _backend_arg(value: str) -> str:
    """``--backend``: a known name or a well-formed ``module:Class``, checked without importing
    anything (frameworks are only imported in the per-backend subprocesses)."""
    try:
        _registry.resolve(value)
    except _registry.UnknownBackendError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _examples_arg(value: str) -> int:
    """``--max-examples``: hypothesis rejects 0 and below only inside each test, and reads 0
    as "the default", so both are refused here."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= 1 (hypothesis examples per property), got {value!r}")
    return number


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp conformance [--backend NAME ...] [--max-examples N] [--json]``."""
    p = sub.add_parser("conformance", help="run the conformance suite on every installed backend")
    p.add_argument("--backend", action="append", type=_backend_arg,
                   help="a backend name or module:Class (repeatable; default: all known, where "
                        "one that is not installed does not fail the run; a backend named "
                        "here that does not run does)")
    p.add_argument("--max-examples", type=_examples_arg, default=None, metavar="N",
                   help="hypothesis examples per property, at least 1 (default 200)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_conformance)
