"""What the torch backend's diagnostics cost: nothing on steps that train, little after a skip.

Run: python benchmarks/bench_diagnostics.py [--device cpu|cuda] [--rounds R] [--steps S]
     [--repeats N]

1. A training step of a small MLP (AdamW, foreach and fused, batch 64, float32 on CPU,
   float16 autocast on CUDA) with a unifiedamp torch scaler built three ways:
   diagnose=False (the default), diagnose=True, and diagnose=True with history=1024,
   plus a second diagnose=False scaler as a control (its ratio is the noise floor);
   one model and optimizer, no step skips. Each round runs S steps of each (in a
   rotating order); the ratio to diagnose=False is taken within the round, and the
   median over R rounds printed (target: <= 1.01).
2. overflow_report() after a skipped step of a ~10M-parameter MLP (SGD), with an inf
   written into one gradient: the largest weight (4.2M elements, the most to count)
   and a bias. Built when asked (diagnose=False), and inside update() (diagnose=True:
   the extra time of that update over the same update with diagnose=False). Median of
   N, and the least time in brackets (target: < 50 ms on CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from bench_torch import mlp, sync  # one model builder and device sync for both

import unifiedamp as ua


def median_ratios(cases: dict[str, Callable[[], None]], rounds: int, device: str
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per run of each case, and the median over rounds of each case's
    time divided by the first case's time in the same round. The order rotates."""
    for fn in cases.values():  # warm-up: optimizer state, caches
        fn()
    sync(device)
    names = list(cases)
    times: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        this_round = {}
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            cases[name]()
            sync(device)
            this_round[name] = time.perf_counter() - t0
        for name in names:
            times[name].append(this_round[name])
            ratios[name].append(this_round[name] / this_round[names[0]])
    return ({name: statistics.median(t) for name, t in times.items()},
            {name: statistics.median(q) for name, q in ratios.items()})


def step_bench(device: str, rounds: int, steps: int, fused: bool,
               sizes: tuple[int, ...] = (256, 512, 512, 256)) -> None:
    x = torch.randn(64, sizes[0], device=device)
    y = torch.randn(64, sizes[-1], device=device)
    # One model and optimizer for all: only the scaler differs, so the memory layout
    # of separate models (measured: 2-3% between identical copies here) does not.
    # The second diagnose=False scaler is the control: its ratio is the noise floor.
    variants = {"diagnose=False": {}, "diagnose=False (control)": {},
                "diagnose=True": {"diagnose": True},
                "diagnose=True, history=1024": {"diagnose": True, "history": 1024}}
    model = mlp(device, sizes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused,
                            foreach=None if fused else True)

    def run(options):
        scaler = ua.GradScaler(1024.0, backend="torch", device=device, **options)

        def go():
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
                    out = model(x)
                scaler.scale(torch.nn.functional.mse_loss(out.float(), y)).backward()
                scaler.step(opt)
                scaler.update()
            return scaler
        return go

    runs = {name: run(options) for name, options in variants.items()}
    med, ratio = median_ratios(runs, rounds, device)
    skipped = [runs[name]().num_skipped_steps for name in runs]
    assert not any(skipped), f"a step was skipped: {skipped}"
    params = sum(p.numel() for p in model.parameters())
    print(f"train step, {params / 1e6:.2f}M-parameter MLP, {'fused' if fused else 'foreach'} "
          f"AdamW, {'float16 autocast' if device == 'cuda' else 'float32'}, batch 64, {device}, "
          f"{rounds} rounds x {steps} steps, no skipped step")
    for name in variants:
        print(f"  {name:30s} {med[name] / steps * 1e3:8.3f} ms/step   "
              f"ratio to diagnose=False (median of per-round ratios) {ratio[name]:.4f}")


def skipped_iteration(model, opt, scaler, x, target) -> None:
    """Forward, scaled backward, an inf and a NaN written into ``target``'s gradient, and
    the step, which the scaler skips (update() is left to the caller)."""
    opt.zero_grad(set_to_none=True)
    scaler.scale(model(x).pow(2).mean()).backward()
    with torch.no_grad():
        target.grad[0] = float("inf")  # a row of a weight, one element of a bias
        target.grad.view(-1)[-1] = float("nan")
    scaler.step(opt)


def lazy_report_ms(model, opt, x, target, name, repeats, device) -> tuple[float, float]:
    """Median and least time of overflow_report() built when asked (diagnose=False)."""
    scaler = ua.GradScaler(1024.0, backend="torch", device=device)
    scaler.watch(model)
    times = []
    for _ in range(repeats + 1):  # the first warms up
        skipped_iteration(model, opt, scaler, x, target)
        scaler.update()
        sync(device)
        t0 = time.perf_counter()
        report = scaler.overflow_report()
        sync(device)
        times.append(time.perf_counter() - t0)
        assert report.names == [name], report
    return statistics.median(times[1:]) * 1e3, min(times[1:]) * 1e3


def diagnose_extra_ms(model, opt, x, target, name, repeats, device) -> tuple[float, float]:
    """The time update() of a skipped step takes with diagnose=True (which builds the
    report there) over the same update with diagnose=False, interleaved: the difference
    of the medians and of the least times."""
    scalers = {"off": ua.GradScaler(1024.0, backend="torch", device=device),
               "on": ua.GradScaler(1024.0, backend="torch", device=device, diagnose=True)}
    spent: dict[str, list[float]] = {name: [] for name in scalers}
    for scaler in scalers.values():
        scaler.watch(model)
    for r in range(repeats + 1):  # the first warms up
        for key in (["off", "on"] if r % 2 else ["on", "off"]):
            skipped_iteration(model, opt, scalers[key], x, target)
            sync(device)
            t0 = time.perf_counter()
            scalers[key].update()
            sync(device)
            spent[key].append(time.perf_counter() - t0)
    assert scalers["on"].overflow_report().names == [name]
    on, off = spent["on"][1:], spent["off"][1:]
    return ((statistics.median(on) - statistics.median(off)) * 1e3,
            (min(on) - min(off)) * 1e3)


def report_bench(device: str, repeats: int,
                 sizes: tuple[int, ...] = (1024, 4096, 1024, 1024, 512)) -> None:
    model = mlp(device, sizes)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(64, sizes[0], device=device)
    print(f"overflow report after a skipped step, {params / 1e6:.2f}M-parameter MLP "
          f"({len(list(model.parameters()))} gradients), {device}, {repeats} runs: "
          "median (least)")
    for name in ("0.weight", "6.bias"):
        target = model.get_parameter(name)
        lazy = lazy_report_ms(model, opt, x, target, name, repeats, device)
        extra = diagnose_extra_ms(model, opt, x, target, name, repeats, device)
        print(f"  inf/NaN in {name} ({target.numel():,} elements):")
        print(f"    overflow_report() when asked (diagnose=False)        "
              f"{lazy[0]:8.2f} ms ({lazy[1]:.2f})")
        print(f"    extra time of a skipped update() with diagnose=True  "
              f"{extra[0]:8.2f} ms ({extra[1]:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}"
          + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""))
    for fused in (False, True):
        step_bench(args.device, args.rounds, args.steps, fused)
    report_bench(args.device, args.repeats)


if __name__ == "__main__":
    main()
