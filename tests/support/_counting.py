"""Counting the Python calls a function makes: what ``test_call_counts*.py`` hold the
scalers' verbs to (the host work a launch-bound GPU step waits for, counted
deterministically)."""

from __future__ import annotations

import collections
import gc
import sys
from collections.abc import Callable
from typing import Any


class CallCounter:
    """Counts the Python calls ("call" events) and C calls ("c_call") made inside the
    functions it runs, the function itself included, and the Python ones by code object.

    Example:
        >>> counter = CallCounter()
        >>> counter.run(lambda: [abs(x) for x in (1, -2)])
        [1, 2]
        >>> counter.calls, counter.c_calls  # lambda, comprehension; abs twice, setprofile
        (2, 3)
    """

    def __init__(self) -> None:
        self.calls = 0
        self.c_calls = 0
        self.codes: collections.Counter[Any] = collections.Counter()

    def _event(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
            self.codes[frame.f_code] += 1
        elif event == "c_call":
            self.c_calls += 1

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        previous = sys.getprofile()
        # A collection in the middle would run finalizers and weakref callbacks: calls
        # that belong to no verb, at moments that vary.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        sys.setprofile(self._event)
        try:
            return fn(*args)
        finally:
            sys.setprofile(previous)
            if gc_was_enabled:
                gc.enable()
