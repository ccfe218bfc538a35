"""``unifiedamp conformance``: the shipped conformance suite on every backend, as a matrix.

The suite runs with pytest in a subprocess per backend (frameworks that cannot share a
process never do, and a crash in one is an ``error`` cell, not the end of the run).
``--zoo`` runs it on the loss scalers of other projects instead
(:mod:`unifiedamp.conformance.zoo`) and can write or check ``docs/scalers.md``.

Length: one subcommand, one module (as every subcommand of :mod:`unifiedamp.cli`): what it
refuses before a run, what it runs and what it prints read the same options and report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
from typing import Any, NamedTuple

from unifiedamp import __version__, _atomic_write, _registry, errors, spec
from unifiedamp.cli._shared import (
    WORKER_TIMEOUT_S,
    Progress,
    add_progress_option,
    is_installed,
    last_line,
    print_table,
    progress_wanted,
)
from unifiedamp.conformance._pytest_process import run_pytest
from unifiedamp.conformance._report import cell, compact, tests_of


class Job(NamedTuple):
    """One column: what to run the suite on, and what it needs."""

    name: str
    target: str
    requires: tuple[str, ...]
    install: str
    env: dict[str, str] = {}


def run_suite(target: str, max_examples: int | None = None, env: dict[str, str] | None = None,
              progress: str | None = None, keyword: str | None = None,
              timeout: float = WORKER_TIMEOUT_S) -> dict[str, Any]:
    """Runs the shipped pytest suite on one backend or adapter in a subprocess (only the
    tests ``keyword`` selects, as pytest's ``-k``, if given); its JSON report (``status``,
    ``header``, ``tests``).

    A run that outlives ``timeout`` seconds is stopped: its status is ``error``, and its
    detail names the test it was in and the command, with ``env``, that runs that test alone.
    A run that pytest ended early (a usage error, an error while collecting) is an ``error``.

    Example:
        >>> report = run_suite("numpy", keyword="test_vector[interval_one]")
        >>> report["status"], report["tests"]["test_vector[interval_one]"]["outcome"]
        ('ok', 'passed')
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        progress = progress if progress is not None else os.path.join(tmp, "progress")
        args = ["--pyargs", "unifiedamp.conformance", "--unifiedamp-backend", target,
                "--unifiedamp-json", out, "--unifiedamp-progress", progress]
        if max_examples is not None:
            args += ["--unifiedamp-max-examples", str(max_examples)]
        if keyword is not None:
            args += ["-k", keyword]
        try:
            proc = run_pytest(args, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"status": "error",
                    "detail": _timed_out(progress, timeout, target, max_examples, env, keyword)}
        report = None
        if os.path.exists(out):
            with open(out) as f:
                report = json.load(f)
    # Exit statuses 0: all passed, 1: some failed, 5: none selected; any other (pytest's usage
    # error, a test module that failed to import) ended the run before its tests.
    if report is None or ("status" not in report and proc.returncode not in (0, 1, 5)):
        # The whole output of a column that did not finish: the suite run directly.
        return {"status": "error",
                "detail": f"pytest exited with {proc.returncode}: {last_line(proc)} (the whole "
                          f"output: `{_rerun(target, max_examples, env, keyword=keyword)}`)"}
    report.setdefault("status", "ok")
    return report


def _rerun(target: str, max_examples: int | None, env: dict[str, str] | None, *,
           keyword: str | None = None, test: str | None = None) -> str:
    """The shell command that runs what a column ran, with its environment
    (``KERAS_BACKEND=jax python -m pytest ...``); with ``test``, only that test."""
    where = f"unifiedamp.conformance.test_conformance::{test}" if test else \
        "unifiedamp.conformance"
    words = ["python", "-m", "pytest", "--pyargs", where, "--unifiedamp-backend", target]
    if max_examples is not None:
        words += ["--unifiedamp-max-examples", str(max_examples)]
    if keyword is not None and test is None:
        words += ["-k", keyword]
    variables = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
    return " ".join([*variables, shlex.join([*words, "-v"])])


def _timed_out(progress: str, timeout: float, target: str, max_examples: int | None,
               env: dict[str, str] | None, keyword: str | None) -> str:
    """A column's detail when it ran past ``--timeout``: where it was, from its progress
    file, and how to rerun that alone."""
    try:
        with open(progress) as f:
            fields = f.read().strip().split(maxsplit=2)
    except OSError:
        fields = []
    if len(fields) == 3:
        done, total, test = fields
        return (f"timed out after {timeout:g} s in {test.rpartition('::')[2]} (test "
                f"{int(done) + 1} of {total}); a busy machine may need a longer --timeout; "
                f"that test alone: `{_rerun(target, max_examples, env, test=test)}`")
    where = "between two tests" if fields and fields[0] != "0" else \
        "before its first test (importing the framework, collecting the suite)"
    return (f"timed out after {timeout:g} s {where}; a busy machine may need a longer "
            f"--timeout; the run: `{_rerun(target, max_examples, env, keyword=keyword)}`")


def _failed(result: dict[str, Any], requested: bool) -> bool:
    # Only a framework that is not there at all may be passed over, and only
    # when the run was not asked for it by name: a CI job whose framework
    # failed to install must not go green.
    if result["status"] == "not installed":
        return requested
    return result["status"] != "ok" or any(
        t["outcome"] in ("failed", "error", "xpassed") for t in result.get("tests", {}).values())


def _tests_run(result: dict[str, Any]) -> int:
    """How many of a column's tests ran (a skipped test checked nothing)."""
    return sum(t["outcome"] != "skipped" for t in result.get("tests", {}).values())


def _run_job(job: Job, max_examples: int | None, progress: str | None,
             keyword: str | None, timeout: float) -> dict[str, Any]:
    missing = [m for m in job.requires if not is_installed(m)]
    if missing:
        return {"status": "not installed", "detail": job.install}
    result = run_suite(job.target, max_examples, job.env, progress, keyword, timeout)
    if result["status"] == "not installed":
        # Found on disk, yet its import failed (a broken install): not "missing".
        result["status"] = "not importable"
    return result


def backend_jobs(names: list[str] | None) -> list[Job]:
    """The columns of a run on this project's backends (all known ones by default)."""
    jobs = []
    for name in list(_registry.available()) if names is None else dict.fromkeys(names):
        row = _registry.resolve(name)
        jobs.append(Job(name, name, (row.modules[0],), row.install))
    return jobs


def zoo_jobs(names: list[str] | None = None) -> list[Job]:
    """The columns of ``--zoo``: the zoo's scalers (all by default)."""
    from unifiedamp.conformance.zoo import ZOO

    entries = list(ZOO.values()) if not names else [ZOO[n] for n in dict.fromkeys(names)]
    return [Job(e.name, e.target, e.requires, f"{e.install} (for {', '.join(e.requires)})",
                e.env) for e in entries]


def conformance_report(names: list[str] | None = None, max_examples: int | None = None, *,
                       jobs: list[Job] | None = None, show_progress: bool = False,
                       keyword: str | None = None,
                       timeout: float = WORKER_TIMEOUT_S) -> dict[str, Any]:
    """Runs the conformance suite on each backend, each in its own subprocess, as many
    at a time as there are CPUs.

    Args:
        names: Backends (names or ``"module:Class"``) requested by name: any
            of them that does not run fails the report. ``None``: every known
            backend, where one whose framework is not installed is listed in
            ``not_run`` without failing the report.
        max_examples: Hypothesis examples per property (default 200).
        jobs: The columns to run instead of ``names`` (``--zoo``); one that is
            not installed does not fail the report.
        show_progress: Say on stderr what runs (each column's tests done, its time)
            and how each column ended (:class:`~unifiedamp.cli._shared.Progress`).
        keyword: Only the tests this pytest ``-k`` expression selects (default: all).
        timeout: Seconds each column may run (:func:`run_suite`).

    The report's ``tests_run`` counts the tests that ran, skipped ones aside, over all
    columns: with none, the report fails (it checked nothing).
    """
    from concurrent.futures import ThreadPoolExecutor

    requested, zoo = names is not None and jobs is None, jobs is not None
    jobs = jobs if jobs is not None else backend_jobs(names)
    # Each backend is a subprocess of its own, mostly spent importing and compiling, so
    # they run side by side, one per CPU (docs/conformance.md has the time it saves). The
    # report keeps the order of the columns.
    with tempfile.TemporaryDirectory() as tmp:
        files = {job.name: os.path.join(tmp, f"{i}.progress") for i, job in enumerate(jobs)}
        seen: dict[str, str] = {}

        def note(name: str) -> str:
            # A read while pytest rewrites the file finds it empty: keep the last count.
            seen[name] = _tests_done(files[name]) or seen.get(name, "starting")
            return seen[name]

        progress = Progress("conformance", [job.name for job in jobs], enabled=show_progress,
                            note=note)

        def run(job: Job) -> dict[str, Any]:
            progress.start(job.name)
            result = _run_job(job, max_examples, files[job.name], keyword, timeout)
            progress.finish(job.name, _outcome(result, zoo))
            return result

        with progress, ThreadPoolExecutor(
                max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            futures = {job.name: pool.submit(run, job) for job in jobs}
            results = {name: future.result() for name, future in futures.items()}
    not_run = {n: r["status"] for n, r in results.items() if r["status"] in _NOT_RUN}
    tests_run = sum(_tests_run(r) for r in results.values())
    return {"unifiedamp": __version__, "spec_version": spec.SPEC_VERSION,
            "passed": tests_run > 0 and not any(_failed(r, requested) for r in results.values()),
            "keyword": keyword, "requested": requested, "not_run": not_run,
            "tests_run": tests_run, "backends": results}


def _tests_done(path: str) -> str:
    """``12/71 tests`` from a column's progress file; empty before pytest has collected
    (the framework's import, mostly), or while it rewrites the file."""
    try:
        with open(path) as f:
            done, total = f.read().split(maxsplit=2)[:2]
    except (OSError, ValueError):
        return ""
    return f"{done}/{total} tests"


def _outcome(result: dict[str, Any], zoo: bool) -> str:
    """How a column ended, for its progress line: ``PASS, 71 tests``, ``FAIL: 3 of 71
    tests differ``, ``not installed``..."""
    if result["status"] != "ok":
        return result["status"]
    tests = result.get("tests", {}).values()
    if not _tests_run(result):
        return f"no test ran ({len(tests)} skipped)" if tests else "no test ran"
    differ = sum(t["outcome"] in ("failed", "error", "xpassed") for t in tests)
    if zoo:
        return f"ran {len(tests)} tests, {differ} differ from the spec"
    return f"FAIL: {differ} of {len(tests)} tests differ" if differ else \
        f"PASS, {len(tests)} tests"


_NOT_RUN = ("not installed", "not importable")

def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _cmd_conformance(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pytest") is None or importlib.util.find_spec("hypothesis") is None:
        print("unifiedamp conformance runs a pytest suite: pip install 'unifiedamp[conformance]'",
              file=sys.stderr)
        return 2
    # Everything the run would refuse or drop is refused before it starts.
    refused = _refused(args)
    if refused:
        print(f"unifiedamp conformance: error: {refused}", file=sys.stderr)
        return 2
    jobs = zoo_jobs(args.zoo) if args.zoo is not None else None
    report = conformance_report(None if jobs else args.backend, args.max_examples, jobs=jobs,
                                show_progress=progress_wanted(args), keyword=args.keyword,
                                timeout=args.timeout)
    if args.zoo is not None:
        report["passed"] = report["tests_run"] > 0 and not any(
            r["status"] == "error" for r in report["backends"].values())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report, zoo=jobs is not None)
    if jobs is not None and (args.markdown or args.check):
        from unifiedamp.conformance.zoo._doc import zoo_markdown

        text = zoo_markdown(report)
        if args.markdown:
            _atomic_write.write_bytes(args.markdown, text.encode("utf-8"))
        if args.check:
            with open(args.check) as f:
                checked = f.read()
            if checked != text:
                import difflib

                diff = difflib.unified_diff(checked.splitlines(), text.splitlines(),
                                            args.check, "a fresh run", lineterm="")
                print(f"\n{args.check} does not match a fresh run (regenerate it with "
                      f"unifiedamp conformance --zoo --markdown {args.check}):\n"
                      + "\n".join(diff), file=sys.stderr)
                return 1
    return 0 if report["passed"] else 1


def _refused(args: argparse.Namespace) -> str:
    """Why the options cannot run as given (one that the run would drop, a path it could not
    write or read, a ``-k`` that pytest would refuse), or ``""``."""
    if args.zoo is not None and args.backend:
        return (f"--zoo and --backend {' --backend '.join(args.backend)} both choose the "
                "columns: --zoo runs other projects' scalers, --backend this project's (or "
                "yours); give one of them")
    if args.zoo is None and (args.markdown or args.check):
        return "--markdown and --check describe the zoo: add --zoo"
    if args.keyword and (args.markdown or args.check):
        return (f"-k {args.keyword!r} runs part of the suite; --markdown and --check describe "
                "all of it: drop -k")
    for option, path in (("--markdown", args.markdown), ("--check", args.check)):
        problem = _path_problem(path, write=option == "--markdown") if path is not None else ""
        if problem:
            return f"argument {option}: {path!r} {problem}"
    return _keyword_problem(args.keyword) if args.keyword else ""


def _path_problem(path: str, *, write: bool) -> str:
    """Why ``path`` cannot be written (``write``) or read, or ``""``."""
    if os.path.isdir(path):
        return "is a folder: give a file"
    if not write:
        if not os.path.isfile(path):
            return "does not exist: write it first with --zoo --markdown FILE"
        return "" if os.access(path, os.R_OK) else "cannot be read: check its permissions"
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        return f"is in no folder: {folder!r} does not exist; create it first"
    return "" if os.access(folder, os.W_OK) else f"cannot be written: {folder!r} is read-only"


def _keyword_problem(keyword: str) -> str:
    """What pytest says of a ``-k`` expression it cannot parse, or ``""``: asked of pytest
    itself, in a run that collects nothing (the grammar has changed between versions)."""
    proc = run_pytest(["--collect-only", "-k", keyword], env={"UNIFIEDAMP_BACKEND": ""})
    message = last_line(proc)
    if proc.returncode != 4 or "-k" not in message:
        return ""  # a valid expression (pytest: "no tests collected"), or pytest's own trouble
    why = message.partition(f"{keyword}: ")[2] or message
    return (f"argument -k: {keyword!r} is not a pytest -k expression ({why}): give test names "
            "joined by and, or, not and parentheses, e.g. 'test_vector and hysteresis'")


def print_report(report: dict[str, Any], *, zoo: bool = False) -> None:
    """The matrix (a row per test with the rule it checks, a column per backend), then
    what differs, grouped by backend and cause, then what could not be checked and why."""
    from unifiedamp.conformance._rules import rule_of

    names = list(report["backends"])
    tests = tests_of(report)
    print(f"unifiedamp {__version__} conformance, spec version {spec.SPEC_VERSION}"
          + (" (the zoo: loss scalers of other projects)" if zoo else "")
          + (f", only the tests -k {report['keyword']!r} selects" if report.get("keyword")
             else ""))
    print_table([("test", "rule", *names)]
                + [(t, rule_of(t), *(cell(report["backends"][n], t) for n in names))
                   for t in tests])
    for name in names:
        r = report["backends"][name]
        if r["status"] in _NOT_RUN:
            why = "listed, not a failure" if zoo else _why_not_run(r, report["requested"])
            print(f"\n{name}: {r['status']} ({why}): {r.get('detail', '')}")
            continue
        if r["status"] != "ok":
            print(f"\n{name}: {r['status']}: {r.get('detail', '')}")
            continue
        h = r.get("header", {})
        fixed = ", ".join(f"{k}={v}" for k, v in h.get("fixed", {}).items()) or "none"
        print(f"\n{name}: {h.get('adapter')} ({h.get('framework')} {h.get('framework_version')}, "
              f"{h.get('device')}); compares {h.get('compare', 'full')}; fixed: {fixed}")
        failing: dict[str, list[str]] = {}
        skipped: dict[str, list[str]] = {}
        for test, t in r["tests"].items():
            if t["outcome"] in ("failed", "error", "xpassed"):
                # Each of several failures (a Hypothesis ExceptionGroup) on a line of its own.
                failing.setdefault("; ".join(t.get("causes", [])) or "?", []).append(
                    f"  {test}: {_first_line(t['detail'])}" + "".join(
                        f"\n      failure {i} of {len(t['failures'])}: {_first_line(text)}"
                        for i, text in enumerate(t.get("failures", []), 1)))
            elif t["outcome"] in ("skipped", "xfailed"):
                skipped.setdefault(f"{t['outcome']}: {_first_line(t['detail'])}", []).append(test)
        for rule, lines in failing.items():
            print(f"  differs: {rule} ({len(lines)} test{'s' * (len(lines) > 1)})")
            print("\n".join(f"  {line}" for line in lines))
        for reason, skipped_tests in skipped.items():
            print(f"  {reason}\n    {compact(skipped_tests)}")
        for e in r.get("unmatched_xfails", []):
            print(f"  xfail entry matched no test: {e['where']}: {e['pattern']}")
    result = "PASS" if report["passed"] else "FAIL"
    if zoo:
        result = "done" if report["passed"] else "ERROR (a column did not run)"
    # A run that failed for a column of its own says so below that column; else, why nothing ran.
    if not report["tests_run"] and not any(r["status"] == "error" if zoo else _failed(
            r, report["requested"]) for r in report["backends"].values()):
        result = f"{'ERROR' if zoo else 'FAIL'} (no test ran: {_why_no_test(report)})"
    print(f"\nresult: {result}{_not_run_note(report['not_run'])}")


def _why_no_test(report: dict[str, Any]) -> str:
    ran = [r for r in report["backends"].values() if r["status"] == "ok"]
    if not ran:
        return "no column could run"
    if any(r.get("tests") for r in ran):
        return "every test it selected was skipped"
    if report.get("keyword"):
        return f"-k {report['keyword']!r} selects none of the suite's tests"
    return "the suite collected no test"


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
    except errors.UnknownBackendError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _zoo_arg(value: str) -> list[str]:
    """``--zoo [NAMES]``: comma-separated columns of the zoo."""
    from unifiedamp.conformance.zoo import ZOO

    names = value.split(",")
    if "" in names:  # `--zoo ,` would otherwise mean the whole zoo
        raise argparse.ArgumentTypeError(
            f"{value!r} has an empty name: give comma-separated names without a comma too "
            f"many (the zoo has {', '.join(ZOO)}), or --zoo alone for all of them")
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"no zoo scaler {', '.join(map(repr, unknown))}; the zoo has {', '.join(ZOO)}")
    return names


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


def _timeout_arg(value: str) -> float:
    """``--timeout``: seconds, a finite number above 0."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds > 0 (each backend's run), got {value!r}")
    return seconds


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp conformance [--backend NAME ...] [--zoo [NAMES]] [--max-examples N]
    [-k EXPRESSION] [--timeout SECONDS] [--json] [--markdown FILE] [--check FILE]``."""
    p = sub.add_parser(
        "conformance", help="run the conformance suite on every installed backend",
        description="Runs the shipped conformance suite (pytest, hypothesis) on each backend, "
                    "each in a subprocess of its own, as many at a time as there are CPUs, and "
                    "prints a matrix: a row per test with the rule it checks, a column per "
                    "backend, then what differs, by backend and cause. On a terminal, stderr "
                    "says what runs and how each backend ended, with its time.",
        epilog="exit status: 0 when every backend that ran follows the spec (a backend not "
               "installed is listed, and fails the run only when named with --backend); 1 "
               "when a test differs, a requested backend did not run, or no test ran (all "
               "deselected or skipped) (--zoo: only when a column could not run, no test "
               "ran, or --check found a difference); 2 for a usage error (checked before "
               "anything runs) or a missing pytest/hypothesis.")
    p.add_argument("--backend", action="append", type=_backend_arg,
                   help="a backend name or module:Class (a unifiedamp.GradScaler subclass or an "
                        "adapter class); repeatable; default: all known, where one that is not "
                        "installed does not fail the run; a backend named here that does not "
                        "run does")
    p.add_argument("--zoo", nargs="?", const=[], type=_zoo_arg, default=None, metavar="NAMES",
                   action="extend",
                   help="run the suite on other projects' loss scalers instead of --backend "
                        "(all, or the comma-separated NAMES; repeatable); differences are "
                        "findings, so the exit status is 1 only when a column could not run")
    p.add_argument("--max-examples", type=_examples_arg, default=None, metavar="N",
                   help="hypothesis examples per property, at least 1 (default 200)")
    p.add_argument("-k", dest="keyword", metavar="EXPRESSION",
                   help="run only the tests whose names match EXPRESSION, as pytest -k (e.g. "
                        "'test_vector or test_inf_on_one_rank'); default: the whole suite")
    p.add_argument("--timeout", type=_timeout_arg, default=WORKER_TIMEOUT_S, metavar="SECONDS",
                   help="stop a backend's run after SECONDS and report it as an error naming "
                        f"the test it was in (default {WORKER_TIMEOUT_S}; more on a busy "
                        "machine)")
    p.add_argument("--json", action="store_true", help="print the report as JSON, no progress")
    add_progress_option(p)
    p.add_argument("--markdown", metavar="FILE",
                   help="with --zoo: write the zoo's matrix and its explained differences "
                        "(docs/scalers.md)")
    p.add_argument("--check", metavar="FILE",
                   help="with --zoo: exit 1, with a diff, if FILE differs from a fresh run")
    p.set_defaults(func=_cmd_conformance)
