"""Runs the tests' ``python -c`` scripts in forks of an interpreter that imported their
frameworks once (a fork server, or zygote).

Why: the tests run about 250 scripts in interpreters of their own (the examples of the
docs, framework checks that paddle and tensorflow cannot share a process for), and most of
their time went to importing the same frameworks again (torch about 1.3 s of CPU, tensorflow
or keras 3.5 s, paddle 1 s, jax and flax about 0.7 s). A server imports them once and forks
a child per script.

Which scripts: the *leading imports* of a script are its statements up to the first that
is not a plain ``import``/``from ... import`` or an ``os.environ["NAME"] = "value"`` of
string literals after ``import os`` (docstrings and comments do not end them).
Of those, the imports of a heavy framework (:data:`HEAVY`) are the preload, in the script's
order, as long as the only other imports among them are of the standard library; the first
import of anything else (``import unifiedamp``, ``from . import x``) ends the preload, since
that module could see or hook the frameworks imported after it. A script without a preload
runs in a plain ``python -c`` interpreter, as does one whose preload failed in a server (an
import error or a crash: the plain run shows it as it happens). So ``import paddle; import
tensorflow`` preloads both in that order (the other order segfaults in one process: the
server crashes and the script runs plain, where it crashes the same way). The variables
the leading statements set (``os.environ["KERAS_BACKEND"] = "jax"`` before ``import
keras``) are in the server's environment when it imports, as they would be in the script's
when it comes to its imports; the script sets them again in the child, whose environment
starts as the script's own (a ``PYTHON...`` variable, which the interpreter reads at its
start, ends the leading statements instead).

Servers are keyed by the preload less its ``numpy`` imports where it also imports a
framework that imports numpy itself (:data:`IMPORT_NUMPY`): ``import numpy; import keras``
is forked from the server for ``import keras``, whose import of numpy is then the one
that came first in the script.

The server does the imports as the statements would (``__import__`` with the statement's
module and names) without binding any name: the script's own statements run again in the
child, find their modules imported and bind the names, so a name the script never imports
stays undefined. A server stops importing where the rest would only bind names (``import
keras`` imports numpy and tensorflow: a server for ``import keras; import numpy`` does the
first only), and a script is forked from a server whose imports begin its own when the server
says the rest would only bind names; otherwise a server is started for it. A server is also
keyed by the whole environment the script gets (less ``PYTEST_CURRENT_TEST``, which pytest
changes per test), since frameworks read variables such as ``KERAS_BACKEND`` or ``XLA_FLAGS``
when imported: a script with ``env={...}`` gets a server started with that environment.
Each pytest process keeps at most :data:`MAX_SERVERS` servers (each holds 70 to 320 MB of
memory of its own); the one that saved least (import time times scripts forked) stops first,
all stop at the end of the session.

Shared servers (``ForkServers(shared=folder)``, as ``run_python`` has them): the pytest-xdist
workers of a session use one server per preload and environment (less
``PYTEST_XDIST_WORKER``), found by a Unix socket in the session's folder: where each worker
started its own, most servers forked one or two scripts. A worker also forks a script from
a server another worker started for the beginning of the script's preload, when that
server says the rest would only bind names. A worker talks to a *session*, a
fork of the server that forks the scripts as a private server does; stopping it closes the
session, and the server exits once it has had none for :data:`SHARED_IDLE_SECONDS`.

The server only imports: it never runs a computation
(JAX warns when forked once its backend is up, and threads started by a computation would be
missing in the child).

What a script sees, as under ``python -c CODE``: the bare ``__main__`` module, where its code
runs; ``__name__ == "__main__"``; ``sys.argv == ["-c", *args]``; its cwd; exactly its environment in
``os.environ``; stdin ``/dev/null`` (as pytest's fd 0 is, during a test); stdout and stderr
pipes that start with what the imports printed; an uncaught exception printed by
``sys.excepthook`` with the script's own frames, and exit status 1; ``sys.exit(n)``, atexit
handlers, non-daemon threads and the interpreter's finalization as usual; a crash as a
negative return code (the signal). The result is the ``subprocess.CompletedProcess`` that
``subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)`` returns, and
a timeout kills the child and raises ``subprocess.TimeoutExpired`` naming that command (the
time counts from the call, a server's start included, as a plain run's imports count). A
server that died between scripts is started again; one that dies while its child runs a
script is reported (:class:`ForkServerError`, with the end of its log).

What differs from a fresh interpreter:

- the process is a fork: its pid is new, its parent is the server (a shared server's
  session), and a thread a framework
  started at import would not run in it (there is none on Linux: the servers have one
  thread);
- the imports ran in an empty directory, not in the script's cwd (which is ``sys.path[0]``
  for ``-c``): only a module there named like one the frameworks import would change that;
- the imports saw ``sys.argv == ["-c"]``, not the script's arguments (no framework the
  tests preload reads them at import);
- what is drawn once per interpreter is the server's: the hash seed of ``str`` (a set of
  strings iterates in the same order in every child of one server) and any seed a framework
  draws at import (numpy's global generator is reseeded in each child, ``random`` reseeds
  itself at fork);
- standard-library imports that came before the preload in the script come after it in
  ``sys.modules``, and so does a script's ``import numpy`` before a framework that imports
  numpy (that framework's import brought it in the server);
- the objects the preload created are frozen (:func:`gc.freeze`): the child's collector
  never visits them (it would write to their memory pages, and so copy them from the
  server's: a fifth of a docs example's CPU), so a reference cycle among them stays;
- the server's frames are under the script's: a warning whose stacklevel goes past the
  script's first frame names the server's file instead of ``sys:1``, and an uncaught
  ``KeyboardInterrupt`` (exit by SIGINT, as usual) prints them in its traceback.

Tests of import-time behaviour (what ``import unifiedamp`` imports, import hooks, startup
cost) ask for a plain interpreter: ``run_python(code, fresh=True)`` (tests/conftest.py).
"""

from __future__ import annotations

import ast
import collections
import fcntl
import hashlib
import itertools
import locale
import marshal
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

#: An import as a server does it: a module and the names of ``from module import ...``
#: (None for ``import module``), as ``__import__`` takes them.
Import = tuple[str, "tuple[str, ...] | None"]
#: Top-level packages whose import is worth doing once per server.
HEAVY = frozenset({"torch", "paddle", "jax", "optax", "flax", "tensorflow", "keras", "mlx",
                   "lightning", "accelerate", "transformers", "numpy"})
#: The heavy frameworks whose import imports numpy (measured: mlx.core does not).
IMPORT_NUMPY = HEAVY - {"numpy", "mlx"}
#: Servers alive at once in one pytest process (each holds 70 to 320 MB of its own).
MAX_SERVERS = 6

_SERVER_FILE = str(pathlib.Path(__file__).with_name("_forkserver_main.py"))
# Runs the server's file in a namespace of its own; the file is closed before anything
# runs (unclosed, it would warn on the command's frame, that is in __main__).
_BOOT = (f"exec(compile((lambda f: (f.read(), f.close())[0])(open({_SERVER_FILE!r}, 'rb')), "
         f"{_SERVER_FILE!r}, 'exec', dont_inherit=True), {{'__name__': '__forkserver__'}})")
#: Seconds a shared server waits without a session before it exits.
SHARED_IDLE_SECONDS = 600.0

#: Set by pytest for each test or worker: not read by any framework, and would key a server
#: per test or worker.
_PER_TEST_VARIABLES = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER")
#: A Unix socket's path is at most 107 bytes.
_MAX_SOCKET_PATH = 107
#: Hex digits of a shared server's key (its socket's name).
_KEY_DIGITS = 24
#: How long a killed child may take to be reported.
_GRACE = 30.0


class ForkServerError(RuntimeError):
    """A server died while it ran a script (its log's end is in the message)."""


def _is_docstring(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def preload_of(code: str, heavy: frozenset[str] = HEAVY) -> tuple[Import, ...]:
    """The imports a server does before forking for ``code``; () for none.

    >>> preload_of("'Doc.'\\nimport os\\nimport torch, numpy as np\\nimport unifiedamp\\n"
    ...            "import jax")
    (('torch', None), ('numpy', None))
    >>> preload_of("from jax import numpy as jnp, lax\\nimport os, keras.ops")
    (('jax', ('numpy', 'lax')), ('keras.ops', None))
    >>> preload_of("import os\\nos.environ['KERAS_BACKEND'] = 'jax'\\nimport keras")
    (('keras', None),)
    """
    return leading_statements(code, heavy)[0]


def leading_statements(code: str, heavy: frozenset[str] = HEAVY
                       ) -> tuple[tuple[Import, ...], dict[str, str]]:
    """The preload of ``code`` and the variables its leading statements set.

    >>> leading_statements("import os\\nos.environ['KERAS_BACKEND'] = 'jax'\\nimport keras")
    ((('keras', None),), {'KERAS_BACKEND': 'jax'})
    >>> leading_statements("import os\\nos.environ['PYTHONHASHSEED'] = '0'\\nimport keras")
    ((), {})
    """
    try:  # what does not compile runs plain, where it fails before importing anything
        tree = ast.parse(code)
        compile(tree, "<string>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return (), {}
    imports: list[Import] = []
    assigned: dict[str, str] = {}
    os_imported = False
    for node in tree.body:
        if _is_docstring(node):
            continue
        if os_imported and (name_value := _environ_assignment(node)) is not None:
            assigned[name_value[0]] = name_value[1]
            continue
        if isinstance(node, ast.Import):
            found = [(alias.name, None) for alias in node.names]
            os_imported |= any(a.name == "os" and a.asname is None for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found = [(node.module, tuple(alias.name for alias in node.names))]
        else:
            break
        roots = [module.partition(".")[0] for module, _ in found]
        if not all(root in heavy or root in sys.stdlib_module_names for root in roots):
            break
        imports += [pair for pair, root in zip(found, roots, strict=True) if root in heavy]
    return tuple(imports), (assigned if imports else {})


def _environ_assignment(node: ast.stmt) -> tuple[str, str] | None:
    """``(name, value)`` of ``os.environ["NAME"] = "value"`` (string literals, not a
    ``PYTHON...`` variable); None for any other statement."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(target := node.targets[0], ast.Subscript)):
        return None
    environ = target.value
    key, value = target.slice, node.value
    if not (isinstance(environ, ast.Attribute) and environ.attr == "environ"
            and isinstance(environ.value, ast.Name) and environ.value.id == "os"
            and isinstance(key, ast.Constant) and isinstance(key.value, str)
            and isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return None
    if not key.value or key.value.startswith("PYTHON") or "=" in key.value \
            or "\0" in key.value + value.value:
        return None
    return key.value, value.value


def server_preload(preload: tuple[Import, ...]) -> tuple[Import, ...]:
    """The preload a server is keyed by: ``preload`` less its numpy imports where one of
    its frameworks imports numpy itself.

    >>> server_preload((("numpy", None), ("keras", None), ("numpy", ("float32",))))
    (('keras', None),)
    >>> server_preload((("numpy", None), ("mlx.core", None)))
    (('numpy', None), ('mlx.core', None))
    """
    root = lambda pair: pair[0].partition(".")[0]  # noqa: E731
    if not any(root(pair) in IMPORT_NUMPY for pair in preload):
        return preload
    return tuple(pair for pair in preload if root(pair) != "numpy")


def _decode(data: bytes) -> str:
    # As subprocess.run(text=True) decodes: the locale's encoding, universal newlines.
    encoding = "utf-8" if sys.flags.utf8_mode else locale.getpreferredencoding(False)
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def _plain(command: list[str], timeout, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd)


class _Timeout(Exception):
    pass


class _Server:
    """One server process: its preload, its pipes, its log."""

    def __init__(self, preload: tuple[Import, ...], env: dict[str, str], folder: str,
                 share: dict | None = None):
        self.preload, self.folder = preload, folder
        self.broken = False
        self.uses = 0  # scripts forked
        self.start_seconds = 0.0  # how long the preload took
        self.answers: dict[tuple[Import, ...], bool] = {}  # to serves()
        self.log = os.path.join(folder, "server.log")
        empty = os.path.join(folder, "cwd")  # where the imports run: no module to find
        os.makedirs(empty, exist_ok=True)
        request_read, self.request = os.pipe()
        self.reply, reply_write = os.pipe()
        try:
            # stdout and stderr are pipes, as a script's are: the interpreter sets its
            # streams up from them at start (the server then points them at its files).
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(request_read), str(reply_write)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(request_read, reply_write), env=env, cwd=empty)
        finally:
            os.close(request_read)
            os.close(reply_write)
        self.pid = self.process.pid
        try:
            self._send({"preload": [list(pair) for pair in preload],
                        "out": os.path.join(folder, "import.out"),
                        "err": os.path.join(folder, "import.err"), "log": self.log,
                        **(share or {})})
        except OSError:
            self.process.kill()
            self.stop()
            raise

    @classmethod
    def session(cls, path: str, preload: tuple[Import, ...], parent: str,
                deadline: float | None) -> _Server | None:
        """A session of the shared server listening on ``path`` (its fifos in a new folder
        in ``parent``), or None where no server answers there."""
        import socket

        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
        except OSError:
            connection.close()
            return None
        self = cls.__new__(cls)
        self.folder = tempfile.mkdtemp(dir=parent)  # once there is a server to talk to
        self.broken, self.uses, self.answers = False, 0, {}
        self.log = os.path.join(path.removesuffix(".sock"), "server.log")
        self.process = None
        self.request = self.reply = connection.detach()
        try:
            hello = self._receive(deadline)
        except (OSError, _Timeout):
            hello = None
        if not hello:  # it exited as it accepted
            self.stop()
            return None
        self.preload = preload[:hello["done"]]
        self.start_seconds, self.pid = hello["seconds"], hello["pid"]
        return self

    # -- messages: an 8-byte length, then a marshal dump (tests/_forkserver_main.py)

    def _send(self, message: dict) -> None:
        data = marshal.dumps(message)
        data = len(data).to_bytes(8, "little") + data
        while data:
            data = data[os.write(self.request, data):]

    def _read_exact(self, n: int, deadline: float | None) -> bytes | None:
        chunks = []
        while n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.reply], [], [], left)[0]:
                    raise _Timeout
            chunk = os.read(self.reply, n)
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _receive(self, deadline: float | None) -> dict | None:
        header = self._read_exact(8, deadline)
        body = header and self._read_exact(int.from_bytes(header, "little"), deadline)
        return None if body is None else marshal.loads(body)

    # --

    def started(self, deadline: float | None) -> str | None:
        """Waits for the preload: None once it is done, else why the server cannot serve.

        The server stops importing where the rest of the preload would only bind names:
        its preload is then the part it imported (``import keras`` is the preload of
        ``import keras; import numpy; import tensorflow``)."""
        began = time.monotonic()
        reply = self._receive(deadline)
        if reply is None:
            self.process.wait()
            return f"the server exited with {self.process.returncode} while importing"
        if not reply["ok"]:
            return reply["error"]
        self.preload = self.preload[:reply["done"]]
        self.start_seconds = time.monotonic() - began
        return None

    def serves(self, preload: tuple[Import, ...], deadline: float | None) -> bool:
        """Whether a script with this preload can be forked from this server: its
        :func:`server_preload` begins with the server's, and the rest would only bind names
        (the server says)."""
        if server_preload(preload)[:len(self.preload)] != self.preload:
            return False
        rest = tuple(pair for pair in preload if pair not in self.preload)
        if rest and rest not in self.answers:
            try:
                self._send({"imported": [list(pair) for pair in rest]})
                reply = self._receive(deadline)
            except OSError:
                reply = None
            except _Timeout:  # its answer may still come: it serves no more
                self.broken = True
                raise
            if reply is None:
                self.broken = True
                return False
            self.answers[rest] = reply["imported"]
        return not rest or self.answers[rest]

    def alive(self) -> bool:
        if self.process is None:  # a session: nothing to read between scripts, unless closed
            return not self.broken and not select.select([self.reply], [], [], 0)[0]
        return not self.broken and self.process.poll() is None

    def log_tail(self) -> str:
        try:
            with open(self.log, errors="replace") as file:
                return file.read()[-2000:]
        except OSError:
            return ""

    def run(self, code: str, args: list[str], env: dict[str, str], cwd: str,
            deadline: float | None, names: itertools.count) -> tuple[int, bytes, bytes]:
        """The child's return code, stdout and stderr; raises _Timeout past the deadline
        (with the output so far in its args) once the child is killed."""
        n = next(names)
        fifos = [os.path.join(self.folder, f"{n}.{name}") for name in ("out", "err")]
        readers = []
        try:
            for fifo in fifos:
                os.mkfifo(fifo, 0o600)
                # Opened before the server opens it for writing; read only once the
                # server has answered, when an empty read means the end.
                readers.append(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            self._send({"code": code, "args": args, "cwd": cwd, "env": env,
                        "out": fifos[0], "err": fifos[1], "argv0": sys.executable})
            return self._collect(readers, deadline)
        finally:
            for fd in readers:
                os.close(fd)
            for fifo in fifos:
                if os.path.exists(fifo):
                    os.unlink(fifo)

    def _collect(self, readers: list[int], deadline: float | None) -> tuple[int, bytes, bytes]:
        chunks: dict[int, list[bytes]] = {fd: [] for fd in readers}
        pid = returncode = None
        try:
            reply = self._receive(deadline)
            if reply is None:
                raise ForkServerError("the server exited before forking the script")
            pid = reply["pid"]
            reading = set(readers)
            while reading or returncode is None:
                watched = [*reading, *([self.reply] if returncode is None else [])]
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise _Timeout
                for fd in select.select(watched, [], [], left)[0]:
                    if fd == self.reply:
                        reply = self._receive(None)
                        if reply is None:
                            raise ForkServerError(f"the server exited while its child {pid} "
                                                  "ran the script")
                        returncode = reply["returncode"]
                    else:
                        data = os.read(fd, 1 << 16)
                        if data:
                            chunks[fd].append(data)
                        else:
                            reading.discard(fd)
        except _Timeout:
            if pid is None:  # the server did not answer in time: it serves no more
                self.broken = True
            elif returncode is None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    reported = self._receive(time.monotonic() + _GRACE)
                except _Timeout:
                    reported = None
                if reported is None:
                    self.broken = True
            raise _Timeout(*(b"".join(chunks[fd]) for fd in readers)) from None
        out, err = (b"".join(chunks[fd]) for fd in readers)
        return returncode, out, err

    def release(self) -> None:
        """Closes the pipes to a shared server's first process and reaps it (the server
        goes on in its fork; its folder stays)."""
        for fd in (self.request, self.reply):
            os.close(fd)
        self.process.communicate()

    def stop(self) -> None:
        for fd in {self.request, self.reply}:
            try:
                os.close(fd)
            except OSError:
                pass
        if self.process is None:  # a session ends at the end of its input
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        try:  # at the end of its input it exits, unless a fork of this process holds it
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            stream.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class ForkServers:
    """The fork servers of one pytest process; :meth:`run` is ``run_python``'s runner."""

    def __init__(self, max_servers: int = MAX_SERVERS, heavy: frozenset[str] = HEAVY,
                 shared: str | os.PathLike[str] | None = None):
        self.max_servers, self.heavy = max_servers, heavy
        #: The folder of the shared servers' sockets (None: this process's own servers).
        self.shared = None if shared is None else os.path.abspath(shared)
        socket_path = os.path.join(self.shared or "", "k" * _KEY_DIGITS + ".sock")
        if self.shared and len(socket_path) > _MAX_SOCKET_PATH:
            self.shared = None  # a socket there could not be bound: servers of its own
        self.forked = 0  # scripts run in a fork
        self.folder = tempfile.mkdtemp(prefix="unifiedamp-forkserver-")
        #: environment -> the servers started with it.
        self.servers: dict[tuple, list[_Server]] = collections.defaultdict(list)
        #: (preload, environment) keys whose preload failed in a server, and why: their
        #: scripts run plain.
        self.unforkable: dict[tuple, str] = {}
        self._names = itertools.count()

    def run(self, code: str, timeout: float | None = None, env: dict | None = None,
            cwd: str | os.PathLike[str] | None = None, fresh: bool = False,
            args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """As ``subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
        text=True, timeout=timeout, env={**os.environ, **env}, cwd=cwd)``, in a fork where it
        can (never with ``fresh``)."""
        command = [sys.executable, "-c", code, *args]
        full_env = {**os.environ, **(env or {})}
        preload, assigned = leading_statements(code, self.heavy)
        where = os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd())
        valid_env = all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                        and "\0" not in k + v for k, v in full_env.items())
        if fresh or not preload or not valid_env or not os.path.isdir(where):
            # Where subprocess raises (a bad cwd or env), it raises here as well.
            return _plain(command, timeout, full_env, cwd)
        # The server imports with the variables the script sets before its imports.
        server_env = {**full_env, **assigned}
        environment = tuple(sorted((k, v) for k, v in server_env.items()
                                   if k not in _PER_TEST_VARIABLES))
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            server = self._server_for(preload, environment, server_env, deadline)
        except _Timeout:
            raise subprocess.TimeoutExpired(command, timeout) from None
        if server is None:
            return _plain(command, timeout, full_env, cwd)
        server.uses += 1
        self.forked += 1
        try:
            returncode, out, err = server.run(code, list(args), full_env, where, deadline,
                                              self._names)
        except _Timeout as timed_out:
            if server.broken:
                self._stop(server)
            out, err = timed_out.args
            raise subprocess.TimeoutExpired(command, timeout, output=out or None,
                                            stderr=err or None) from None
        except (ForkServerError, OSError) as error:
            log = server.log_tail()
            self._stop(server)
            raise ForkServerError(f"{error}; script: {code[:200]!r}; preload: {preload!r}; "
                                  f"server log: {log!r}") from error
        return subprocess.CompletedProcess(command, returncode, _decode(out), _decode(err))

    def _server_for(self, preload: tuple[Import, ...], environment: tuple,
                    env: dict[str, str], deadline: float | None) -> _Server | None:
        """A server the script can be forked from (the one with the longest preload), started
        if there is none; None where the preload fails in a server."""
        for server in [s for group in self.servers.values() for s in group if not s.alive()]:
            self._stop(server)
        keyed = server_preload(preload)
        if (preload, environment) in self.unforkable or (keyed, environment) in self.unforkable:
            return None
        for server in sorted(self.servers[environment], key=lambda s: -len(s.preload)):
            if server.serves(preload, deadline):
                return server
        server = self._start(keyed, preload, environment, env, deadline)
        if server is None or keyed == preload or server.serves(preload, deadline):
            return server
        # Its numpy import would not only bind names there: a server for the script's own.
        return self._start(preload, preload, environment, env, deadline)

    def _start(self, imports: tuple[Import, ...], preload: tuple[Import, ...],
               environment: tuple, env: dict[str, str], deadline: float | None
               ) -> _Server | None:
        """A server that does ``imports``, for a script whose preload is ``preload``."""
        alive = [s for group in self.servers.values() for s in group]
        if len(alive) >= self.max_servers:
            # The one that saved least: an import that is quick to do again, or seldom used.
            self._stop(min(alive, key=lambda s: s.start_seconds * (1 + s.uses)))
        if self.shared is not None:
            return (self._join_prefix(imports, preload, environment, deadline)
                    or self._join(imports, environment, env, deadline))
        server = self._launch(imports, environment, env, tempfile.mkdtemp(dir=self.folder),
                              deadline)
        if server is not None:
            self.servers[environment].append(server)
        return server

    def _launch(self, preload: tuple[Import, ...], environment: tuple, env: dict[str, str],
                folder: str, deadline: float | None, share: dict | None = None
                ) -> _Server | None:
        """A server started in ``folder``, once its preload is done; None where it cannot
        serve. A shared one's (``share``) first process is reaped: its fork serves."""
        try:
            server = _Server(preload, env, folder, share)
        except OSError as error:
            self.unforkable[preload, environment] = f"the server did not start: {error}"
            return None
        end = server.release if share else server.stop
        try:
            failure = server.started(deadline)
        except _Timeout:
            server.process.kill()
            end()
            raise
        except OSError as error:
            failure = f"the server did not answer: {error}"
        if share or failure is not None:
            end()
        if failure is not None:
            self.unforkable[preload, environment] = failure
            return None
        return server

    def _path(self, preload: tuple[Import, ...], environment: tuple) -> str:
        """Where the shared server for this preload and environment listens."""
        assert self.shared is not None
        # repr, not marshal: marshal's output of equal tuples depends on their reference
        # counts (it writes back-references to objects held elsewhere).
        key = hashlib.sha256(repr((preload, environment)).encode()).hexdigest()[:_KEY_DIGITS]
        return os.path.join(self.shared, f"{key}.sock")

    def _join_prefix(self, imports: tuple[Import, ...], preload: tuple[Import, ...],
                     environment: tuple, deadline: float | None) -> _Server | None:
        """A session of a running shared server, for these imports or some that begin them,
        that serves a script with this preload: another process may have started one for a
        script whose imports begin the same (``import keras`` for ``import keras, numpy,
        tensorflow``, which keras imports); None if there is none."""
        for end in range(len(imports), 0, -1):
            path = self._path(imports[:end], environment)
            session = (_Server.session(path, imports[:end], self.folder, deadline)
                       if os.path.exists(path) else None)
            if session is None:
                continue
            try:
                serves = session.serves(preload, deadline)
            except _Timeout:
                session.stop()
                raise
            if serves:
                self.servers[environment].append(session)
                return session
            session.stop()
        return None

    def _join(self, preload: tuple[Import, ...], environment: tuple, env: dict[str, str],
              deadline: float | None) -> _Server | None:
        """A session of the shared server for this preload and environment, started if no
        worker has one running; None where the preload fails in a server."""
        assert self.shared is not None
        os.makedirs(self.shared, exist_ok=True)
        path = self._path(preload, environment)
        lock_path = path.removesuffix(".sock") + ".lock"
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:  # another worker may be starting it: its imports take seconds
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() > deadline:
                        raise _Timeout from None
                    time.sleep(0.02)
            session = _Server.session(path, preload, self.folder, deadline)
            if session is None:
                if os.path.exists(path):  # left by a server that was killed
                    os.unlink(path)
                share = {"listen": path, "lock": lock_path, "idle": SHARED_IDLE_SECONDS}
                if self._launch(preload, environment, env, path.removesuffix(".sock"),
                                deadline, share) is None:
                    return None
                session = _Server.session(path, preload, self.folder, deadline)
                if session is None:
                    self.unforkable[preload, environment] = "the shared server did not answer"
                    return None
        finally:
            os.close(lock)
        self.servers[environment].append(session)
        return session

    def _stop(self, server: _Server) -> None:
        for group in self.servers.values():
            if server in group:
                group.remove(server)
        server.stop()

    def alive(self) -> dict[int, tuple[Import, ...]]:
        """The servers running: pid -> preload."""
        return {s.pid: s.preload for group in self.servers.values() for s in group
                if s.alive()}

    def close(self) -> None:
        for server in [s for group in self.servers.values() for s in group]:
            self._stop(server)
        shutil.rmtree(self.folder, ignore_errors=True)
