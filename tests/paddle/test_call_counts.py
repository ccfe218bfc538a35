"""The host work the paddle backend adds per training iteration, counted as Python calls
next to ``paddle.amp.GradScaler``'s in the same loop (``tests/torch/test_call_counts.py`` does
the same for torch and says why a count, not a time).

Paddle turns its own scaler off on a CPU place (a warning, then every verb passes through),
so the native scaler counted here is ``paddle.amp.GradScaler`` with the state its
constructor builds on a GPU (:func:`enabled_native`): its own ``scale``, ``unscale_``,
``step`` and ``update`` then run their enabled code, Paddle's CPU kernels included, as on a
GPU. An iteration (the forward under ``auto_cast(dtype="float16")``, without which Paddle's
scaler turns itself off)::

    scaler.scale(loss).backward(); scaler.unscale_(opt); clip; scaler.step(opt)
    scaler.update(); opt.clear_grad()

and what is counted is every Python call inside the four verbs (the optimizer's own step
included: Paddle's scaler calls it on every iteration and leaves the skip to the kernel,
which it tells found_inf; this one calls it only on a good one), on a warmed-up iteration
that another one, two later, must count the same.

Paddle's own skipped iteration raises (``test_paddles_own_update_raises_at_an_overflow``):
there the scaler is held to Paddle's good iteration, which does less. Targets as for
torch: a config Paddle can express at most native + 5, the extended rule (hysteresis 2
and min_scale) at most native + 15, and the diagnostics off cost nothing.
"""

from __future__ import annotations

import collections
import inspect
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from _counting import CallCounter  # noqa: E402  # tests/support/_counting.py

import unifiedamp as ua  # noqa: E402
from unifiedamp.backends.paddle._diagnostics import PaddleDiagnostics  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:amp_guard can only be enabled on CUDAPlace")

WARMUP = 3
MARGIN = {"paddle-expressible": 5, "extended rule": 15}
EXTENDED = {"hysteresis": 2, "min_scale": 1.0}
DIAGNOSTICS = {"off": {"diagnose": False, "history": 0}, "on": {"diagnose": True, "history": 8},
               "unset": {}}


def enabled_native() -> paddle.amp.GradScaler:
    """``paddle.amp.GradScaler(init_loss_scaling=1024, incr_every_n_steps=1000)`` as its
    constructor builds it on a GPU place: the attributes of its enabled branch, with its
    values (``test_the_enabled_native_scaler_has_every_attribute_paddle_sets`` checks the
    list against Paddle's source)."""
    from paddle.amp.grad_scaler import _refresh_optimizer_state

    scaler = paddle.amp.GradScaler(enable=False)  # on a CPU place: no warning

    def flag() -> Any:
        return paddle.to_tensor(np.array([0]).astype(np.bool_))

    scaler.__dict__.update(
        _enable=True, _init_loss_scaling=1024.0, _incr_ratio=2.0, _decr_ratio=0.5,
        _incr_every_n_steps=1000, _decr_every_n_nan_or_inf=1, _incr_count=0, _decr_count=0,
        _use_dynamic_loss_scaling=True, _found_inf=flag(), _temp_found_inf_value_false=flag(),
        _temp_found_inf_fp16=flag(), _temp_found_inf_bf16=flag(), _temp_found_inf_fp32=flag(),
        _scale=paddle.to_tensor(np.array([1024.0]).astype(np.float32)), _cache_found_inf=None,
        _optimizer_states=collections.defaultdict(_refresh_optimizer_state))
    return scaler


def test_the_enabled_native_scaler_has_every_attribute_paddle_sets():
    source = inspect.getsource(paddle.amp.grad_scaler.AmpScaler.__init__)
    enabled_branch = source[source.index("if self._enable:"):]
    names = set(re.findall(r"self\.(_\w+) =", enabled_branch))
    assert names, "Paddle's constructor changed: no enabled branch found"
    assert names <= set(vars(enabled_native())), names - set(vars(enabled_native()))


def iteration_counts(make_scaler: Callable[[], Any], skip: bool) -> list[CallCounter]:
    """The calls of the scaler's verbs in two iterations after ``WARMUP`` good ones of a
    small float32 MLP on the CPU with AdamW; with ``skip``, both hold an inf gradient and
    back off the scale."""
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(),
                                 paddle.nn.Linear(16, 16), paddle.nn.ReLU(),
                                 paddle.nn.Linear(16, 1))
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    clip = paddle.nn.ClipGradByGlobalNorm(1.0)
    scaler = make_scaler()
    x = paddle.randn([4, 8])
    counted = []
    # With hysteresis 2 every second skip in a run backs off (the longer path): the
    # iterations counted are two apart, and with skip the first of the run is not counted.
    first = WARMUP + skip
    for i in range(first + 3):
        counter = CallCounter() if i in (first, first + 2) else None

        def verb(fn: Callable[..., Any], *args: Any, counter: CallCounter | None = counter
                 ) -> Any:
            return counter.run(fn, *args) if counter is not None else fn(*args)

        # Paddle's scaler turns itself off at scale() unless auto_cast's dtype is float16
        # (on a CPU place auto_cast computes in float32, with a warning, but sets it).
        with paddle.amp.auto_cast(dtype="float16"):
            loss = model(x).square().mean()
            scaled = verb(scaler.scale, loss)
        scaled.backward()
        weight = model[0].weight
        if skip and i >= WARMUP:
            poisoned = weight.grad.numpy()
            poisoned[0, 0] = np.inf
            weight.grad.set_value(poisoned)
        verb(scaler.unscale_, opt)
        clip([(p, p.grad) for p in model.parameters()])
        verb(scaler.step, opt)
        verb(scaler.update)
        opt.clear_grad()
        if counter is not None:
            counted.append(counter)
            # What was counted is what was meant: an iteration that found an inf, or not.
            found = (scaler.last_step_skipped if isinstance(scaler, ua.GradScaler)
                     else bool(scaler._found_inf.numpy()[0]))
            assert found == skip
    return counted


def _unifiedamp(config: str, diagnostics: str) -> Callable[[], Any]:
    options = {**(EXTENDED if config == "extended rule" else {}), **DIAGNOSTICS[diagnostics]}
    return lambda: ua.GradScaler(1024.0, growth_interval=1000, backend="paddle", device="cpu",
                                 **options)


CASES = [(config, diagnostics, skip) for config in MARGIN for diagnostics in DIAGNOSTICS
         for skip in (False, True)]


@pytest.fixture(scope="module")
def table() -> dict[tuple[str, str, bool], tuple[list[CallCounter], list[CallCounter]]]:
    """(config, diagnostics, skip) -> (native's two counts, unifiedamp's); printed with -s."""
    # Paddle's own skipped iteration cannot run (test_paddles_own_update_raises_at_an_overflow):
    # a skipped iteration is held to its good one, which does less (no message, no reads).
    native = iteration_counts(enabled_native, False)
    rows = {case: (native, iteration_counts(_unifiedamp(*case[:2]), case[2])) for case in CASES}
    print(f"\nPython calls per iteration (C calls in brackets), paddle {paddle.__version__}, "
          "CPU")
    for (config, diagnostics, skip), (native, ours) in rows.items():
        print(f"{config:18s} {diagnostics:5s} {'skip' if skip else 'good':4s} "
              f"{native[0].calls:4d} [{native[0].c_calls:3d}] {ours[0].calls:4d} "
              f"[{ours[0].c_calls:3d}] {ours[0].calls - native[0].calls:+5d}")
    return rows


def test_paddles_own_update_raises_at_an_overflow():
    """Paddle 3.3.1's update() after an inf prints the scale with ``float()`` of its shape-[1]
    tensor, which NumPy 2 refuses: its skipped iteration raises, so the table cannot count
    it. When this fails, Paddle works again: count its skipped iteration in ``table``."""
    with pytest.raises(TypeError, match="only 0-dimensional arrays"):
        iteration_counts(enabled_native, True)


def _by_name(counter: CallCounter) -> collections.Counter[str]:
    return collections.Counter({f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}": k
                                for code, k in counter.codes.items()})


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_a_warmed_up_iteration_counts_the_same_twice(table, case):
    native, ours = table[case]
    assert native[0].calls == native[1].calls
    assert ours[0].calls == ours[1].calls, _by_name(ours[0]) - _by_name(ours[1])


def test_the_scaler_makes_at_most_the_margin_of_python_calls_over_natives(table):
    over = [f"{config}, {'skip' if skip else 'good'}: native {native[0].calls}, unifiedamp "
            f"{ours[0].calls} (margin {MARGIN[config]}); called more than by native's: "
            f"{dict(_by_name(ours[0]) - _by_name(native[0]))}"
            for (config, diagnostics, skip), (native, ours) in table.items()
            if diagnostics == "off" and ours[0].calls > native[0].calls + MARGIN[config]]
    assert over == []


def test_diagnostics_off_cost_no_call(table):
    only_for_diagnostics = {PaddleDiagnostics._precheck.__code__}
    for (config, diagnostics, skip), (_, ours) in table.items():
        if diagnostics == "off":
            assert ours[0].calls == table[config, "unset", skip][1][0].calls, (config, skip)
        if diagnostics != "on":
            assert not only_for_diagnostics & set(ours[0].codes), (config, skip)
