"""The fork server's own process (tests/_forkserver.py starts it and says why it exists).

Started as ``python -c BOOT REQUEST_FD REPLY_FD``, where BOOT executes this file in a
namespace of its own, so ``__main__`` stays the bare module a ``python -c`` script starts
in. It uses only modules every interpreter has loaded before running a script (os, sys,
marshal), so the forked scripts see no module of the server's in ``sys.modules`` (a shared
server's ``_socket`` and ``fcntl`` are taken out of it in each session).

Protocol (each message is an 8-byte length, then a marshal dump):

1. the client sends ``{"preload": [[module, fromlist], ...], "out": path, "err": path,
   "log": path}``; the server imports the modules as the import statements they come from
   would (binding no name), with file descriptors 1 and 2 written to the files ``out`` and
   ``err`` (what the imports print is replayed at the start of every script), then points
   them at ``log`` and replies ``{"ok": True, "done": n}`` or ``{"ok": False, "error":
   text}``; it stops after the first n imports when the others would only bind names
   (``import keras`` imports numpy and tensorflow too);
2. for each script, the client sends ``{"code", "args", "cwd", "env", "out", "err", "argv0"}`` (out
   and err: FIFOs the client reads); the server opens the FIFOs, forks and replies
   ``{"pid": pid}``, then ``{"returncode": n}`` when the child has exited;
3. ``{"imported": [[module, fromlist], ...]}`` asks whether those imports would only bind
   names in this process (:func:`_imported`): the reply is ``{"imported": bool}``;
4. at end of input the server exits.

Shared (``"listen": path`` in the first message, with ``"lock"`` and ``"idle"``): the
server answers step 1 once it listens on the Unix socket ``path``, closes the pipes and
forks; the first process exits (its client reaps it) and the fork accepts connections,
forking a *session* per connection, which sends ``{"ok": True, "done": n, "seconds": s,
"pid": pid}`` and then serves steps 2 to 4 on the connection as above. The server exits
when it has had no session for ``idle`` seconds, removing ``path`` while it holds the
``lock`` file, which clients hold while they look for a server or start one.

The child closes the server's descriptors, takes the FIFOs as its stdout and stderr,
replays the import output, moves to ``cwd``, sets ``os.environ`` to ``env`` and
``sys.argv`` to ``["-c", *args]``, and returns from the loop to run the script in ``__main__``
as the interpreter runs a ``-c`` command; the interpreter then finalizes as usual.
"""

import marshal
import os
import sys


def _read_exact(fd, n):
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd):
    header = _read_exact(fd, 8)
    if header is None:
        return None
    body = _read_exact(fd, int.from_bytes(header, "little"))
    return None if body is None else marshal.loads(body)


def _send(fd, message):
    data = marshal.dumps(message)
    data = len(data).to_bytes(8, "little") + data
    while data:
        data = data[os.write(fd, data):]


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _point(fd, path, flags):
    new = os.open(path, flags, 0o600)
    os.dup2(new, fd)
    os.close(new)


def _flush_std():
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except Exception:  # a stream a framework replaced or closed: nothing to keep
                pass


def _preload(request_fd, reply_fd):
    """Runs the imports; returns the bytes they wrote to stdout and stderr."""
    config = _receive(request_fd)
    if config is None:
        os._exit(0)
    write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    _point(1, config["out"], write)
    _point(2, config["err"], write)
    imports, done, began = config["preload"], 0, os.times().elapsed
    # The collector is paused while the frameworks import (a fifth of TensorFlow's import
    # is collections that find next to nothing), then frozen (below). gc leaves
    # sys.modules as the imports make it.
    imported_gc = "gc" in sys.modules
    gc = __import__("gc")
    if not imported_gc:
        del sys.modules["gc"]
    gc.disable()
    try:
        while done < len(imports):
            module, fromlist = imports[done]
            # What the import statement does, less binding names in __main__ (the script's
            # own statements bind them, so a name it never imports stays undefined).
            __import__(module, None, None, fromlist or (), 0)
            done += 1
            if _imported(imports[done:]):  # the rest would only bind names: same state
                break
    except BaseException as exc:  # the client runs such scripts in plain interpreters
        _flush_std()
        _send(reply_fd, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(0)
    _flush_std()
    captured = []
    for path in (config["out"], config["err"]):
        with open(path, "rb") as file:
            captured.append(file.read())
    _point(1, config["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(1, 2)
    # The children's collector then leaves the preloaded objects alone: it would write to
    # their pages, and copy them into every child.
    gc.enable()
    gc.freeze()
    config.update(done=done, seconds=os.times().elapsed - began)
    if "listen" not in config:
        _send(reply_fd, {"ok": True, "done": done})
    return captured, config


def _reseed_in_child():
    # A fresh interpreter seeds numpy's global generator from the OS at import; the children
    # of one server would otherwise share the server's draw (random reseeds itself at fork).
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None and hasattr(numpy_random, "seed"):
        numpy_random.seed()


def _imported(imports):
    """Whether these (module, fromlist) imports would only bind names here: each module and
    its parents are imported, and each name of a fromlist is an attribute already."""
    for module, fromlist in imports:
        parts = module.split(".")
        if any(".".join(parts[:i]) not in sys.modules for i in range(1, len(parts) + 1)):
            return False
        namespace = getattr(sys.modules[module], "__dict__", {})
        if any(name == "*" or name not in namespace for name in fromlist or ()):
            return False
    return True


def _serve(request_fd, reply_fd):
    """Forks a child per request; returns the script's code, in the child only."""
    (out, err), config = _preload(request_fd, reply_fd)
    if "listen" in config:
        request_fd = reply_fd = _share(config, request_fd, reply_fd)
    while True:
        request = _receive(request_fd)
        if request is None:
            os._exit(0)
        if "imported" in request:
            _send(reply_fd, {"imported": _imported(request["imported"])})
            continue
        child_out = os.open(request["out"], os.O_WRONLY)
        child_err = os.open(request["err"], os.O_WRONLY)
        _flush_std()
        pid = os.fork()
        if pid == 0:
            for fd in {request_fd, reply_fd}:
                os.close(fd)
            os.dup2(child_out, 1)
            os.dup2(child_err, 2)
            os.close(child_out)
            os.close(child_err)
            _write_all(1, out)
            _write_all(2, err)
            try:
                os.chdir(request["cwd"])
            except OSError as exc:
                _write_all(2, f"fork server: cannot enter {request['cwd']}: {exc}\n".encode())
                os._exit(255)
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv[:] = ["-c", *request["args"]]
            sys.orig_argv[:] = [request["argv0"], "-c", request["code"], *request["args"]]
            _reseed_in_child()
            return request["code"]
        os.close(child_out)
        os.close(child_err)
        _send(reply_fd, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(reply_fd, {"returncode": os.waitstatus_to_exitcode(status)})


def _share(config, request_fd, reply_fd):
    """Shared mode (see the protocol above): accepts connections until idle; returns a
    session's connection, in the session only."""
    # Modules the scripts would not see in a plain interpreter: a session removes them
    # from sys.modules again (as _preload does for gc).
    unseen = [name for name in ("_socket", "fcntl") if name not in sys.modules]
    import _socket
    import fcntl

    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    listener.bind(config["listen"])
    listener.listen(64)
    _send(reply_fd, {"ok": True, "done": config["done"]})
    os.close(request_fd)
    os.close(reply_fd)
    if os.fork():  # the client waits for this process; the server goes on in the fork
        os._exit(0)
    sessions, idle_since = set(), os.times().elapsed
    while True:
        for pid in [pid for pid in sessions if os.waitpid(pid, os.WNOHANG)[0]]:
            sessions.discard(pid)
        if sessions:
            idle_since = os.times().elapsed
        fd = None
        if not sessions and os.times().elapsed - idle_since > config["idle"]:
            lock = os.open(config["lock"], os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a client is looking: it may connect, so go on serving
                os.close(lock)
            else:
                # No client can connect while this process holds the lock: one that
                # connected before is served; otherwise no one is left to serve.
                listener.setblocking(False)
                try:
                    fd, _ = listener._accept()
                except BlockingIOError:
                    os.unlink(config["listen"])
                    os._exit(0)
                os.close(lock)
        if fd is None:
            listener.settimeout(0.5)
            try:
                fd, _ = listener._accept()
            except TimeoutError:
                continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            for name in unseen:
                del sys.modules[name]
            os.set_blocking(fd, True)
            _send(fd, {"ok": True, "done": config["done"], "seconds": config["seconds"],
                       "pid": os.getpid()})
            return fd
        os.close(fd)
        sessions.add(pid)


def _print_exception(exc, traceback):
    """What the interpreter does with an exception a ``-c`` command did not catch."""
    kind = type(exc)
    exc.__traceback__ = traceback
    sys.last_type, sys.last_value, sys.last_traceback = kind, exc, traceback
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    try:
        sys.excepthook(kind, exc, traceback)
    except SystemExit:
        raise
    except BaseException as hook_error:
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(kind, exc, traceback)


def _run_as_main(code):
    main = sys.modules["__main__"]
    try:
        exec(compile(code, "<string>", "exec", dont_inherit=True), main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise  # the interpreter exits as for the command: a code, or by SIGINT
    except BaseException as exc:
        # The command's own frames only, as the interpreter prints them.
        _print_exception(exc, exc.__traceback__.tb_next)
        failed = True
    else:
        failed = False
    if failed:
        raise SystemExit(1)


if __name__ == "__forkserver__":
    _fds = [int(arg) for arg in sys.argv[1:3]]
    sys.argv[:] = ["-c"]  # as the scripts see it, their imports included
    _run_as_main(_serve(*_fds))
