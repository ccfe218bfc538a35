"""The ``unifiedamp`` command: ``backends``, ``spec`` and ``conformance``.

Anything that imports a framework runs in a subprocess of its own, one per
backend (``conformance`` runs the shipped pytest suite there), so that
frameworks that cannot share a process (tensorflow then paddle segfaults)
never do, and a crash in one backend is reported, not fatal.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from unifiedamp import __version__, _registry, spec
from unifiedamp.conformance._pytest_process import run_pytest

_WORKER_TIMEOUT_S = 600


# --------------------------------------------------------------------------- workers


def _worker(name: str) -> dict[str, Any]:
    """Runs in the subprocess: imports one backend and reports its devices as JSON."""
    try:
        cls = _registry.load(name)
    except ImportError as exc:
        return {"backend": name, "status": "not installed", "detail": str(exc)}
    return {"backend": name, "status": "ok", "devices": list(cls.devices())}


def _info_in_subprocess(name: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "unifiedamp.cli", "_worker", name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"backend": name, "status": "error",
                "detail": f"timed out after {_WORKER_TIMEOUT_S} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"backend": name, "status": "error",
                "detail": f"worker exited with {proc.returncode}: {_last_line(proc)}"}
    return json.loads(lines[-1])


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    return lines[-1] if lines else "no output"


# --------------------------------------------------------------------------- backends


def _framework_version(row: _registry.BackendInfo) -> str | None:
    try:
        return importlib.metadata.version(row.framework)
    except importlib.metadata.PackageNotFoundError:
        return None


def backends_report() -> list[dict[str, Any]]:
    """One dict per known backend: installed or not, framework version, devices, install hint."""
    report = []
    for name, row in _registry.available().items():
        installed = importlib.util.find_spec(row.modules[0]) is not None
        entry = {"backend": name, "installed": installed, "framework": row.framework,
                 "version": _framework_version(row), "devices": [], "install": row.install}
        if installed:
            info = _info_in_subprocess(name)
            entry["devices"] = info.get("devices", [])
            if info["status"] != "ok":
                entry["installed"] = info["status"] != "not installed"
                entry["error"] = info.get("detail")
        report.append(entry)
    return report


def _cmd_backends(args: argparse.Namespace) -> int:
    report = backends_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    rows = [("backend", "installed", "framework", "devices", "install")]
    for e in report:
        framework = f"{e['framework']} {e['version'] or ''}".strip()
        rows.append((e["backend"], "yes" if e["installed"] else "no", framework,
                     ", ".join(e["devices"]) or "-", e["install"]))
    _print_table(rows)
    return 0


# --------------------------------------------------------------------------- spec


def _cmd_spec(args: argparse.Namespace) -> int:
    doc = spec.spec_document()
    print(json.dumps(doc, indent=2) if args.format == "json" else spec.spec_markdown(doc))
    return 0


# --------------------------------------------------------------------------- conformance


def run_suite(name: str, max_examples: int | None = None) -> dict[str, Any]:
    """Runs the shipped pytest suite on one backend in a subprocess; its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        args = ["--pyargs", "unifiedamp.conformance", "--unifiedamp-backend", name,
                "--unifiedamp-json", out]
        if max_examples is not None:
            args += ["--unifiedamp-max-examples", str(max_examples)]
        try:
            proc = run_pytest(args, timeout=_WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"status": "error", "detail": f"timed out after {_WORKER_TIMEOUT_S} s"}
        if not os.path.exists(out):
            return {"status": "error",
                    "detail": f"pytest exited with {proc.returncode}: {_last_line(proc)}"}
        with open(out) as f:
            report = json.load(f)
    report.setdefault("status", "ok")
    return report


def _failed(result: dict[str, Any]) -> bool:
    return result["status"] == "error" or any(
        t["outcome"] in ("failed", "error", "xpassed") for t in result.get("tests", {}).values())


def conformance_report(names: list[str], max_examples: int | None = None) -> dict[str, Any]:
    """Runs the conformance suite on each backend, each in its own subprocess."""
    results = {}
    for name in names:
        row = _registry.available().get(name)
        if row is not None and importlib.util.find_spec(row.modules[0]) is None:
            results[name] = {"status": "not installed", "detail": row.install}
        else:
            results[name] = run_suite(name, max_examples)
    return {"unifiedamp": __version__, "spec_version": spec.SPEC_VERSION,
            "passed": not any(_failed(r) for r in results.values()), "backends": results}


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
    names = args.backend or list(_registry.available())
    report = conformance_report(names, args.max_examples)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["passed"] else 1
    tests: list[str] = []
    for r in report["backends"].values():
        tests += [t for t in r.get("tests", {}) if t not in tests]
    print(f"unifiedamp {__version__} conformance, spec version {spec.SPEC_VERSION}")
    reasons = {}
    _print_table([("test", *names)]
                 + [(t, *(_cell(report["backends"][n], t) for n in names)) for t in tests])
    for name in names:
        r = report["backends"][name]
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
    print("\nresult:", "PASS" if report["passed"] else "FAIL")
    return 0 if report["passed"] else 1


# --------------------------------------------------------------------------- main


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for j, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unifiedamp", description="One dynamic loss scaler for every framework.")
    parser.add_argument("--version", action="version", version=f"unifiedamp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("backends", help="list backends: installed, version, devices")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_backends)
    p = sub.add_parser("spec", help="print the specification")
    p.add_argument("--format", choices=["json", "markdown"], default="markdown")
    p.set_defaults(func=_cmd_spec)
    p = sub.add_parser("conformance", help="run the conformance suite on every installed backend")
    p.add_argument("--backend", action="append",
                   help="a backend name or module:Class (repeatable; default: all known)")
    p.add_argument("--max-examples", type=int, default=None,
                   help="hypothesis examples per property (default 200)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_conformance)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``unifiedamp`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        print(json.dumps(_worker(argv[1])))
        return 0
    args = _parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
