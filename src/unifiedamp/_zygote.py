"""A zygote: imports a child program's frameworks once, then forks a child per request.

Started by :mod:`unifiedamp._forks` as ``python -m unifiedamp._zygote`` with the
children's environment, in an empty folder. Why: a process that runs a framework spends
much of its CPU importing it (torch: 2.8 s of a 5.9 s rank of the engines, Keras 5.4 s of
reading a ``.keras`` file, on two busy cores); a zygote pays that once for every child.

Protocol, one JSON object per line: the zygote reads ``{"preload": [module, ...], "idle":
seconds}`` on stdin, imports the modules and answers ``{"ok": true}`` (or ``{"ok": false,
"error": ...}`` and exits: the caller then starts a plain interpreter, where the error
shows). Then, per child, it reads ``{"module"`` or ``"code", "argv", "cwd", "env",
"stdout", "stderr", "exit"}``, forks, answers ``{"pid": pid}``, and once that child has
ended writes its exit status (negative for a signal, as :class:`subprocess.Popen` gives
it) to the file ``exit`` (renamed into place: a reader never sees half of it). It exits at
the end of its input, or after ``idle`` seconds without a request or a child (its memory
is then given back; the caller starts another when needed), once its children have ended.

A child is what ``python -m module *argv`` (or ``python -c code *argv``) would be, run
from ``cwd`` with exactly the environment ``env``, stdout and stderr written to their files,
stdin ``/dev/null``, in a session of its own (so that a caller can kill it with its process
group): the module or code runs as ``__main__``, and the interpreter then finalizes as
usual (atexit handlers, threads, a crash at exit shows as the signal). What differs from a
fresh interpreter: the preloaded modules (and the zygote's own: json, select, gc, runpy,
unifiedamp._atomic_write) were imported before ``cwd`` was on ``sys.path`` and with the zygote's
environment, so a variable that a framework reads when imported must be the same for every
child of a zygote (callers key their zygotes by the whole environment); the hash seed of ``str`` is
the zygote's; the preloaded objects are frozen for the collector (:func:`gc.freeze`: it
would otherwise write to their memory pages, and so copy them into every child). The
zygote never computes: a thread that a computation started would be missing in its
children.
"""

import gc
import json
import os
import select
import sys
import time

from unifiedamp._atomic_write import write_bytes


def _reply(fd, message):
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _write_exit(path, status):
    # Atomic: a reader never sees half of it.
    write_bytes(path, str(os.waitstatus_to_exitcode(status)).encode())


class _Lines:
    """Lines from a file descriptor, unbuffered beyond the line asked for: ``select`` on
    the descriptor then says whether another line is coming."""

    def __init__(self, fd):
        self.fd, self.rest = fd, b""

    def readline(self):
        while b"\n" not in self.rest:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return ""
            self.rest += chunk
        line, self.rest = self.rest.split(b"\n", 1)
        return line.decode()


def _point(fd, path):
    new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(new, fd)
    os.close(new)


def _child(request, requests, reply):
    """In the forked child: becomes the program; returns what to run."""
    os.setsid()
    os.close(requests.fd)
    os.close(reply)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _point(1, request["stdout"])
    if request["stderr"] == request["stdout"]:
        os.dup2(1, 2)
    else:
        _point(2, request["stderr"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "module" in request:
        sys.path[0] = request["cwd"]  # as ``-m`` puts the cwd first
        sys.argv[:] = ["-m", *request["argv"]]  # runpy puts the module's file in argv[0]
        return "module", request["module"]
    sys.path[0] = ""  # as ``-c`` does
    sys.argv[:] = ["-c", *request["argv"]]
    return "code", request["code"]


def serve():
    """Preloads, then forks per request; returns what to run, in a child only."""
    requests = _Lines(os.dup(0))
    reply = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)  # what the imports print goes nowhere
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    config = json.loads(requests.readline() or "{}")
    # The collector is paused while the frameworks import (about a fifth of TensorFlow's
    # import is collections that find next to nothing); what they made is then frozen.
    gc.disable()
    try:
        for module in config.get("preload", []):
            __import__(module)
    except BaseException as exc:
        _reply(reply, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(0)
    gc.enable()
    gc.freeze()
    _reply(reply, {"ok": True})
    idle = config.get("idle", 60.0)
    children: dict[int, str] = {}  # pid: the file its exit status goes to
    last = time.monotonic()
    while children or time.monotonic() - last < idle:
        # A request is answered before the next is sent: nothing waits in ``rest``.
        ready, _, _ = select.select([requests.fd], [], [], 0.05)
        if ready:
            line = requests.readline()
            if not line:
                break
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return _child(request, requests, reply)
            children[pid] = request["exit"]
            _reply(reply, {"pid": pid})
        pid, status = os.waitpid(-1, os.WNOHANG) if children else (0, 0)
        while pid:
            _write_exit(children.pop(pid), status)
            pid, status = os.waitpid(-1, os.WNOHANG) if children else (0, 0)
        if children:
            last = time.monotonic()
    while children:
        pid, status = os.waitpid(-1, 0)
        _write_exit(children.pop(pid), status)
    os._exit(0)


if __name__ == "__main__":
    _kind, _what = serve()
    if _kind == "module":
        import runpy

        # The module's globals stay referenced until the interpreter finalizes, as a
        # ``-m`` module's do.
        _main_globals = runpy.run_module(_what, run_name="__main__", alter_sys=True)
    else:
        import types

        _main = sys.modules["__main__"] = types.ModuleType("__main__")
        _main.__dict__["__builtins__"] = __builtins__
        exec(compile(_what, "<string>", "exec", dont_inherit=True), _main.__dict__)
