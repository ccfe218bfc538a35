"""``unifiedamp port``: rewrite a source file's loss-scaler constructors for another framework.

The rewriting is :func:`unifiedamp.porting.port_source`; this module reads the file (or
standard input), writes the result where asked (atomically), and turns the result's problems
into lines on stderr and the exit status.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from unifiedamp import _atomic_write
from unifiedamp.porting import TARGETS, port_source
from unifiedamp.porting._config import _check_version


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp port`` to the ``unifiedamp`` parser."""
    p = sub.add_parser(
        "port", help="rewrite a source file's loss-scaler constructors for another framework",
        description="Rewrites every native loss-scaler constructor (torch, paddle, Keras, jmp) "
                    "in a Python file for unifiedamp or another framework's native scaler, "
                    "every value explicit, and the scaler's method calls where the mapping is "
                    "exact. Everything else in the file is kept byte for byte.",
        epilog="exit status: 0 when the target expresses everything (also for a file with no "
               "scaler at all: a note says so); 1 when a problem was reported (one line per "
               "problem, on stderr, or in the --check plan), a scaler class port cannot follow "
               "to the call that builds it included (used as a value, as in scaler_type = "
               "GradScaler; looked up with getattr; imported and never used); 2 for an "
               "error that stops it, with nothing written (a file that does not exist, is not "
               "UTF-8 Python source, does not parse or nests too deeply; a bad --from-version, or "
               "a bare one that is ambiguous for a tf.keras call; "
               "-o into a missing folder or onto a directory; a write that fails: the target "
               "is left as it was). Writes go to a temp file renamed over the target.")
    p.add_argument("file", help="the Python file, or - for standard input")
    p.add_argument("--to", required=True, choices=TARGETS, help="the target")
    p.add_argument("--from-version", metavar="V", default=None, type=_version_arg,
                   help="the source framework's version where its defaults depend on it, as "
                        "FRAMEWORK=VERSION (tensorflow=2.15, keras=2, paddle=2.6, torch=2.3) or "
                        "a bare version (paddle 2.x: 32768 / 1000 / 2, 3.x: 65536 / 2000 / 1; "
                        "tf.keras: tf-keras 2 up to tensorflow 2.15, Keras 3 from 2.16, so a "
                        "bare 2.16 or later is ambiguous and refused); default: for tf.keras "
                        "what the file says (tf_keras, tf.compat.v1, keras.ops...), else the "
                        "installed version"),
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="print the plan (each call site, before and after, notes and "
                           "problems); write nothing")
    mode.add_argument("--diff", action="store_true", help="print a unified diff")
    mode.add_argument("-o", "--output", metavar="OUT", help="write the result to OUT")
    mode.add_argument("--in-place", action="store_true", help="rewrite FILE itself")
    p.set_defaults(func=_cmd_port)


def _version_arg(value: str) -> str:
    try:
        _check_version(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _emit(text: str) -> None:
    """Writes ``text`` to stdout as UTF-8 bytes: a BOM and ``\\r\\n`` as they are."""
    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write(text.encode("utf-8"))
        out.flush()


def _error(message: str) -> int:
    print(f"unifiedamp port: {message}", file=sys.stderr)
    return 2


def _cmd_port(args: argparse.Namespace) -> int:
    name = "<stdin>" if args.file == "-" else args.file
    if args.in_place and args.file == "-":
        return _error("--in-place needs a file, not -")
    try:
        if args.file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as f:
                data = f.read()
        result = port_source(data, args.to, args.from_version, filename=name)
    except OSError as exc:
        return _error(f"{name}: {exc.strerror or exc}")
    except SyntaxError as exc:
        where = ":".join(str(p) for p in (name, exc.lineno, exc.offset) if p is not None)
        return _error(f"{where}: {exc.msg}")
    except (ImportError, ValueError) as exc:  # ValueError: a --from-version to say clearer
        return _error(str(exc))
    if args.check:
        _emit(result.plan(name))
        return 0 if result.ok else 1
    if args.diff:
        _emit(result.diff(name))
    elif args.output or args.in_place:
        target = args.output or args.file
        try:
            _atomic_write.write_bytes(target, result.code.encode("utf-8"))
        except OSError as exc:
            # A missing folder or a directory (the message names it), or a failed write
            # (a full disk, a file-size limit): the target is as it was.
            return _error(str(exc) if exc.strerror is None else
                          f"cannot write {target}: {exc.strerror} (nothing was written)")
    else:
        _emit(result.code)
    if not any(s.kind == "constructor" for s in result.sites):
        print(f"{name}: no native loss-scaler constructor call found", file=sys.stderr)
    for problem in result.problems:
        print(f"{name}:{problem.removeprefix('line ').replace(': ', ': problem: ', 1)}",
              file=sys.stderr)
    return 0 if result.ok else 1
