"""What the benchmark scripts share: interleaved runs in a rotating order, and medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def interleaved_rounds(cases: dict[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """What each case returns, once per round: each case runs once first (compilation,
    caches), then ``repeats`` rounds run every case, in a rotating order so that drift and
    position hit every case alike.

    Example:
        >>> interleaved_rounds({"a": lambda: 1, "b": lambda: 2}, 2)
        {'a': [1, 1], 'b': [2, 2]}
    """
    for fn in cases.values():
        fn()
    names = list(cases)
    per_round: dict[str, list[T]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            per_round[name].append(cases[name]())
    return per_round


def round_ratio(per_round: dict[str, list[float]], x: str, y: str) -> float:
    """The median over rounds of ``x``'s value over ``y``'s in the same round: a round's
    cases ran back to back, so drift between rounds (other load, clock) cancels.

    Example:
        >>> round_ratio({"a": [2.0, 4.0, 9.0], "b": [1.0, 2.0, 3.0]}, "a", "b")
        2.0
    """
    return statistics.median(p / q for p, q in zip(per_round[x], per_round[y], strict=True))


def interleaved_medians(cases: dict[str, Callable[[], object]], repeats: int,
                        per_call: int = 1,
                        sync: Callable[[], object] = lambda: None) -> dict[str, float]:
    """Median seconds per call of each case (a run's time divided by ``per_call``), over
    :func:`interleaved_rounds`. ``sync`` waits for the device after each run.

    Example:
        >>> sorted(interleaved_medians({"a": lambda: None, "b": lambda: None}, 3))
        ['a', 'b']
    """
    def timed(fn: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            fn()
            sync()
            return (time.perf_counter() - t0) / per_call
        return run

    per_round = interleaved_rounds({name: timed(fn) for name, fn in cases.items()}, repeats)
    return {name: statistics.median(t) for name, t in per_round.items()}
