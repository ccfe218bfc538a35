"""``unifiedamp port-state``: convert the scaler state inside a checkpoint file to another
framework's form (:func:`unifiedamp.porting.port_state_file`), and print what was read and
written."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from unifiedamp import spec
from unifiedamp.porting import FORMS, port_state_file
from unifiedamp.porting._checkpoints import _plain
from unifiedamp.spec import ScalerConfig


def _summary(r: dict[str, Any]) -> str:
    where = f"entry {r['key']!r}" if r["key"] is not None else "the whole file"
    st = r["state"]
    lines = [f"read {r['src']}: {where}, {r['from']} form",
             f"  scale {st['scale']!r} ({spec.f32_hex(st['scale'])}), growth_tracker "
             f"{st['growth_tracker']}, hysteresis_tracker {st['hysteresis_tracker']}",
             f"  config {json.dumps(r['config'])}"]
    if r["dst"] is None:
        lines.append(f"{r['to']} form (not written: pass -o OUT or --in-place):")
        lines.append("  " + json.dumps(r["state_dict"], default=_plain))
    else:
        rest = "the rest of the checkpoint kept" if r["whole"] else "the scaler state alone"
        lines.append(f"wrote {r['dst']}: {r['to']} form, {rest}")
    if r["to"] == "keras":
        lines.append("  keras form: the optimizer's variables; build the optimizer with the "
                     "config above (ua.GradScaler(**config, backend='keras').wrap(opt))")
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    try:
        config = ScalerConfig(**json.loads(args.config)) if args.config else None
        dst = args.output
        in_place = args.in_place or (dst is not None
                                     and os.path.abspath(dst) == os.path.abspath(args.input))
        report = port_state_file(args.input, None if in_place else dst, to=args.to,
                                 key=args.key, config=config, in_place=in_place,
                                 trusted=args.trust)
    except (ValueError, TypeError, OSError) as exc:
        print(f"unifiedamp port-state: error: {exc}", file=sys.stderr)
        return 2
    print(_summary(report))
    return 0


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp port-state IN --to FORM [-o OUT] [--key KEY]``."""
    p = sub.add_parser(
        "port-state", help="convert a scaler state inside a checkpoint file to another form",
        description="Finds the scaler state in a checkpoint (torch.save / Lightning .ckpt, "
                    "paddle .pdparams/.pdopt, .json, flax .msgpack, .npz, Keras .keras) and "
                    "converts it to another framework's form.")
    p.add_argument("input", help="the checkpoint file")
    p.add_argument("--to", required=True, choices=FORMS, help="the form to write")
    p.add_argument("-o", "--output", help="where to write (the same file: in place); "
                                          "omitted: print the result only")
    p.add_argument("--in-place", action="store_true", help="rewrite the input file")
    p.add_argument("--key", help="the checkpoint entry that holds the scaler state "
                                 "(default: found: Lightning's 'MixedPrecision', ...)")
    p.add_argument("--config", help="JSON of the parameters the input form does not carry, "
                                    "e.g. '{\"growth_interval\": 100}' for Keras variables")
    p.add_argument("--trust", action="store_true",
                   help="run the file's own code if it asks to: unpickle torch and paddle "
                        "files in full (arbitrary objects, any code the file names) and "
                        "load .keras models with safe_mode=False (Lambda layers); without "
                        "it no file runs code, and a file that needs this is refused")
    p.set_defaults(func=_cmd)
