"""The pytest plugin (entry point ``pytest11``) that runs the shipped suite on any backend.

``pytest --pyargs unifiedamp.conformance --unifiedamp-backend NAME_OR_module:Class``.
Without a backend, it changes nothing in a pytest run: the shipped test module
is not collected. It imports only the standard library and pytest until the
suite is asked for.
"""

from __future__ import annotations

import fnmatch
import json
import os
import pathlib
import sys
import traceback
from typing import Any, NamedTuple

import pytest

_HERE = pathlib.Path(__file__).resolve().parent
_SHIPPED_TESTS = _HERE / "test_conformance.py"
_BUILTIN_XFAILS = _HERE / "xfails.txt"
_ENV = {"backend": "UNIFIEDAMP_BACKEND", "max_examples": "UNIFIEDAMP_MAX_EXAMPLES",
        "xfails": "UNIFIEDAMP_XFAILS", "json": "UNIFIEDAMP_JSON",
        "progress": "UNIFIEDAMP_PROGRESS"}


class XfailEntry(NamedTuple):
    backend: str
    pattern: str
    reason: str
    where: str


def read_xfails(path: pathlib.Path) -> list[XfailEntry]:
    """Parses an xfails file: ``<backend> <test name pattern>  # <reason>`` per line.

    In a pattern, ``*`` and ``?`` are wildcards and brackets are literal.
    """
    entries = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line, _, reason = raw.partition("#")
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise pytest.UsageError(
                f"{path}:{number}: expected '<backend> <test pattern>  # reason', got {raw!r}")
        entries.append(XfailEntry(fields[0], fields[1], reason.strip() or "known deviation",
                                  f"{path.name}:{number}"))
    return entries


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("unifiedamp", "unifiedamp conformance suite")
    group.addoption("--unifiedamp-backend", default=None, metavar="NAME_OR_module:Class",
                    help="run the shipped conformance suite on this backend "
                         f"(env {_ENV['backend']})")
    group.addoption("--unifiedamp-max-examples", type=int, default=None, metavar="N",
                    help=f"hypothesis examples per property, default 200 "
                         f"(env {_ENV['max_examples']})")
    group.addoption("--unifiedamp-xfails", default=None, metavar="FILE",
                    help="extra known-deviations file, same format as the shipped "
                         f"xfails.txt (env {_ENV['xfails']})")
    group.addoption("--unifiedamp-json", default=None, metavar="FILE",
                    help=f"write a JSON report of every test's outcome (env {_ENV['json']})")
    group.addoption("--unifiedamp-progress", default=None, metavar="FILE",
                    help="keep '<tests done> <tests collected> [<test running>]' in FILE while "
                         f"the suite runs (env {_ENV['progress']})")


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(f"unifiedamp_{name}")
    return value if value is not None else os.environ.get(_ENV[name]) or None


def pytest_configure(config: pytest.Config) -> None:
    if _option(config, "max_examples") is not None:
        # The contract reads the option; the environment variable is folded in here.
        config.option.unifiedamp_max_examples = int(_option(config, "max_examples"))
    config.stash[_UNMATCHED] = []
    path = _option(config, "json")
    if path is not None:
        config.pluginmanager.register(_JsonReport(config, path), "unifiedamp-json-report")
    if _option(config, "progress") is not None:
        config.pluginmanager.register(_Progress(_option(config, "progress")),
                                      "unifiedamp-progress")
    name = _option(config, "backend")
    if name is not None:
        try:
            _adapter(config)
        except ImportError as exc:
            if path is not None:
                pathlib.Path(path).write_text(json.dumps(
                    {"header": {"backend": name}, "status": "not installed", "detail": str(exc)}))
            raise pytest.UsageError(f"unifiedamp backend {name!r} is not installed: {exc}") \
                from None


def pytest_ignore_collect(collection_path: pathlib.Path, config: pytest.Config) -> bool | None:
    if collection_path.resolve() == _SHIPPED_TESTS and _option(config, "backend") is None:
        return True
    return None


@pytest.fixture(scope="session")
def unifiedamp_adapter(pytestconfig: pytest.Config) -> Any:
    """The adapter of the backend named by ``--unifiedamp-backend``."""
    return _adapter(pytestconfig)


def _adapter(config: pytest.Config) -> Any:
    cached = config.stash.get(_ADAPTER, None)
    if cached is not None:
        return cached
    name = _option(config, "backend")
    if name is None:
        raise pytest.UsageError("pass --unifiedamp-backend NAME_OR_module:Class")
    from unifiedamp.errors import MissingBackendError, UnknownBackendError

    try:
        adapter = load_adapter(name)
    except MissingBackendError:
        raise
    except (UnknownBackendError, NotImplementedError, TypeError) as exc:
        raise pytest.UsageError(f"{name}: {exc}") from None
    config.stash[_ADAPTER] = adapter
    return adapter


#: What the suite calls on every adapter; the rest depends on its capabilities.
ADAPTER_METHODS = ("new", "iterate", "read", "snapshot")


def load_adapter(name: str) -> Any:
    """The adapter of a backend name or ``"module:Class"``.

    The target may be a ``unifiedamp.GradScaler`` subclass (its
    ``conformance_adapter()``), an adapter class (built with no arguments) or an
    adapter object: anything with :data:`ADAPTER_METHODS`.

    Raises:
        ImportError: The target's module cannot be imported.
        UnknownBackendError: The module has no such attribute.
        TypeError: The target is neither a scaler nor an adapter (the message says
            what it lacks).

    Example:
        >>> load_adapter("numpy").name
        'numpy'
        >>> load_adapter("unifiedamp.conformance.zoo:ZooEntry")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: unifiedamp.conformance.zoo:ZooEntry is neither ... it has no new, iterate, ...
    """
    from unifiedamp import _registry
    from unifiedamp._isolation import ensure_importable

    row = _registry.resolve(name)
    if ":" not in name or name in _registry.available():
        return _registry.load(name).conformance_adapter()
    ensure_importable(row.modules[0])
    target = _registry.import_target(name)
    if callable(getattr(target, "conformance_adapter", None)):
        return target.conformance_adapter()
    missing = [m for m in ADAPTER_METHODS if not callable(getattr(target, m, None))]
    if missing:
        raise TypeError(
            f"{name} is neither a unifiedamp.GradScaler subclass nor a conformance adapter: it "
            f"has no {', '.join(missing)} (docs/conformance.md, 'Adapters and capabilities')")
    return target() if isinstance(target, type) else target


_ADAPTER = pytest.StashKey[Any]()
_UNMATCHED = pytest.StashKey[list]()


def header_fields(config: pytest.Config) -> dict[str, Any]:
    """What the report header shows, also written to the JSON report."""
    from unifiedamp import __version__, spec
    from unifiedamp.conformance.interface import CAPABILITIES

    adapter = _adapter(config)
    info = adapter.info()
    fixed = getattr(adapter, "fixed", {})
    return {"backend": _option(config, "backend"), "adapter": adapter.name,
            "compare": getattr(adapter, "compare", "full"),
            "fixed": {k: "derived" if callable(v) else v for k, v in fixed.items()},
            "framework": info.get("framework"), "framework_version": info.get("version"),
            "device": info.get("device"), "unifiedamp": __version__,
            "spec_version": spec.SPEC_VERSION,
            "capabilities": sorted(adapter.capabilities),
            "not_declared": sorted(set(CAPABILITIES) - set(adapter.capabilities))}


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if _option(config, "backend") is None:
        return None
    h = header_fields(config)
    return [
        f"unifiedamp {h['unifiedamp']} conformance, spec version {h['spec_version']}",
        f"backend: {h['backend']} ({h['framework']} {h['framework_version']}), "
        f"device: {h['device']}",
        f"capabilities: {', '.join(h['capabilities']) or 'none'}; not declared (skipped): "
        f"{', '.join(h['not_declared']) or 'none'}",
    ]


def _backend_of(item: pytest.Item, config: pytest.Config) -> str | None:
    if getattr(item, "path", None) is not None and item.path.resolve() == _SHIPPED_TESTS:
        return _option(config, "backend")
    cls = item.cls if isinstance(item, pytest.Function) else None
    return getattr(cls, "backend", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from unifiedamp.conformance.contract import ScalerContract

    contract_items = [i for i in items if isinstance(i, pytest.Function)
                      and i.cls is not None and issubclass(i.cls, ScalerContract)]
    if not contract_items:
        return
    entries = read_xfails(_BUILTIN_XFAILS)
    extra = _option(config, "xfails")
    if extra:
        entries += read_xfails(pathlib.Path(extra))
    backends = {_backend_of(i, config) for i in contract_items}
    matched: set[XfailEntry] = set()
    for item in contract_items:
        backend = _backend_of(item, config)
        for entry in entries:
            # '*' and '?' are wildcards; '[' is literal, as in parametrized test ids.
            pattern = entry.pattern.replace("[", "[[]")
            if entry.backend == backend and fnmatch.fnmatchcase(item.name, pattern):
                item.add_marker(pytest.mark.xfail(reason=f"{entry.reason} ({entry.where})",
                                                  strict=True))
                matched.add(entry)
    config.stash[_UNMATCHED] = [e for e in entries if e.backend in backends and e not in matched]


class _Progress:
    """Writes how many tests have run, of how many, and the one running (its id after the
    file's: ``TestConformance::test_vector[interval_one]``), for a parent process that
    shows progress, or that stops a run that took too long and names the test it was in."""

    def __init__(self, path: str):
        self.path, self.done, self.total = pathlib.Path(path), 0, 0

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)
        self.path.write_text(f"0 {self.total}\n")

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.path.write_text(f"{self.done} {self.total} {nodeid.partition('::')[2]}\n")

    def pytest_runtest_logfinish(self) -> None:
        self.done += 1
        self.path.write_text(f"{self.done} {self.total}\n")


class _JsonReport:
    """Collects every test's outcome and writes them, with the header, as JSON."""

    def __init__(self, config: pytest.Config, path: str):
        self.config, self.path = config, path
        self.tests: dict[str, dict[str, Any]] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item,
                                  call: pytest.CallInfo[None]) -> Any:
        report = yield
        # Hypothesis raises an ExceptionGroup when it finds several distinct failures; the
        # report's message is then only "found 2 distinct failures", so each one is kept.
        failures = getattr(call.excinfo.value, "exceptions", None) if call.excinfo else None
        if isinstance(failures, tuple) and all(isinstance(e, BaseException) for e in failures):
            report.unifiedamp_failures = [
                "".join(traceback.format_exception_only(e)).strip() for e in failures]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and report.passed:
            return
        name = report.nodeid.rpartition("::")[2]
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
            detail = report.wasxfail
        elif report.skipped:
            outcome = "skipped"
            detail = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            detail = detail.removeprefix("Skipped: ")
        elif report.failed:
            outcome = "failed" if report.when == "call" else "error"
            crash = getattr(report.longrepr, "reprcrash", None)
            detail = crash.message if crash else str(report.longrepr)[-2000:]
        else:
            outcome, detail = "passed", ""
        if self.tests.get(name, {}).get("outcome") in ("failed", "error"):
            return  # a teardown report must not hide the call's failure
        from unifiedamp.conformance._rules import causes_of, rule_of

        entry: dict[str, Any] = {"outcome": outcome, "detail": detail, "rule": rule_of(name)}
        failures = getattr(report, "unifiedamp_failures", None)
        if outcome in ("failed", "error") and failures:
            # Each failure in the detail too, for whoever reads only that.
            entry.update(failures=failures, detail="\n".join(
                [detail] + [f"failure {i} of {len(failures)}: {text}"
                            for i, text in enumerate(failures, 1)]))
        if outcome in ("failed", "error"):
            entry["causes"] = causes_of(entry["detail"])
        self.tests[name] = entry

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        header = header_fields(self.config) if _option(self.config, "backend") else {}
        report = {"header": header, "exitstatus": int(exitstatus), "tests": self.tests,
                  "unmatched_xfails": [e._asdict() for e in self.config.stash[_UNMATCHED]]}
        pathlib.Path(self.path).write_text(json.dumps(report, indent=2))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    contract = sys.modules.get("unifiedamp.conformance.contract")
    if contract is not None and contract.SEEN:
        from unifiedamp import __version__, spec

        terminalreporter.section("unifiedamp conformance")
        terminalreporter.line(f"unifiedamp {__version__}, spec version {spec.SPEC_VERSION}")
        for test_class, info in contract.SEEN.items():
            terminalreporter.line(
                f"{test_class}: backend {info['adapter']} ({info.get('framework')} "
                f"{info.get('version')}), device {info.get('device')}; capabilities "
                f"{', '.join(info['capabilities']) or 'none'}; not declared (skipped): "
                f"{', '.join(info['not_declared']) or 'none'}")
    unmatched = config.stash.get(_UNMATCHED, [])
    if unmatched:
        terminalreporter.section("unifiedamp xfails that matched no test")
        for e in unmatched:
            terminalreporter.line(f"{e.where}: {e.backend} {e.pattern}  # {e.reason}")
