"""``unifiedamp demo``: the same small float16 model trained in every installed framework,
one shared scaler config, overflows forced at fixed steps, the scale trajectories compared
with the spec's reference bit for bit and drawn on one chart.

Each framework trains in a child process of its own (``python -m
unifiedamp.cli._demo_train NAME STEPS``, where the training loops are), as ``unifiedamp
conformance`` does, because some frameworks cannot share a process (tensorflow then paddle
segfaults). The child prints one JSON line per step; this module, the parent, holds the
scenario (:data:`CONFIG`, the forced overflows, the spec's :func:`reference`), shows the
progress (on a terminal), compares, plots (matplotlib, the ``demo`` extra) and prints the
summary. ``docs/demo.md`` describes the output.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from unifiedamp import _registry, spec
from unifiedamp.cli._shared import (
    Progress,
    add_progress_option,
    is_installed,
    print_table,
    progress_wanted,
)
from unifiedamp.diagnostics import _draw_scale, _image_path_error, _save_figure

__all__ = ["BACKENDS", "CONFIG", "OVERFLOW_STEPS", "PERIOD", "demo_report", "expected_history",
           "first_divergence", "forced_overflow", "reference"]

#: The one config every framework trains with: within 40 steps it grows (every 4 finite
#: steps), holds one overflow (hysteresis 2), backs off after two, and is capped at 2**13
#: so that float16 gradients never overflow on their own, whatever ``--steps`` is.
CONFIG: dict[str, Any] = {"init_scale": 2.0**10, "growth_interval": 4, "hysteresis": 2,
                          "min_scale": 1.0, "max_scale": 2.0**13}

#: Steps (updates, counted from 1) whose input batch holds an inf (the pattern repeats every
#: ``PERIOD`` steps): a lone one (hysteresis absorbs it), a pair (one backoff), a run of six
#: (three backoffs).
OVERFLOW_STEPS = (10, 15, 16, 23, 24, 25, 26, 27, 28, 36)
PERIOD = 40

#: The frameworks the demo knows how to train, in the order they run and are listed.
BACKENDS = ("numpy", "torch", "paddle", "keras", "jax", "mlx")

_CHILD_TIMEOUT_S = 600
_MAX_STEPS = 10_000


def forced_overflow(step: int) -> bool:
    """Whether the demo puts an inf into the input batch of ``step``: the update it makes,
    counted from 1, as everywhere in the demo (``docs/diagnostics.md``, "Steps and scales").

    Example:
        >>> [s for s in range(1, 17) if forced_overflow(s)], forced_overflow(50)
        ([10, 15, 16], True)
    """
    return (step - 1) % PERIOD + 1 in OVERFLOW_STEPS


def reference(steps: int) -> list[spec.ScalerState]:
    """The spec's state after each step's update, for the demo's config and overflows:
    ``reference(n)[k]`` is the state after step ``k + 1``.

    Example:
        >>> [s.scale for s in reference(16)][2:5]  # after steps 3, 4 and 5
        [1024.0, 2048.0, 2048.0]
        >>> reference(16)[10 - 1]  # step 10, the lone overflow: held by hysteresis
        ScalerState(scale=4096.0, growth_tracker=0, hysteresis_tracker=1)
    """
    config = spec.ScalerConfig(**CONFIG)
    state, out = spec.ScalerState.initial(config), []
    for step in range(1, steps + 1):
        state = spec.update(config, state, forced_overflow(step))
        out.append(state)
    return out


def first_divergence(records: list[dict[str, Any]], steps: int) -> dict[str, Any] | None:
    """The first step (from 1) where a child's records differ from :func:`reference` (scale
    bits, both trackers, whether the step was skipped), or ``None`` when all ``steps`` match.

    Example:
        >>> records = [{"scale_hex": spec.f32_hex(s.scale), "growth_tracker": s.growth_tracker,
        ...             "hysteresis_tracker": s.hysteresis_tracker,
        ...             "skipped": forced_overflow(k)} for k, s in enumerate(reference(12), 1)]
        >>> first_divergence(records, 12) is None
        True
        >>> records[10 - 1]["skipped"] = False
        >>> first_divergence(records, 12)["step"]
        10
        >>> first_divergence(records[:5], 12)["got"]
        'no record (the run stopped after 5 steps)'
    """
    for step, want in enumerate(reference(steps), start=1):
        expected = {"scale_hex": spec.f32_hex(want.scale), "growth_tracker": want.growth_tracker,
                    "hysteresis_tracker": want.hysteresis_tracker,
                    "skipped": forced_overflow(step)}
        if step > len(records):
            return {"step": step, "expected": expected,
                    "got": f"no record (the run stopped after {len(records)} steps)"}
        got = {key: records[step - 1][key] for key in expected}
        if got != expected:
            return {"step": step, "expected": expected, "got": got}
    return None


def _found(name: str) -> bool:
    """Whether a backend's framework is installed, without importing it."""
    return is_installed(_registry.BUILTIN[name].modules[0])


def _run_child(name: str, steps: int, progress: Progress | None = None) -> dict[str, Any]:
    """Runs one backend's child (its steps done go to ``progress``); its header, records
    and status."""
    start = time.monotonic()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = [sys.executable, "-m", "unifiedamp.cli._demo_train", name, str(steps)]
    result: dict[str, Any] = {"status": "ok", "records": []}
    # stderr to a file, not a pipe: a chatty framework would fill a pipe nobody reads
    # while stdout is read line by line, and both processes would wait for ever.
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        timed_out = threading.Event()

        def stop() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(_CHILD_TIMEOUT_S, stop)
        timer.start()
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                if not line.startswith("{"):
                    continue  # a framework printing to stdout
                row = json.loads(line)
                if "step" in row:
                    result["records"].append(row)
                    if progress is not None:
                        progress.note(name, f"{len(result['records'])}/{steps} steps")
                else:
                    result.update(row)
            proc.wait()
        finally:
            timer.cancel()
        err.seek(0)
        lines = err.read().strip().splitlines()
    result["seconds"] = round(time.monotonic() - start, 1)
    if proc.returncode != 0:
        why = f"timed out after {_CHILD_TIMEOUT_S} s" if timed_out.is_set() else "exited with"
        result.update(status="error", detail=f"child {why} {proc.returncode}: "
                                             f"{lines[-1] if lines else 'no output'}")
    return result


def expected_history(records: list[dict[str, Any]]) -> list[list[Any]]:
    """What a scaler's history ring must hold after the steps of ``records``: per update,
    its number from 1, the scale it left and whether it was skipped; the records' own
    (step, scale, skipped), one convention for both.

    Example:
        >>> expected_history([{"step": 1, "scale": 512.0, "skipped": True},
        ...                   {"step": 2, "scale": 512.0, "skipped": False}])
        [[1, 512.0, True], [2, 512.0, False]]
    """
    return [[r["step"], r["scale"], r["skipped"]] for r in records]


def demo_report(names: list[str] | None = None, steps: int = PERIOD,
                show_progress: bool = False) -> dict[str, Any]:
    """Trains every backend in ``names`` (default: every one installed) for ``steps`` steps,
    each in its own process, and compares each trajectory with :func:`reference`.

    A backend named in ``names`` that is not installed fails the report; with ``names=None``
    it is only listed in ``not_run``.

    Each child also returns its scaler's history ring (``history()``; JAX and MLX:
    ``history_record`` in the step), which must equal :func:`expected_history`.

    Example:
        >>> report = demo_report(["numpy"], steps=12)
        >>> report["passed"], report["backends"]["numpy"]["matches_spec"]
        (True, True)
        >>> report["backends"]["numpy"]["history_matches"]
        True
    """
    requested = names is not None
    names = list(BACKENDS) if names is None else list(dict.fromkeys(names))
    backends: dict[str, Any] = {}
    found = [name for name in names if _found(name)]
    with Progress("demo", found, enabled=show_progress) as progress:
        for name in names:
            if name not in found:
                backends[name] = {"status": "not installed",
                                  "detail": _registry.BUILTIN[name].install}
                continue
            progress.start(name)
            progress.note(name, "starting")
            result = _run_child(name, steps, progress)
            records = result["records"]
            diverged = first_divergence(records, steps)
            result.update(matches_spec=result["status"] == "ok" and diverged is None,
                          history_matches=result.get("history") == expected_history(records),
                          first_divergence=diverged,
                          skips=sum(r["skipped"] for r in records),
                          final_scale=records[-1]["scale"] if records else None)
            backends[name] = result
            progress.finish(name, _outcome(result, steps))
    not_run = [n for n, r in backends.items() if r["status"] == "not installed"]
    passed = all(r.get("matches_spec", False) and r.get("history_matches", False)
                 for n, r in backends.items() if n not in not_run)
    return {"config": CONFIG,
            "overflow_steps": [s for s in range(1, steps + 1) if forced_overflow(s)],
            "steps": steps, "passed": passed and not (requested and not_run),
            "not_run": not_run, "backends": backends}


def _outcome(result: dict[str, Any], steps: int) -> str:
    """How a backend's run ended, for its progress line."""
    if result["status"] != "ok":
        return f"error after {len(result['records'])}/{steps} steps"
    d = result["first_divergence"]
    spec_ = "matches the spec" if d is None else f"DIVERGES from the spec at step {d['step']}"
    history = "" if result["history_matches"] else ", its history() DIFFERS"
    return f"{len(result['records'])} steps, {result['skips']} skipped, {spec_}{history}"


_STYLES = [  # widest first, so that every line of a perfect overlap still shows
    {"color": "tab:blue", "linewidth": 9, "alpha": 0.35},
    {"color": "tab:orange", "linewidth": 6.5, "alpha": 0.5},
    {"color": "tab:green", "linewidth": 4.5, "linestyle": "--"},
    {"color": "tab:red", "linewidth": 3, "linestyle": "-."},
    {"color": "tab:purple", "linewidth": 2, "linestyle": ":"},
    {"color": "tab:brown", "linewidth": 1, "linestyle": "-"},
]
_MARKERS = ["o", "s", "D", "^", "v", "x"]


def _plot(report: dict[str, Any], path: str) -> None:
    _save_figure(_figure(report), path, dpi=110)


def _figure(report: dict[str, Any]) -> Any:
    """The demo's chart: per framework, at step n (the n-th update, from 1) the scale after
    it, from the initial scale at step 0 (as ``unifiedamp plot`` draws a history); the
    skips in a strip below."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and none is picked up from the environment
    import matplotlib.pyplot as plt

    fig, (ax, skips) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                    gridspec_kw={"height_ratios": [3, 1]})
    for axis in (ax, skips):
        for step in report["overflow_steps"]:
            axis.axvspan(step - 0.5, step + 0.5, color="0.9", zorder=0)
    init = spec.f32(CONFIG["init_scale"])
    ran = {n: r for n, r in report["backends"].items() if r.get("records")}
    for i, (name, result) in enumerate(ran.items()):
        records, style = result["records"], _STYLES[i % len(_STYLES)]
        label = f"{name} ({result.get('device', '?')}, {result.get('dtype', '?')})"
        if not result["matches_spec"]:
            label += " DIVERGES"
        _draw_scale(ax, [0] + [r["step"] for r in records], [init] + [r["scale"] for r in records],
                    label=label, **style)
        # Skips in a strip of their own, one row per framework: on the scale line the
        # marks of coinciding frameworks would hide each other.
        skipped = [r["step"] for r in records if r["skipped"]]
        skips.scatter(skipped, [i] * len(skipped), marker=_MARKERS[i % len(_MARKERS)],
                      color=style["color"], s=30)
    _draw_scale(ax, list(range(report["steps"] + 1)),
                [init] + [s.scale for s in reference(report["steps"])], color="black",
                linewidth=0.8, label="spec reference")
    ax.set_yscale("log", base=2)
    ax.set_ylabel("loss scale after the update")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    skips.set_yticks(range(len(ran)), list(ran))
    skips.set_ylim(len(ran) - 0.5, -0.5)
    skips.set_ylabel("skipped steps")
    skips.set_xlabel("step: the n-th update (0: the initial scale; shaded: an inf in the "
                     "input batch)")
    config = ", ".join(f"{k}={v:g}" for k, v in CONFIG.items())
    ax.set_title(f"unifiedamp demo: one config in every framework\n{config}", fontsize=10)
    fig.tight_layout()
    return fig


def _print_summary(report: dict[str, Any]) -> None:
    rows: list[tuple[str, ...]] = [("backend", "device", "dtype", "steps", "skips",
                                    "final scale", "time", "matches spec", "history")]
    for name, r in report["backends"].items():
        if r["status"] == "not installed":
            rows.append((name, *["-"] * 6, f"not run (not installed: {r['detail']})", "-"))
            continue
        d = r["first_divergence"]
        match = "yes" if r["matches_spec"] else f"NO, from step {d['step']}" if d else "NO"
        final = "-" if r["final_scale"] is None else f"{r['final_scale']:g}"
        rows.append((name, r.get("device", "?"), r.get("dtype", "?"), str(len(r["records"])),
                     str(r["skips"]), final, f"{r['seconds']} s", match,
                     "matches" if r["history_matches"] else "DIFFERS"))
    print_table(rows)
    for name, r in report["backends"].items():
        if r["status"] == "error":
            print(f"\n{name}: {r['detail']} (its whole output: `python -m "
                  f"unifiedamp.cli._demo_train {name} {report['steps']}`)")
        elif r.get("first_divergence"):
            d = r["first_divergence"]
            print(f"\n{name}: diverged at step {d['step']}: expected {d['expected']}, "
                  f"got {d['got']}")


def _steps_arg(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= _MAX_STEPS:
        raise argparse.ArgumentTypeError(
            f"must be an integer from 1 to {_MAX_STEPS}, got {value!r}")
    return number


def _cmd_demo(args: argparse.Namespace) -> int:
    out = None if args.out.lower() == "none" else args.out
    if out is not None and importlib.util.find_spec("matplotlib") is None:
        print("unifiedamp demo draws its plot with matplotlib: pip install 'unifiedamp[demo]' "
              "(or pass --out none to skip the plot)", file=sys.stderr)
        return 2
    try:  # checked before the run, which takes a while, not after it
        if out is not None:
            _image_path_error(out)
        if args.history is not None and os.path.exists(args.history) \
                and not os.path.isdir(args.history):
            raise ValueError(f"--history {args.history!r} is a file: name a folder (it is "
                             "created if missing) for one NAME.json per framework")
    except ValueError as exc:
        print(f"unifiedamp demo: {exc}", file=sys.stderr)
        return 2
    report = demo_report(args.backend, args.steps, show_progress=progress_wanted(args))
    if out is not None:
        _plot(report, out)
    report["plot"] = out
    if args.history is not None:
        from unifiedamp.diagnostics import ScaleHistory

        os.makedirs(args.history, exist_ok=True)
        for name, r in report["backends"].items():
            if r.get("history"):
                ScaleHistory(*zip(*r["history"], strict=True)).to_json(
                    os.path.join(args.history, f"{name}.json"))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_summary(report)
        print(f"\nplot: {out or 'not drawn (--out none)'}")
        print(f"result: {'PASS' if report['passed'] else 'FAIL'}")
    return 0 if report["passed"] else 1


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp demo`` to the ``unifiedamp`` parser.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_parser(parser.add_subparsers())
        >>> args = parser.parse_args(["demo", "--backend", "numpy", "--out", "none"])
        >>> args.backend, args.steps, args.out, args.history
        (['numpy'], 40, 'none', None)
    """
    p = sub.add_parser(
        "demo", help="train one fp16 model in every installed framework and plot the scale "
                     "trajectories",
        description="Trains the same small float16 model in every installed framework (each "
                    "in a process of its own) with one scaler config and overflows forced at "
                    "fixed steps, compares each scale trajectory and each scaler's history() "
                    "with the spec's reference bit for bit, prints a table and draws the "
                    "trajectories on one chart: at step n (the n-th update, from 1) the scale "
                    "after that update. On a terminal, stderr says which framework trains, "
                    "its steps done and its time.",
        epilog="exit status: 0 when every framework that ran follows the spec (one not "
               "installed is listed, and fails the run only when named with --backend); 1 "
               "otherwise; 2 for a usage error, a plot path that cannot be written or a "
               "missing matplotlib.")
    p.add_argument("--backend", action="append", choices=BACKENDS,
                   help="a framework to train in (repeatable; default: every installed one, "
                        "where one that is not installed does not fail the run; one named "
                        "here does)")
    p.add_argument("--steps", type=_steps_arg, default=PERIOD, metavar="N",
                   help=f"training steps (default {PERIOD}; overflows repeat every {PERIOD})")
    p.add_argument("--out", default="scale.png", metavar="PNG",
                   help="where to write the plot (default scale.png; 'none': no plot, and "
                        "no need for matplotlib)")
    p.add_argument("--history", default=None, metavar="DIR",
                   help="write each framework's scaler history to DIR/NAME.json "
                        "(`unifiedamp plot DIR/NAME.json` draws one)")
    p.add_argument("--json", action="store_true", help="print the report as JSON, no progress")
    add_progress_option(p)
    p.set_defaults(func=_cmd_demo)


