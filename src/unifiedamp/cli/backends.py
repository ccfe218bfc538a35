"""``unifiedamp backends``: each known backend, installed and importable or not, its
framework's version, its devices and what to install.

Each backend is imported in a subprocess of its own (``python -m unifiedamp.cli _worker
NAME``), so that frameworks that cannot share a process never do, and a broken install is
reported, not fatal; the subprocesses run side by side, one per CPU.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
from typing import Any

from unifiedamp import _registry
from unifiedamp.cli._shared import (
    WORKER_TIMEOUT_S,
    Progress,
    add_progress_option,
    is_installed,
    last_line,
    print_table,
    progress_wanted,
)


def worker(name: str) -> dict[str, Any]:
    """Runs in the subprocess: imports one backend and reports its devices as JSON."""
    try:
        cls = _registry.load(name)
    except ImportError as exc:
        # The framework's own error (an OSError from a missing shared library...):
        # the install hint is in the table already.
        cause = exc.__cause__ or exc
        return {"backend": name, "status": "not importable",
                "detail": f"{type(cause).__name__}: {cause}"}
    info = {"backend": name, "status": "ok", "devices": list(cls.devices())}
    if name == "keras":
        # Keras 3 computes with another framework, picked when it is imported
        # (KERAS_BACKEND, ~/.keras/keras.json): the devices are that framework's.
        import keras

        info["runs_on"] = keras.backend.backend()
    return info


def _info_in_subprocess(name: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "unifiedamp.cli", "_worker", name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"backend": name, "status": "error",
                "detail": f"timed out after {WORKER_TIMEOUT_S} s (its import hangs: try "
                          f"`{_import_command(name)}`)"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"backend": name, "status": "error",
                "detail": f"worker exited with {proc.returncode}: {last_line(proc)} (the "
                          f"whole error: `{_import_command(name)}`)"}
    return json.loads(lines[-1])


def _import_command(name: str) -> str:
    """The command that imports a backend as its worker does, with the whole traceback."""
    return f"python -c 'import unifiedamp; unifiedamp.GradScaler(backend=\"{name}\")'"


def _framework_version(framework: str) -> str | None:
    """The installed version of ``framework``, a distribution's name, or else a module's
    (tensorflow comes as tensorflow-cpu too)."""
    try:
        return importlib.metadata.version(framework)
    except importlib.metadata.PackageNotFoundError:
        pass
    for name in importlib.metadata.packages_distributions().get(framework, []):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def backends_report(show_progress: bool = False) -> list[dict[str, Any]]:
    """One dict per known backend: installed (found) and importable or not, framework version,
    devices (for Keras, those of the framework it runs on, named by ``runs_on``), install
    hint, and the import's error where there is one.

    Args:
        show_progress: Say on stderr which backends are being imported, for how long, and
            what each import found.
    """
    from concurrent.futures import ThreadPoolExecutor

    rows = _registry.available()
    installed = {name: is_installed(row.modules[0]) for name, row in rows.items()}
    found = [name for name in rows if installed[name]]
    with Progress("backends", found, enabled=show_progress) as progress, ThreadPoolExecutor(
            max_workers=max(1, min(len(found), os.cpu_count() or 1))) as pool:

        def run(name: str) -> dict[str, Any]:
            progress.start(name)
            info = _info_in_subprocess(name)
            progress.finish(name, _outcome(info))
            return info

        infos = {name: pool.submit(run, name) for name in found}
        report = []
        for name, row in rows.items():
            entry = {"backend": name, "installed": installed[name], "importable": False,
                     "framework": row.framework, "version": _framework_version(row.framework),
                     "devices": [], "install": row.install}
            if installed[name]:
                info = infos[name].result()
                entry["devices"] = info.get("devices", [])
                entry["importable"] = info["status"] == "ok"
                if "runs_on" in info:
                    entry["runs_on"] = info["runs_on"]
                    entry["runs_on_version"] = _framework_version(info["runs_on"])
                if info["status"] != "ok":
                    entry["status"], entry["error"] = info["status"], info.get("detail")
            report.append(entry)
    return report


def _outcome(info: dict[str, Any]) -> str:
    """What a backend's import found, for its progress line."""
    if info["status"] != "ok":
        return info["status"]
    on = f" on {info['runs_on']}" if "runs_on" in info else ""
    return f"importable{on}, devices {', '.join(info['devices']) or '-'}"


def _installed_cell(entry: dict[str, Any]) -> str:
    if not entry["installed"]:
        return "no"
    return entry.get("status", "yes")


def _cmd_backends(args: argparse.Namespace) -> int:
    report = backends_report(show_progress=progress_wanted(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_backends(report)
    return 0


def print_backends(report: list[dict[str, Any]]) -> None:
    """The table of :func:`backends_report`, then the error of each backend that has one."""
    rows = [("backend", "installed", "framework", "devices", "install")]
    for e in report:
        framework = f"{e['framework']} {e['version'] or ''}".strip()
        if "runs_on" in e:  # the framework whose devices these are
            framework += f" on {e['runs_on']} {e['runs_on_version'] or ''}".rstrip()
        rows.append((e["backend"], _installed_cell(e), framework,
                     ", ".join(e["devices"]) or "-", e["install"]))
    print_table(rows)
    for e in report:
        if e.get("status") == "not importable":
            print(f"\n{e['backend']}: installed but not importable: {e['error']} (reinstall: "
                  f"{e['install']}; the whole error: `{_import_command(e['backend'])}`)")
        elif "error" in e:
            print(f"\n{e['backend']}: {e['status']}: {e['error']}")


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp backends [--json] [--progress | --no-progress]``."""
    p = sub.add_parser(
        "backends", help="list backends: installed, version, devices",
        description="Lists every known backend: whether its framework is installed and "
                    "imports, the framework's version, the devices it computes on (for Keras, "
                    "those of the framework Keras runs on, named in the framework column) and "
                    "what to install. Each backend is imported in a subprocess of its own; on "
                    "a terminal, stderr says which and for how long.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_progress_option(p)
    p.set_defaults(func=_cmd_backends)
