"""What the benchmark scripts share: interleaved runs in a rotating order, and medians."""

from __future__ import annotations

import os
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


# By default glibc maps large buffers (from 128 KiB, a threshold that adapts) with mmap and
# gives a freed heap top over 128 KiB back to the system: a compiled step that allocates and
# frees tens of MiB per call then page-faults its buffers in again, in some processes and not
# others (a JAX Keras step measured 1.05x and 1.5x plain SGD in two runs of one command).
# These keep freed memory in the process; every case of a run gets the same allocator.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
                 "MALLOC_TOP_PAD_": str(256 << 20)}


def child_env(steady_malloc: bool, **extra: str) -> dict[str, str]:
    """The environment of a benchmark's child process: this one's, ``extra``, and unless
    ``steady_malloc`` is false, :data:`STEADY_MALLOC` where the caller did not set it.

    Example:
        >>> env = child_env(True, KERAS_BACKEND="jax")
        >>> env["KERAS_BACKEND"], env["MALLOC_TOP_PAD_"] == STEADY_MALLOC["MALLOC_TOP_PAD_"]
        ('jax', True)
    """
    env = dict(os.environ, **extra)
    if steady_malloc:
        for key, value in STEADY_MALLOC.items():
            env.setdefault(key, value)
    return env
