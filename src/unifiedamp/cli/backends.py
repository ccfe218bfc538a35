"""``unifiedamp backends``: each known backend, installed and importable or not, its
framework's version, its devices and what to install.

Each backend is imported in a subprocess of its own (``python -m unifiedamp.cli _worker
NAME``), so that frameworks that cannot share a process never do, and a broken install is
reported, not fatal.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
from typing import Any

from unifiedamp import _registry
from unifiedamp.cli._shared import WORKER_TIMEOUT_S, is_installed, last_line, print_table


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
    return {"backend": name, "status": "ok", "devices": list(cls.devices())}


def _info_in_subprocess(name: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "unifiedamp.cli", "_worker", name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"backend": name, "status": "error",
                "detail": f"timed out after {WORKER_TIMEOUT_S} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"backend": name, "status": "error",
                "detail": f"worker exited with {proc.returncode}: {last_line(proc)}"}
    return json.loads(lines[-1])


def _framework_version(row: _registry.BackendInfo) -> str | None:
    try:
        return importlib.metadata.version(row.framework)
    except importlib.metadata.PackageNotFoundError:
        return None


def backends_report() -> list[dict[str, Any]]:
    """One dict per known backend: installed (found) and importable or not, framework version,
    devices, install hint, and the import's error where there is one."""
    report = []
    for name, row in _registry.available().items():
        installed = is_installed(row.modules[0])
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
    print_table(rows)
    for e in report:
        if e.get("status") == "not importable":
            print(f"\n{e['backend']}: installed but not importable: {e['error']}")
        elif "error" in e:
            print(f"\n{e['backend']}: {e['status']}: {e['error']}")
    return 0


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp backends [--json]``."""
    p = sub.add_parser("backends", help="list backends: installed, version, devices")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_backends)
