"""NumPy backend overhead: an SGD step with the scaler against the same step without it.

Run: python benchmarks/bench_numpy.py [--elements N] [--repeats R]
Prints medians of interleaved runs and the ratio scaler/no-scaler.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import unifiedamp as ua
from unifiedamp.backends.numpy import SGD


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--elements", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    grad = rng.normal(size=args.elements).astype(np.float32)
    params = [np.zeros(args.elements, np.float32)]
    plain, scaled = SGD(params, lr=1e-3), SGD([p.copy() for p in params], lr=1e-3)
    scaler = ua.GradScaler(2.0**10, backend="numpy")

    def step_plain() -> None:
        plain.grads = [grad.copy()]
        plain.step()

    def step_scaled() -> None:
        scaled.grads = [grad.copy()]
        scaler.step(scaled)
        scaler.update()

    times: dict[str, list[float]] = {"no scaler": [], "unifiedamp": []}
    for _ in range(args.repeats):  # interleaved, so drift hits both alike
        for name, fn in (("no scaler", step_plain), ("unifiedamp", step_scaled)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, t in med.items():
        print(f"{name:12s} median {t * 1e3:8.2f} ms")
    print(f"ratio unifiedamp / no scaler: {med['unifiedamp'] / med['no scaler']:.3f} "
          f"({args.elements:,} float32 elements)")


if __name__ == "__main__":
    main()
