"""A zygote: imports a rank program's frameworks once, then forks a rank per request.

Started by :func:`unifiedamp.conformance.engines.launch` as ``python -m
unifiedamp.conformance.engines._zygote`` with the ranks' environment, in an empty folder.
Why: a rank spends about half its CPU importing its framework (torch: 2.8 s of a 5.9 s
rank on two busy cores); a zygote pays that once for every rank of every later launch.

Protocol, one JSON object per line: the zygote reads ``{"preload": [module, ...]}`` on
stdin, imports the modules and answers ``{"ok": true}`` (or ``{"ok": false, "error":
...}`` and exits: the launcher then starts its ranks as plain interpreters, where the
error shows in the rank's log). Then, per rank, it reads ``{"module", "argv", "cwd",
"env", "log", "exit"}``, forks, answers ``{"pid": pid}``, and once that child has ended
writes its exit status (a negative number for a signal, as :class:`subprocess.Popen`
gives it) to the file ``exit`` (renamed into place: a reader never sees half of it). At
the end of its input it waits for its children and exits.

A child is what ``python -m module *argv`` would be, run from ``cwd`` with exactly the
environment ``env``, stdout and stderr written to ``log``, in a session of its own (the
launcher kills it with its process group), stdin ``/dev/null``: the module runs as
``__main__`` (:func:`runpy.run_module`), and the interpreter then finalizes as usual
(atexit handlers, threads, a crash at exit shows as the signal). What differs from a
fresh interpreter: the preloaded modules were imported before ``cwd`` was on ``sys.path``
and with the zygote's environment, so variables that a framework reads when imported must
be the same for every rank a zygote forks (the launcher keys its zygotes by the whole
environment); the hash seed of ``str`` is the zygote's. The zygote never computes: a
thread a computation started would be missing in its children.
"""

import gc
import json
import os
import select
import sys


def _reply(fd, message):
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _write_exit(path, status):
    with open(path + ".part", "w") as f:
        f.write(str(os.waitstatus_to_exitcode(status)))
    os.replace(path + ".part", path)


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


def _child(request, requests, reply):
    """In the forked child: becomes the rank; returns the module to run."""
    os.setsid()
    os.close(requests.fd)
    os.close(reply)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # as ``-m`` puts the cwd first
    sys.argv[:] = ["-m", *request["argv"]]  # runpy replaces argv[0] with the module's file
    return request["module"]


def serve():
    """Preloads, then forks per request; returns the module to run, in a child only."""
    requests = _Lines(os.dup(0))
    reply = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)  # what the imports print goes nowhere
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    config = json.loads(requests.readline() or "{}")
    try:
        for module in config.get("preload", []):
            __import__(module)
    except BaseException as exc:
        _reply(reply, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(0)
    # The children's collector then leaves the preloaded objects alone: it would write to
    # their pages, and copy them into every child.
    gc.freeze()
    _reply(reply, {"ok": True})
    children: dict[int, str] = {}  # pid: the file its exit status goes to
    open_input = True
    while open_input or children:
        if open_input:
            # A request is answered before the next is sent: nothing waits in ``rest``.
            ready, _, _ = select.select([requests.fd], [], [], 0.05)
            if ready:
                line = requests.readline()
                if not line:
                    open_input = False
                else:
                    request = json.loads(line)
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        return _child(request, requests, reply)
                    children[pid] = request["exit"]
                    _reply(reply, {"pid": pid})
            pid, status = os.waitpid(-1, os.WNOHANG) if children else (0, 0)
        else:
            pid, status = os.waitpid(-1, 0)
        while pid:
            _write_exit(children.pop(pid), status)
            pid, status = os.waitpid(-1, os.WNOHANG) if children else (0, 0)
    os._exit(0)


if __name__ == "__main__":
    import runpy

    # The module's globals stay referenced until the interpreter finalizes, as a ``-m``
    # module's do.
    _main_globals = runpy.run_module(serve(), run_name="__main__", alter_sys=True)
