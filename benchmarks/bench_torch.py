"""The torch backend's overhead, against no scaler and against torch.amp.GradScaler.

Run: python benchmarks/bench_torch.py [--device cpu|cuda] [--repeats R] [--steps S]
     [--models launch-bound,large] [--optimizers foreach,fused] [--sections 1,2,3,4,5]
     [--clock wall|cpu]

1. A training step of an MLP, AdamW (foreach and fused), batch 64, under float16
   autocast on CUDA (float32 on CPU, whose float16 matmul is ~50x slower),
   with (a) no scaler, (b) torch.amp.GradScaler, (c) unifiedamp with a config torch
   expresses (its kernels run), (d) unifiedamp with hysteresis=2 and min_scale (the
   spec as tensor ops), for a launch-bound 2.1M-parameter MLP and a 9.4M-parameter
   one. Runs are interleaved; medians and the ratios c/b, d/b printed.
2. unscale_ + inf check (+ update) of 50M float32 gradient elements, against one
   torch._foreach_mul_ pass over the same tensors, for both scalers.
3. What skipping a non-fused optimizer's step on the device would cost (what capturing
   it in a CUDA graph with dynamic scaling needs): a foreach AdamW step over 10M
   parameters, against the same step with a copy of parameters and moments taken
   before and selected back (torch.where on found_inf) after.
4. The host time of scale(), unscale_(), step() and update() themselves (the Python and
   the launches, what a launch-bound GPU step waits for) on a 4-layer 8x8 MLP, AdamW
   foreach and fused, for (b), (c) and (d): microseconds per iteration, medians of R
   rounds of 300 iterations, and the median of per-round ratios of the totals.
   ``--clock cpu`` times them in the calling thread's CPU time instead of wall time, with
   torch on one thread (so that every op runs in the thread timed): on a shared machine
   the time the thread waits for a core, which moved whole rounds by 30% here, is then
   left out.
5. CUDA only: replays of a whole fp16 step of the launch-bound MLP captured as one CUDA
   graph (fused capturable AdamW), for (b), (c) and (d).

--sections picks some of them (e.g. --sections 4 for the host times alone).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _timing import interleaved_medians, round_ratio  # benchmarks/_timing.py

import unifiedamp as ua


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


#: Layer widths: a step of the first is bound by kernel launches on a GPU.
MODELS = {"launch-bound": (512, 1024, 1024, 512), "large": (1024, 4096, 1024, 1024)}


def mlp(device: str, sizes: tuple[int, ...]) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).to(device)


def medians(cases: dict[str, Callable[[], None]], repeats: int, device: str,
            per_call: int = 1) -> dict[str, float]:
    return interleaved_medians(cases, repeats, per_call, sync=lambda: sync(device))


def report(title: str, med: dict[str, float], base: str, ratios: dict[str, str]) -> None:
    print(title)
    for name, t in med.items():
        print(f"  {name:42s} {t * 1e3:8.2f} ms")
    print("  " + "   ".join(f"ratio {label} = {med[name] / med[base]:.3f}"
                            for label, name in ratios.items()))


def train_step_bench(device: str, repeats: int, steps: int, model_kind: str,
                     fused: bool) -> dict[str, float]:
    sizes = MODELS[model_kind]
    x = torch.randn(64, sizes[0], device=device)
    y = torch.randn(64, sizes[-1], device=device)
    variants = {
        "a no scaler": None,
        "b torch.amp.GradScaler": lambda: torch.amp.GradScaler(device, 1024.0),
        "c unifiedamp (torch kernels)": lambda: ua.GradScaler(1024.0, backend="torch",
                                                              device=device),
        "d unifiedamp (hysteresis=2, min_scale)": lambda: ua.GradScaler(
            1024.0, backend="torch", device=device, hysteresis=2, min_scale=1.0),
    }
    setups = {}
    for name, factory in variants.items():
        model = mlp(device, sizes)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused,
                                foreach=None if fused else True)
        setups[name] = (model, opt, factory() if factory else None)
    params = sum(p.numel() for p in setups["a no scaler"][0].parameters())

    def run(model, opt, scaler):
        def go():
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
                    out = model(x)
                loss = torch.nn.functional.mse_loss(out.float(), y)
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
        return go

    med = medians({name: run(*setup) for name, setup in setups.items()}, repeats, device, steps)
    report(f"train step, {model_kind} {params / 1e6:.1f}M-parameter MLP, "
           f"{'fused' if fused else 'foreach'} AdamW, "
           f"{'float16 autocast' if device == 'cuda' else 'float32'}, batch 64, {device}, "
           f"median of {repeats} x {steps} steps", med, "b torch.amp.GradScaler",
           {"c/b": "c unifiedamp (torch kernels)",
            "d/b": "d unifiedamp (hysteresis=2, min_scale)"})
    return med


def unscale_bench(device: str, repeats: int, elements: int = 50_000_000) -> None:
    chunk = 1_000_000
    params = [torch.nn.Parameter(torch.zeros(chunk, device=device))
              for _ in range(elements // chunk)]
    for p in params:
        p.grad = torch.randn(chunk, device=device)
    opt = torch.optim.SGD(params, lr=0.1)
    grads = [p.grad for p in params]
    inv = torch.tensor(1.0, device=device)
    ours = ua.GradScaler(1.0, backend="torch", device=device)
    native = torch.amp.GradScaler(device, 1.0)
    # Both, like torch, want one scale() before their first unscale_().
    for scaler in (ours, native):
        scaler.scale(torch.ones((), device=device))

    def foreach_mul():
        torch._foreach_mul_(grads, inv)

    def unscale_update(scaler):
        def go():
            scaler.unscale_(opt)
            scaler.update()
        return go

    cases = {"torch._foreach_mul_": foreach_mul, "unifiedamp unscale_+update": unscale_update(ours),
             "torch.amp unscale_+update": unscale_update(native)}
    report(f"unscale_ + inf check of {elements / 1e6:.0f}M float32 gradient elements "
           f"({len(grads)} tensors), {device}, median of {repeats}",
           medians(cases, repeats, device), "torch._foreach_mul_",
           {"unifiedamp/foreach_mul": "unifiedamp unscale_+update",
            "torch.amp/foreach_mul": "torch.amp unscale_+update"})


def select_skip_bench(device: str, repeats: int, elements: int = 10_000_000) -> None:
    chunk = 1_000_000
    params = [torch.nn.Parameter(torch.randn(chunk, device=device))
              for _ in range(elements // chunk)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, foreach=True)
    opt.step()  # creates the moments
    moments = [t for state in opt.state.values() for t in (state["exp_avg"],
                                                            state["exp_avg_sq"])]
    tensors = [p.detach() for p in params] + moments
    found_inf = torch.zeros((), device=device)

    def step_with_select():
        old = torch._foreach_mul(tensors, 1.0)  # the copy a device-side skip needs
        opt.step()
        keep = found_inf > 0
        torch._foreach_copy_(tensors, [torch.where(keep, o, n)
                                       for o, n in zip(old, tensors, strict=True)])

    report(f"foreach AdamW step of {elements / 1e6:.0f}M parameters, {device}, median of "
           f"{repeats}", medians({"step": opt.step, "step + copy and select": step_with_select},
                                repeats, device),
           "step", {"select/step": "step + copy and select"})


def host_time_bench(device: str, repeats: int, iterations: int = 300,
                    clock_name: str = "wall") -> None:
    """Section 4: the host time of the scaler's verbs per iteration, the rest untimed.

    Each scaler trains a model of its own; in a round, they take turns every iteration
    (the order reversed every other one), so the machine's drift, which moves a whole
    round's time by tens of percent here, falls on every scaler alike."""
    scalers = {"b torch.amp.GradScaler": lambda: torch.amp.GradScaler(device, init_scale=1024.0),
               "c unifiedamp": lambda: ua.GradScaler(1024.0, backend="torch", device=device),
               "d unifiedamp (hysteresis=2, min_scale)": lambda: ua.GradScaler(
                   1024.0, backend="torch", device=device, hysteresis=2, min_scale=1.0)}
    verbs = ("scale", "unscale_", "step", "update")
    x = torch.randn(4, 8, device=device)
    clock = time.thread_time_ns if clock_name == "cpu" else time.perf_counter_ns
    threads = torch.get_num_threads()
    if clock_name == "cpu":
        torch.set_num_threads(1)

    def iteration(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: Any,
                  spent: list[int]) -> None:
        loss = model(x).square().mean()
        t0 = clock()
        scaled = scaler.scale(loss)
        t1 = clock()
        scaled.backward()
        t2 = clock()
        scaler.unscale_(opt)  # as before clipping: step() then skips its own
        t3 = clock()
        scaler.step(opt)
        t4 = clock()
        scaler.update()
        t5 = clock()
        opt.zero_grad(set_to_none=True)
        spent[0] += t1 - t0
        spent[1] += t3 - t2
        spent[2] += t4 - t3
        spent[3] += t5 - t4

    for fused in (False, True):
        trained = {name: (mlp(device, (8, 8, 8, 8, 8)), make()) for name, make in scalers.items()}
        cases = [(name, model, torch.optim.AdamW(model.parameters(), fused=fused,
                                                 foreach=None if fused else True), scaler)
                 for name, (model, scaler) in trained.items()]
        per: dict[str, list[list[float]]] = {name: [] for name in scalers}
        # Round 0 is the warm-up (the optimizers' state; the compiled rule on CUDA).
        for round_ in range(repeats + 1):
            spent = {name: [0, 0, 0, 0] for name in scalers}
            for i in range(iterations):
                for name, model, opt, scaler in (cases if i % 2 else cases[::-1]):
                    iteration(model, opt, scaler, spent[name])
            sync(device)
            if round_:
                for name in scalers:
                    per[name].append([t / iterations / 1e3 for t in spent[name]])
        print(f"host time per iteration ({clock_name} clock), 4-layer 8x8 MLP, "
              f"{'fused' if fused else 'foreach'} AdamW, {device}, us (step includes the "
              f"optimizer's), median of {repeats} x "
              f"{iterations}, the scalers taking turns every iteration; / b: median of "
              "per-round ratios of the totals")
        totals = {name: [sum(times) for times in rounds] for name, rounds in per.items()}
        base = next(iter(per))
        for name in per:
            times = [statistics.median(p[i] for p in per[name]) for i in range(len(verbs))]
            ratio = round_ratio(totals, name, base)
            spread = [p / q for p, q in zip(totals[name], totals[base], strict=True)]
            columns = "  ".join(f"{v} {t:6.1f}" for v, t in zip(verbs, times, strict=True))
            print(f"  {name:40s} {columns}  total {statistics.median(totals[name]):6.1f}"
                  f"  / b {ratio:.3f} (rounds {min(spread):.3f}-{max(spread):.3f})")
    torch.set_num_threads(threads)


def graph_replay_bench(repeats: int, replays: int = 50) -> None:
    """Section 5 (CUDA): replaying a whole fp16 step captured as one CUDA graph
    (docs/backends/torch.md's recipe), fused capturable AdamW, per scaler."""
    sizes = MODELS["launch-bound"]
    scalers = {"b torch.amp.GradScaler": lambda: torch.amp.GradScaler("cuda", 1024.0),
               "c unifiedamp": lambda: ua.GradScaler(1024.0, backend="torch", device="cuda"),
               "d unifiedamp (hysteresis=2, min_scale)": lambda: ua.GradScaler(
                   1024.0, backend="torch", device="cuda", hysteresis=2, min_scale=1.0)}
    cases = {}
    for name, make in scalers.items():
        model = mlp("cuda", sizes)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True, capturable=True)
        scaler = make()
        x = torch.randn(64, sizes[0], device="cuda")
        y = torch.randn(64, sizes[-1], device="cuda")

        def step(model=model, opt=opt, scaler=scaler, x=x, y=y) -> None:
            with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
                out = model(x)
            scaler.scale(torch.nn.functional.mse_loss(out.float(), y)).backward()
            scaler.step(opt)
            scaler.update()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            step()

        def replay(graph=graph) -> None:
            for _ in range(replays):
                graph.replay()
        cases[name] = replay
    report(f"CUDA graph replay of a whole step, launch-bound MLP, fused capturable AdamW, "
           f"float16 autocast, median of {repeats} x {replays} replays",
           medians(cases, repeats, "cuda", replays), "b torch.amp.GradScaler",
           {"c/b": "c unifiedamp", "d/b": "d unifiedamp (hysteresis=2, min_scale)"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--optimizers", default="foreach,fused")
    parser.add_argument("--sections", default="1,2,3,4,5",
                        help="which of the sections above to run (5 needs CUDA)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="section 4's clock: wall time, or the thread's CPU time")
    args = parser.parse_args()
    sections = {int(n) for n in args.sections.split(",")}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}"
          + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""))
    if 1 in sections:
        for model_kind in args.models.split(","):
            for kind in args.optimizers.split(","):
                train_step_bench(args.device, args.repeats, args.steps, model_kind,
                                 kind == "fused")
    if 2 in sections:
        unscale_bench(args.device, args.repeats)
    if 3 in sections:
        select_skip_bench(args.device, args.repeats)
    if 4 in sections:
        host_time_bench(args.device, args.repeats, clock_name=args.clock)
    if 5 in sections and args.device == "cuda":
        graph_replay_bench(args.repeats)


if __name__ == "__main__":
    main()
