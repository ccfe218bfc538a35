"""What the benchmark scripts share: interleaved runs in a rotating order, and medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(cases: dict[str, Callable[[], object]], repeats: int,
                        per_call: int = 1,
                        sync: Callable[[], object] = lambda: None) -> dict[str, float]:
    """Median seconds per call of each case (a run's time divided by ``per_call``).

    Each case runs once first (compilation, caches), then ``repeats`` times, interleaved
    in a rotating order so that drift and position hit every case alike. ``sync`` waits
    for the device after each run.

    Example:
        >>> sorted(interleaved_medians({"a": lambda: None, "b": lambda: None}, 3))
        ['a', 'b']
    """
    for fn in cases.values():
        fn()
    sync()
    names = list(cases)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            cases[name]()
            sync()
            times[name].append((time.perf_counter() - t0) / per_call)
    return {name: statistics.median(t) for name, t in times.items()}
