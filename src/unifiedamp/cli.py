"""The ``unifiedamp`` command: ``backends``, ``spec``, ``conformance``, ``port``,
``port-state``, ``demo`` and ``plot``.

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
from collections.abc import Sequence
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
        # The framework's own error (an OSError from a missing shared library...):
        # the install hint is in the table already.
        cause = exc.__cause__ or exc
        return {"backend": name, "status": "not importable",
                "detail": f"{type(cause).__name__}: {cause}"}
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
    # pytest prefixes an error raised while it configures; the error is what matters.
    return lines[-1].removeprefix("INTERNALERROR> ") if lines else "no output"


# --------------------------------------------------------------------------- backends


def _framework_version(row: _registry.BackendInfo) -> str | None:
    try:
        return importlib.metadata.version(row.framework)
    except importlib.metadata.PackageNotFoundError:
        return None


def _found(module: str) -> bool:
    """Whether a top-level module is installed, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules without a __spec__: it is there
        return True


def backends_report() -> list[dict[str, Any]]:
    """One dict per known backend: installed (found) and importable or not, framework version,
    devices, install hint, and the import's error where there is one."""
    report = []
    for name, row in _registry.available().items():
        installed = _found(row.modules[0])
        entry = {"backend": name, "installed": installed, "importable": False,
                 "framework": row.framework, "version": _framework_version(row), "devices": [],
                 "install": row.install}
        if installed:
            info = _info_in_subprocess(name)
            entry["devices"] = info.get("devices", [])
            entry["importable"] = info["status"] == "ok"
            if info["status"] != "ok":
                entry["status"], entry["error"] = info["status"], info.get("detail")
        report.append(entry)
    return report


def _installed_cell(entry: dict[str, Any]) -> str:
    if not entry["installed"]:
        return "no"
    return entry.get("status", "yes")


def _cmd_backends(args: argparse.Namespace) -> int:
    report = backends_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    rows = [("backend", "installed", "framework", "devices", "install")]
    for e in report:
        framework = f"{e['framework']} {e['version'] or ''}".strip()
        rows.append((e["backend"], _installed_cell(e), framework,
                     ", ".join(e["devices"]) or "-", e["install"]))
    _print_table(rows)
    for e in report:
        if e.get("status") == "not importable":
            print(f"\n{e['backend']}: installed but not importable: {e['error']}")
        elif "error" in e:
            print(f"\n{e['backend']}: {e['status']}: {e['error']}")
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
    if not _found(row.modules[0]):
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
    # Each backend is a subprocess of its own, mostly spent importing and compiling: side
    # by side, one per CPU, the six built-in backends take 83 s on two cores against 125 s
    # one after another. The report keeps the order of ``names``.
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
    _print_table([("test", *names)]
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


# --------------------------------------------------------------------------- main


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for j, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))


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


def _cmd_plot(args: argparse.Namespace) -> int:
    from unifiedamp.diagnostics import ScaleHistory, plot_history

    try:
        history = ScaleHistory.from_json(args.history)
    except OSError as exc:
        print(f"unifiedamp plot: cannot read {args.history!r}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"unifiedamp plot: {args.history!r} is {exc}", file=sys.stderr)
        return 2
    if not len(history):
        print(f"unifiedamp plot: {args.history!r} holds no update", file=sys.stderr)
        return 2
    if importlib.util.find_spec("matplotlib") is None:
        print("unifiedamp plot draws with matplotlib: pip install 'unifiedamp[demo]'",
              file=sys.stderr)
        return 2
    try:
        plot_history(history, args.output, title=args.title)
    except (OSError, ValueError) as exc:  # a missing folder, a format matplotlib lacks
        print(f"unifiedamp plot: cannot write {args.output!r}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {len(history)} updates (from {history.iterations[0]} to "
          f"{history.iterations[-1]}), {sum(history.skipped)} skipped, scale "
          f"{min(history.scales):g} to {max(history.scales):g}")
    return 0


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
    p.add_argument("--backend", action="append", type=_backend_arg,
                   help="a backend name or module:Class (repeatable; default: all known, where "
                        "one that is not installed does not fail the run; a backend named "
                        "here that does not run does)")
    p.add_argument("--max-examples", type=_examples_arg, default=None, metavar="N",
                   help="hypothesis examples per property, at least 1 (default 200)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_conformance)
    p = sub.add_parser("plot", help="draw a scale history (scaler.history().to_json(PATH)) on "
                                    "a log axis with skipped steps marked")
    p.add_argument("history", metavar="HISTORY.json",
                   help="a file written by ScaleHistory.to_json (unifiedamp.diagnostics)")
    p.add_argument("-o", "--output", default="scale.png", metavar="IMAGE",
                   help="where to write the plot (default scale.png; the suffix picks the "
                        "format: .png, .svg, .pdf)")
    p.add_argument("--title", default=None, help="the plot's title")
    p.set_defaults(func=_cmd_plot)
    # Each porting command lives with its code and adds its own subcommand.
    from unifiedamp import demo, port_source, port_state

    port_source.add_parser(sub)
    port_state.add_parser(sub)
    demo.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``unifiedamp`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        print(json.dumps(_worker(argv[1])))
        return 0
    args = _parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe must fail here, not in the interpreter's exit
    except BrokenPipeError:
        # The reader went away (`unifiedamp backends --json | head`): stop quietly,
        # and keep Python from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
