"""``unifiedamp plot``: a scale history file drawn on a log axis, skipped steps marked: at step
n (the n-th update, from 1) the scale after it, as ``unifiedamp demo`` draws."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any


def _cmd_plot(args: argparse.Namespace) -> int:
    from unifiedamp.diagnostics import ScaleHistory, plot_history

    try:
        history = ScaleHistory.from_json(args.history)
    except OSError as exc:
        print(f"unifiedamp plot: cannot read {args.history!r}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"unifiedamp plot: {args.history!r} is {exc}", file=sys.stderr)
        return 2
    if not len(history):
        print(f"unifiedamp plot: {args.history!r} holds no update: write it after training, "
              "from a scaler built with history=N (e.g. history=1000)", file=sys.stderr)
        return 2
    if importlib.util.find_spec("matplotlib") is None:
        print("unifiedamp plot draws with matplotlib: pip install 'unifiedamp[demo]'",
              file=sys.stderr)
        return 2
    try:
        plot_history(history, args.output, title=args.title)
    except (OSError, ValueError) as exc:  # a missing folder, a format matplotlib lacks
        print(f"unifiedamp plot: cannot write {args.output!r}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {len(history)} updates (from {history.iterations[0]} to "
          f"{history.iterations[-1]}), {sum(history.skipped)} skipped, scale "
          f"{min(history.scales):g} to {max(history.scales):g}, {history.scales[-1]:g} after "
          "the last")
    return 0


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp plot HISTORY.json [-o IMAGE] [--title T]``."""
    p = sub.add_parser(
        "plot", help="draw a scale history (scaler.history().to_json(PATH)) on a log axis "
                     "with skipped steps marked",
        description="Draws a scale history file (ScaleHistory.to_json, or unifiedamp demo "
                    "--history DIR) as a step line on a log axis, the skipped steps marked: "
                    "at step n (the n-th update, from 1) the scale after that update. The "
                    "line starts at the oldest update the file holds (step 1 when the "
                    "history kept every update; the initial scale, before any update, is "
                    "not drawn) and ends at the last. Needs matplotlib "
                    "(pip install 'unifiedamp[demo]').",
        epilog="exit status: 0 when the plot was written; 2 when the file cannot be read, is "
               "not a history, holds no update, or the image cannot be written.")
    p.add_argument("history", metavar="HISTORY.json",
                   help="a file written by ScaleHistory.to_json (unifiedamp.diagnostics)")
    p.add_argument("-o", "--output", default="scale.png", metavar="IMAGE",
                   help="where to write the plot (default scale.png; the suffix picks the "
                        "format: .png, .svg, .pdf)")
    p.add_argument("--title", default=None, help="the plot's title")
    p.set_defaults(func=_cmd_plot)
