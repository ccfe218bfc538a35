"""The torch backend's overhead, against no scaler and against torch.amp.GradScaler.

Run: python benchmarks/bench_torch.py [--device cpu|cuda] [--repeats R] [--steps S]

1. A training step of a ~10M-parameter MLP (AdamW) with (a) no scaler,
   (b) torch.amp.GradScaler, (c) unifiedamp with a config torch expresses
   (its kernels run), (d) unifiedamp with hysteresis=2 and min_scale (the spec
   as tensor ops). Runs are interleaved; medians and the ratios c/b, d/b printed.
2. unscale_ + inf check (+ update) of 50M float32 gradient elements, against one
   torch._foreach_mul_ pass over the same tensors, for both scalers.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import unifiedamp as ua


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def mlp(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
    ).to(device)


def train_step_bench(device: str, repeats: int, steps: int) -> dict[str, float]:
    x = torch.randn(64, 1024, device=device)
    y = torch.randn(64, 1024, device=device)
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
        model = mlp(device)
        setups[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4),
                        factory() if factory else None)
    params = sum(p.numel() for p in setups["a no scaler"][0].parameters())

    def run(model, opt, scaler):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        sync(device)

    times: dict[str, list[float]] = {name: [] for name in variants}
    for name in variants:  # warm-up
        run(*setups[name])
    names = list(variants)
    for r in range(repeats):
        # Interleaved, in a rotating order, so that drift and position hit all alike.
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            run(*setups[name])
            times[name].append((time.perf_counter() - t0) / steps)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"train step, {params / 1e6:.1f}M-parameter MLP, AdamW, batch 64, {device}, "
          f"median of {repeats} x {steps} steps")
    for name, t in med.items():
        print(f"  {name:42s} {t * 1e3:8.2f} ms")
    b = med["b torch.amp.GradScaler"]
    print(f"  ratio c/b = {med['c unifiedamp (torch kernels)'] / b:.3f}   "
          f"ratio d/b = {med['d unifiedamp (hysteresis=2, min_scale)'] / b:.3f}")
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
    native.scale(torch.ones((), device=device))

    def foreach_mul():
        torch._foreach_mul_(grads, inv)

    def unscale_update(scaler):
        def go():
            scaler.unscale_(opt)
            scaler.update()
        return go

    cases = {"torch._foreach_mul_": foreach_mul, "unifiedamp unscale_+update": unscale_update(ours),
             "torch.amp unscale_+update": unscale_update(native)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        fn()
    sync(device)
    names = list(cases)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = cases[name]
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"unscale_ + inf check of {elements / 1e6:.0f}M float32 gradient elements "
          f"({len(grads)} tensors), {device}, median of {repeats}")
    for name, t in med.items():
        print(f"  {name:42s} {t * 1e3:8.2f} ms")
    base = med["torch._foreach_mul_"]
    print(f"  ratio unifiedamp/foreach_mul = {med['unifiedamp unscale_+update'] / base:.3f}   "
          f"ratio torch.amp/foreach_mul = {med['torch.amp unscale_+update'] / base:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    train_step_bench(args.device, args.repeats, args.steps)
    unscale_bench(args.device, args.repeats)


if __name__ == "__main__":
    main()
