"""Lets tests of every framework share one pytest process without crashing it.

Tests that import a framework carry ``@pytest.mark.framework("name")``.
Frameworks whose import order matters (paddle, tensorflow and keras) are
imported inside the tests, never at module level, so that collection imports
neither; items are reordered so that paddle's tests run before tensorflow's
(paddle 3.3.1 imported after tensorflow 2.21 segfaults). Under pytest-xdist (README's
``-n 2``) the default ``--dist load`` hands each worker its tests in collection order (one
at a time: ``--maxschedchunk 1`` unless given), so the order holds in every worker; the
modes that group by file or steal work do not keep it and are refused.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile

import pytest

from unifiedamp._isolation import import_rank


def pytest_configure(config: pytest.Config) -> None:
    dist = getattr(config.option, "dist", "no")
    if dist not in ("no", "load"):
        raise pytest.UsageError(
            f"--dist {dist} would let a worker import tensorflow before paddle (a segfault): "
            "use the default, `pytest -n 2` (--dist load)")
    if dist == "load" and config.getoption("maxschedchunk", None) is None:
        # xdist hands out tests in chunks of up to half of what is left per worker: a
        # worker then holds a run of slow tests (launches of several processes, doc
        # examples) while the others have finished, minutes alone at the end. One at a time
        # (two queued), in collection order all the same, so the import order holds.
        config.option.maxschedchunk = 1
    _share_jax_compilations(config)
    _share_hypothesis_storage(config)
    # A worker holds every framework and what its tests traced: with the default thresholds
    # (700, 10, 10) the collector takes several percent of a Keras test's time (half of
    # that with these), traversing objects that live as long as the worker. A test that
    # needs a collection at a given point calls gc.collect().
    gc.set_threshold(50_000, 20, 20)
    config.addinivalue_line(
        "markers", "framework(name): the test imports this framework; ordered for import safety"
    )
    config.addinivalue_line(
        "markers", "slow: one of the heaviest tests (10 s or more on two cores); "
                   "-m 'not slow' leaves them out"
    )
    config.addinivalue_line(
        "markers", "distributed: runs several processes under a distributed engine; "
                   "-m 'not distributed' leaves them out"
    )


def _share_jax_compilations(config: pytest.Config) -> None:
    """One JAX persistent compilation cache for the session, new and removed at its end:
    the workers and the interpreters the tests start compile the same steps again and again
    (XLA's compilation is most of the time of a JAX test on CPU). What runs is the same
    executable, so no result changes; a test that counts compilations counts the cache's
    hits too. Set here, before the xdist workers start, so that they and every subprocess
    inherit it; an environment that sets JAX_COMPILATION_CACHE_DIR keeps its own."""
    if os.environ.get("PYTEST_XDIST_WORKER") or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="unifiedamp-tests-jax-cache-")
    os.environ.update(JAX_COMPILATION_CACHE_DIR=folder,
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def _share_hypothesis_storage(config: pytest.Config) -> None:
    """The processes the tests start use this run's Hypothesis folder (the rootdir's
    ``.hypothesis``, where the workers keep theirs). Without it each, started in a folder of
    its own (the conformance suite's runs), builds Hypothesis's caches again: the Unicode
    table that ``st.text`` reads and the constants it collects from the project's modules.
    (The conformance suite keeps no example database there.) An environment that sets
    HYPOTHESIS_STORAGE_DIRECTORY keeps its own."""
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(config.rootpath / ".hypothesis"))


def _framework_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("framework")
    return marker.args[0] if marker else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort keeps each file's own order within a rank.
    items.sort(key=lambda item: import_rank(_framework_of(item) or ""))


@pytest.fixture(scope="session")
def fork_servers(tmp_path_factory):
    """The fork servers of the session's workers (tests/_forkserver.py): this process's
    sessions of them are stopped at the end of the session."""
    # Imported here: tests/test_registry.py runs a copy of this file in a folder without it.
    from _forkserver import ForkServers
    from _shared_child import shared_folder

    servers = ForkServers(shared=shared_folder(tmp_path_factory) / "forkservers")
    yield servers
    servers.close()


@pytest.fixture
def run_python(fork_servers):
    """Runs Python code as ``python -c code *args`` does, returning ``subprocess.run``'s
    result.

    A script that starts by importing heavy frameworks runs in a fork of a server that
    imported them (tests/_forkserver.py says what it sees and what differs); ``fresh=True``
    asks for a plain interpreter, for import-time behaviour (what an import loads, import
    hooks, startup cost) or anything else a fork would change.
    """

    def run(code: str, timeout: float = 300, env: dict | None = None,
            cwd: str | os.PathLike[str] | None = None, fresh: bool = False,
            args: tuple[str, ...] = ()):
        return fork_servers.run(code, timeout=timeout, env=env, cwd=cwd, fresh=fresh,
                                args=args)

    return run
