"""The ``unifiedamp`` command: ``backends``, ``spec``, ``conformance``, ``plot``, ``port``,
``port-state`` and ``demo``, one module of this package each.

Each subcommand's module adds its parser (``add_parser``) and runs it; this module holds
:func:`main`, the console script's entry point (``python -m unifiedamp.cli`` runs it too).
Anything that imports a framework runs in a subprocess of its own, one per backend
(``conformance`` runs the shipped pytest suite there), so that frameworks that cannot share
a process (tensorflow then paddle segfaults) never do, and a crash in one backend is
reported, not fatal.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

from unifiedamp import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    # The subcommands are imported here, when the command runs: ``_worker`` (a backend's
    # subprocess) and the demo's child process import this package without them.
    from unifiedamp.cli import backends, conformance, demo, plot, port, port_state, spec

    parser = argparse.ArgumentParser(
        prog="unifiedamp", description="One dynamic loss scaler for every framework.")
    parser.add_argument("--version", action="version", version=f"unifiedamp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of these (unifiedamp COMMAND --help says more):")
    for command in (backends, spec, conformance, plot, port, port_state, demo):
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``unifiedamp`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        return _worker(argv[1:])
    args = _parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe must fail here, not in the interpreter's exit
    except BrokenPipeError:
        # The reader went away (`unifiedamp backends --json | head`): stop quietly,
        # and keep Python from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (MemoryError, RecursionError) as exc:
        # Bounded inputs should never get here; if one does, say so in one line.
        what = ("more memory than this process could get" if isinstance(exc, MemoryError)
                else "input nested deeper than Python's recursion limit")
        print(f"unifiedamp {args.command}: error: {what} ({type(exc).__name__}); nothing "
              "was written", file=sys.stderr)
        return 2
    return code


def _worker(argv: list[str]) -> int:
    """``unifiedamp _worker NAME``: the subprocess of ``unifiedamp backends`` for one
    backend; prints its report as one JSON line."""
    from unifiedamp import _registry

    if len(argv) != 1 or argv[0] not in _registry.available():
        print(f"unifiedamp _worker: error: takes one backend name, one of "
              f"{sorted(_registry.available())}, got {argv} (it is the subprocess of "
              "`unifiedamp backends`: run that instead)", file=sys.stderr)
        return 2
    # A process that imports one framework and exits: the collector would spend about
    # a fifth of TensorFlow's import looking for garbage that dies with the process.
    gc.disable()
    from unifiedamp.cli.backends import worker

    print(json.dumps(worker(argv[0])))
    return 0
