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
from unifiedamp.porting import FORMS, ReadLimits, port_state_file
from unifiedamp.porting._checkpoints import _plain
from unifiedamp.spec import ALIASES, CANONICAL, ScalerConfig, config_from_args


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
    lines += [f"  note: {note}" for note in r.get("notes", ())]
    return "\n".join(lines)


def _config(text: str | None) -> tuple[ScalerConfig | None, set[str]]:
    """``--config``'s JSON: the config, and the fields it names (canonical names)."""
    if not text:
        return None, set()
    try:
        given = json.loads(text)
    except RecursionError:
        raise ValueError("--config is nested deeper than Python's recursion limit: it takes "
                         "a flat JSON object, e.g. '{\"growth_interval\": 100}'") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config is not JSON ({exc}): it takes a JSON object, e.g. "
                         "'{\"growth_interval\": 100}'") from None
    if not isinstance(given, dict):
        raise ValueError(f"--config takes a JSON object of scaler parameters, e.g. "
                         f"'{{\"growth_interval\": 100}}', not {type(given).__name__}")
    config = config_from_args((), given)
    return config, {key if key in CANONICAL else str(ALIASES.get(key) or key) for key in given}


def _limits(pairs: list[str]) -> ReadLimits:
    values: dict[str, int] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in ReadLimits._fields:
            raise ValueError(f"--limit {pair}: no cap named {name!r}; the caps are "
                             f"{', '.join(ReadLimits._fields)} (NAME=N)")
        try:
            values[name] = int(value)
        except ValueError:
            raise ValueError(f"--limit {pair}: {value!r} is not a whole number; "
                             f"write --limit {name}=N") from None
    return ReadLimits(**values)


def _cmd(args: argparse.Namespace) -> int:
    try:
        if args.in_place and args.output is not None:
            raise ValueError(f"--in-place rewrites {args.input}, and -o {args.output} names "
                             "a file to write: give one of them; nothing was written")
        config, named = _config(args.config)
        limits = _limits(args.limit)
        dst = args.output
        in_place = args.in_place or (dst is not None
                                     and os.path.abspath(dst) == os.path.abspath(args.input))
        report = port_state_file(args.input, None if in_place else dst, to=args.to,
                                 key=args.key, config=config, in_place=in_place,
                                 trusted=args.trust, limits=limits, config_fields=named)
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        # MemoryError and RecursionError: load_file and save_file name the file in a
        # ValueError; anything else ends in unifiedamp's main, in one line.
        print(f"unifiedamp port-state: error: {str(exc) or type(exc).__name__}",
              file=sys.stderr)
        return 2
    print(_summary(report))
    return 0


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp port-state IN --to FORM [-o OUT] [--key KEY]``."""
    p = sub.add_parser(
        "port-state", help="convert a scaler state inside a checkpoint file to another form",
        description="Finds the scaler state in a checkpoint (torch.save / Lightning .ckpt, "
                    "paddle .pdparams/.pdopt, .json, flax .msgpack, .npz, Keras .keras, an "
                    "Orbax folder) and converts it to another framework's form (flax: "
                    "DynamicScale's scale and fin_steps).")
    p.add_argument("input", help="the checkpoint file (or Orbax checkpoint folder)")
    p.add_argument("--to", required=True, choices=FORMS, help="the form to write")
    p.add_argument("-o", "--output", help="where to write (the same file: in place; a new "
                                          "path without an extension: an Orbax folder); "
                                          "omitted: print the result only")
    p.add_argument("--in-place", action="store_true",
                   help="rewrite the input file (not with -o)")
    p.add_argument("--key", help="the checkpoint entry that holds the scaler state "
                                 "(default: found: Lightning's 'MixedPrecision', ...)")
    p.add_argument("--config", help="JSON of the parameters the input form does not carry, "
                                    "e.g. '{\"growth_interval\": 100}' for Keras variables")
    p.add_argument("--trust", action="store_true",
                   help="run the file's own code if it asks to, and lift the --limit caps: "
                        "torch files (.pt/.pth/.ckpt/.bin/.tar) load with "
                        "torch.load(weights_only=False), paddle files (.pdparams/.pdopt/"
                        ".pdckpt) with paddle.load, both full unpickles that call any "
                        "function the file names; .npz object arrays are unpickled "
                        "(np.load(allow_pickle=True)); .keras models load with "
                        "safe_mode=False (Lambda layers' code); .json and .msgpack run no "
                        "code either way. Without it no file runs code, and a file that "
                        "needs this is refused")
    p.add_argument("--limit", action="append", default=[], metavar="NAME=N",
                   help="raise a cap on the work of reading an untrusted file (repeatable): "
                        + ", ".join(f"{k} (default {v:,})" for k, v in
                                    ReadLimits()._asdict().items()))
    p.set_defaults(func=_cmd)
