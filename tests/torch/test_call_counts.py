"""The host work the torch backend adds per training iteration, counted as Python calls next
to ``torch.amp.GradScaler``'s in the same loop.

On a GPU a launch-bound step waits for the host: every Python call a scaler's verbs make
(a frame, its arguments, its body) is time the step pays. Timing it on two shared cores is
noisy; counting the calls is deterministic, so the count is what this file holds.

An iteration is what a user writes::

    scaler.scale(loss).backward(); scaler.unscale_(opt); clip; scaler.step(opt)
    scaler.update(); opt.zero_grad()

and what is counted is every Python function called inside ``scale``, ``unscale_``,
``step`` and ``update`` (the verb itself and everything it calls, the optimizer's own
``step()`` included: both scalers call it on a good iteration, neither on a skipped one
with a plain optimizer), not the forward, the backward, the clipping or ``zero_grad``;
with foreach and fused AdamW, and fused AdamW without ``unscale_`` and clipping (its kernel
unscales); good iterations, and skipped ones (an inf put into a gradient). The
iteration counted is a warmed-up one (after ``WARMUP`` good iterations: the optimizer's
state exists, one-time checks and caches are done), and the next iteration must count the
same, else the count is not a property of the code.

What is counted: ``sys.setprofile``'s "call" events, one per Python frame started
(functions, methods, properties, lambdas, comprehensions, a generator's every resumption).
C calls ("c_call") are counted and printed but not held to a target: they mix builtins that
cost tens of nanoseconds (``isinstance``, ``len``, ``getattr``, the inlined guards that stand
in for Python calls) with torch's ops, each a dispatch and on a GPU a launch, which
``tests/torch/test_torch_ops.py`` already counts op by op and holds to native + 0. A Python call
builds a frame; that is the host cost this file measures.

Targets: a config torch can express at most native + 5 calls per iteration, the extended
rule (hysteresis 2 and min_scale: the spec's update as tensor ops) at most native + 15; the
diagnostics off (``diagnose=False, history=0``) cost nothing: the same calls as a scaler
built without those options, and none of the functions that exist only for them. Run with
``pytest -s`` to see the table.
"""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _counting import CallCounter  # noqa: E402  # tests/support/_counting.py

import unifiedamp as ua  # noqa: E402
from unifiedamp.backends.torch import TorchGradScaler  # noqa: E402
from unifiedamp.backends.torch._diagnostics import TorchDiagnostics, count_overflows  # noqa: E402

#: Good iterations before the two counted: the first builds the optimizer's state.
WARMUP = 3
#: The targets: extra Python calls per iteration over torch.amp.GradScaler's.
MARGIN = {"torch-expressible": 5, "extended rule": 15}
EXTENDED = {"hysteresis": 2, "min_scale": 1.0}
DIAGNOSTICS_ON = {"diagnose": True, "history": 8}
#: name -> (AdamW's options, whether the iteration calls unscale_ and clips). A fused
#: optimizer is usually stepped without unscale_: the kernel unscales.
OPTIMIZERS = {"foreach AdamW": ({"foreach": True}, True), "fused AdamW": ({"fused": True}, True),
              "fused, no unscale_": ({"fused": True}, False)}


def iteration_counts(make_scaler: Callable[[], Any], optimizer: str, skip: bool
                     ) -> list[CallCounter]:
    """The calls of the scaler's verbs in the two iterations after ``WARMUP`` good ones of a
    small float32 MLP on the CPU with AdamW; with ``skip``, both hold an inf gradient."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    options, unscale = OPTIMIZERS[optimizer]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **options)
    scaler = make_scaler()
    x = torch.randn(4, 8)
    counted = []
    # No collection runs during the iterations (a collection's finalizers would count as
    # calls). Disabled rather than run before each row: that was most of the table's time.
    gc.disable()
    try:
        for i in range(WARMUP + 2):
            counter = CallCounter() if i >= WARMUP else None

            def verb(fn: Callable[..., Any], *args: Any, counter: CallCounter | None = counter
                     ) -> Any:
                return counter.run(fn, *args) if counter is not None else fn(*args)

            loss = model(x).square().mean()
            verb(scaler.scale, loss).backward()
            if skip and counter is not None:
                model[0].weight.grad[0, 0] = float("inf")
            if unscale:
                verb(scaler.unscale_, opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            verb(scaler.step, opt)
            verb(scaler.update)
            opt.zero_grad(set_to_none=True)
            if counter is not None:
                counted.append(counter)
            if i == WARMUP - 1:
                before = [p.detach().clone() for p in model.parameters()]
    finally:
        gc.enable()
    # What was counted is what was meant: two skipped steps, or two taken.
    unchanged = all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert unchanged == skip
    return counted


def _native() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)


def _unifiedamp(config: str, diagnostics: str) -> Callable[[], Any]:
    options: dict[str, Any] = dict(EXTENDED) if config == "extended rule" else {}
    if diagnostics == "on":
        options.update(DIAGNOSTICS_ON)
    elif diagnostics == "off":
        options.update(diagnose=False, history=0)
    # diagnostics "unset": built without the two options.
    return lambda: ua.GradScaler(1024.0, growth_interval=1000, backend="torch", **options)


CASES = [(config, diagnostics, optimizer, skip)
         for config in MARGIN for diagnostics in ("off", "on", "unset")
         for optimizer in OPTIMIZERS for skip in (False, True)]


@pytest.fixture(scope="module")
def table() -> dict[tuple[str, str, str, bool], tuple[list[CallCounter], list[CallCounter]]]:
    """(config, diagnostics, optimizer, skip) -> (native's two counts, unifiedamp's), and the
    table printed (``pytest -s``)."""
    rows = {}
    natives = {(optimizer, skip): iteration_counts(_native, optimizer, skip)
               for optimizer in OPTIMIZERS for skip in (False, True)}
    for config, diagnostics, optimizer, skip in CASES:
        ours = iteration_counts(_unifiedamp(config, diagnostics), optimizer, skip)
        rows[config, diagnostics, optimizer, skip] = (natives[optimizer, skip], ours)
    print(f"\nPython calls per iteration (C calls in brackets), torch {torch.__version__}, CPU")
    print(f"{'config':18s} {'diagnostics':11s} {'optimizer':18s} {'iteration':9s} "
          f"{'native':>10s} {'unifiedamp':>11s} {'difference':>10s}")
    for (config, diagnostics, optimizer, skip), (native, ours) in rows.items():
        if diagnostics == "unset":
            continue
        print(f"{config:18s} {diagnostics:11s} {optimizer:18s} {'skip' if skip else 'good':9s} "
              f"{native[0].calls:4d} [{native[0].c_calls:3d}] {ours[0].calls:4d} "
              f"[{ours[0].c_calls:3d}] {ours[0].calls - native[0].calls:+10d}")
    return rows


def _by_name(counter: CallCounter) -> collections.Counter[str]:
    return collections.Counter({f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}": k
                                for code, k in counter.codes.items()})


def _top(counter: CallCounter, n: int = 12) -> str:
    return ", ".join(f"{name} x{k}" for name, k in _by_name(counter).most_common(n))


def _more_than(ours: CallCounter, native: CallCounter) -> str:
    """The functions the scaler calls that native's does not, or more often: where to look."""
    return ", ".join(f"{name} +{k}" for name, k in (_by_name(ours) - _by_name(native)).items())


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_a_warmed_up_iteration_counts_the_same_twice(table, case):
    native, ours = table[case]
    assert native[0].calls == native[1].calls, (_top(native[0]), _top(native[1]))
    assert ours[0].calls == ours[1].calls, (_top(ours[0]), _top(ours[1]))


def over_margin(table) -> list[str]:
    """The rows (diagnostics off) whose unifiedamp count exceeds native's plus the margin."""
    return [f"{config}, {optimizer}, {'skip' if skip else 'good'}: native {native[0].calls}, "
            f"unifiedamp {ours[0].calls} (margin {MARGIN[config]}); called more than by "
            f"native's: {_more_than(ours[0], native[0])}"
            for (config, diagnostics, optimizer, skip), (native, ours) in table.items()
            if diagnostics == "off" and ours[0].calls > native[0].calls + MARGIN[config]]


def test_the_scaler_makes_at_most_the_margin_of_python_calls_over_natives(table):
    assert over_margin(table) == []


def test_diagnostics_off_cost_no_call(table):
    # Off by the options or by leaving them out: one path.
    for (config, diagnostics, optimizer, skip), (_, ours) in table.items():
        if diagnostics == "off":
            unset = table[config, "unset", optimizer, skip][1]
            assert ours[0].calls == unset[0].calls, (config, optimizer, skip)
    # No function that exists for diagnose=True or history=N runs without them.
    only_for_diagnostics = {TorchDiagnostics._record.__code__,
                            TorchDiagnostics._diagnose_now.__code__,
                            TorchDiagnostics._build_report.__code__,
                            count_overflows.__code__}
    for (config, diagnostics, optimizer, skip), (_, ours) in table.items():
        if diagnostics != "on":
            ran = only_for_diagnostics & set(ours[0].codes)
            assert not ran, (config, optimizer, skip, [code.co_name for code in ran])


class _MoreCalls(TorchGradScaler):
    """A regression as it would come: helpers called by every update()."""

    extra = 1

    def update(self, *args: Any, **kwargs: Any) -> Any:
        for _ in range(self.extra):
            self._helper()
        return super().update(*args, **kwargs)

    def _helper(self) -> None:
        return None


def test_the_margin_check_fails_once_added_calls_cross_it(table):
    """Each call added to update() shows in the count, one for one, and the check fails
    exactly when they take the scaler past native's count plus the margin."""
    key = ("torch-expressible", "off", "foreach AdamW", False)
    native, ours = table[key]
    room = native[0].calls + MARGIN["torch-expressible"] - ours[0].calls
    assert room >= 0
    for extra in (room - 1, room):  # the override is one more call
        _MoreCalls.extra = extra
        regressed = iteration_counts(lambda: _MoreCalls(1024.0, growth_interval=1000),
                                     "foreach AdamW", False)
        assert regressed[0].calls == ours[0].calls + 1 + extra
        failed = over_margin({key: (native, regressed)})
        assert bool(failed) == (extra == room), failed
    assert "test_call_counts.py:_helper +" in failed[0]  # the message names the culprit


def test_unscale_of_a_gradient_tree_costs_one_call_per_gradient():
    """The functional ``unscale(grads)`` (accumulation, penalties) walks the gradients with
    the tree helper, whose leaves cost no call of their own: what is left per gradient is
    the call that copies it, so 40 gradients cost 36 calls more than 4, flat or nested."""
    def calls(grads):
        scaler = ua.GradScaler(1024.0, backend="torch", device="cpu")
        for _ in range(WARMUP):
            scaler.unscale(grads)
            scaler.update()
        counter = CallCounter()
        counter.run(scaler.unscale, grads)
        return counter.calls

    def nested(n):
        grads = [torch.ones(3) for _ in range(n)]
        return {"a": grads[: n // 2], "b": tuple(grads[n // 2:])}

    assert calls([torch.ones(3) for _ in range(40)]) - calls([torch.ones(3)
                                                              for _ in range(4)]) == 36
    assert calls(nested(40)) - calls(nested(4)) == 36
