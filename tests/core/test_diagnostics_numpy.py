"""Diagnostics of the NumPy scaler: overflow_report(), watch(), history() and the collapse
warning's detail (docs/diagnostics.md), on a tiny MLP with its backprop written by hand.

Each test injects inf/NaN into one named parameter's gradient of a real training step and
checks the report against NumPy on the same gradient. Paddle's are in
tests/paddle/test_diagnostics_paddle.py; the helpers both use in
tests/support/imperative_diagnostics.py.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
from imperative_diagnostics import (
    BAD_DIAGNOSE,
    BAD_HISTORY,
    INF,
    NAN,
    batch,
    expected_overflow,
    reference_history,
)

import unifiedamp as ua
from unifiedamp import spec
from unifiedamp.backends.numpy import SGD, NumpyGradScaler
from unifiedamp.diagnostics import FIXES


class NumpyMLP:
    """relu(x @ fc1.weight + fc1.bias) @ fc2.weight, with its backprop written out."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.w1 = (rng.standard_normal((4, 8)) * 0.5).astype(np.float32)
        self.b1 = np.zeros(8, np.float32)
        self.w2 = (rng.standard_normal((8, 3)) * 0.5).astype(np.float32)

    def named_parameters(self):
        return iter([("fc1.weight", self.w1), ("fc1.bias", self.b1), ("fc2.weight", self.w2)])

    def params(self):
        return [self.w1, self.b1, self.w2]

    def loss_and_grads(self, x, y, scale):
        """mean((out - y)^2) and the gradients of ``loss * scale`` (float32)."""
        with np.errstate(invalid="ignore", over="ignore"):
            pre = x @ self.w1 + self.b1
            h = np.maximum(pre, 0)
            out = h @ self.w2
            loss = np.float32(np.mean((out - y) ** 2))
            d_out = (np.float32(2 * scale / out.size) * (out - y)).astype(np.float32)
            d_h = (d_out @ self.w2.T) * (pre > 0)
            return loss, [x.T @ d_h, d_h.sum(0), h.T @ d_out]


NUMPY_INDEX = {"fc1.weight": 0, "fc1.bias": 1, "fc2.weight": 2}


def numpy_iteration(scaler, model, opt, seed=1, poison_input=None, inject=None):
    """One step: scale(loss), backprop of the scaled loss, an optional injection
    ``(name, index, value)`` into that gradient, step, update. Returns the scaled
    gradients as step() saw them."""
    loss, grads = model.loss_and_grads(*batch(seed, poison_input), scaler.get_scale())
    scaler.scale(loss)
    if inject is not None:
        name, index, value = inject
        grads[NUMPY_INDEX[name]][index] = value
    opt.grads = grads
    seen = [g.copy() for g in grads]
    scaler.step(opt)
    scaler.update()
    return seen


def numpy_setup(**options):
    model = NumpyMLP()
    opt = SGD(model.params(), lr=0.05, momentum=0.9)
    return ua.GradScaler(1024.0, backend="numpy", **options), model, opt


@pytest.mark.parametrize("value", [INF, -INF, NAN])
@pytest.mark.parametrize("diagnose", [True, False])
def test_numpy_report_names_exactly_the_poisoned_parameter(value, diagnose):
    scaler, model, opt = numpy_setup(diagnose=diagnose)
    scaler.watch(model)
    numpy_iteration(scaler, model, opt)
    assert scaler.overflow_report() is None  # a step that was not skipped
    seen = numpy_iteration(scaler, model, opt, inject=("fc2.weight", (0, 1), value))
    assert scaler.last_step_skipped
    report = scaler.overflow_report()
    assert report.names == ["fc2.weight"]
    (overflow,) = report.overflows
    unscaled = seen[2] * np.float32(1 / 1024.0)  # what unscale_ left in opt.grads
    assert (overflow.inf, overflow.nan, overflow.max_finite) == expected_overflow(unscaled)
    assert (overflow.inf, overflow.nan) == ((0, 1) if np.isnan(value) else (1, 0))
    assert overflow.max_finite > 0 and overflow.shape == (8, 3)
    assert (report.step, report.scale, report.checked) == (2, 1024.0, 3)
    assert report.loss_finite is True and report.note == ""
    assert scaler.overflow_report() is report  # computed once, kept
    numpy_iteration(scaler, model, opt, seed=2)
    assert scaler.overflow_report() is None  # the last update did not skip


def test_numpy_unwatched_names_are_optimizer_indices_and_watch_takes_pairs_and_dicts():
    scaler, model, opt = numpy_setup()
    numpy_iteration(scaler, model, opt, inject=("fc1.bias", 3, NAN))
    assert scaler.overflow_report().names == ["params[1]"]
    for how in (lambda m: list(m.named_parameters()), lambda m: dict(m.named_parameters()),
                lambda m: m):
        scaler, model, opt = numpy_setup()
        scaler.watch(how(model))
        numpy_iteration(scaler, model, opt, inject=("fc1.bias", 3, NAN))
        assert scaler.overflow_report().names == ["fc1.bias"]
    # by identity: a copy of an array is not the optimizer's parameter
    scaler, model, opt = numpy_setup()
    scaler.watch({"fc1.bias": model.b1.copy(), "fc2.weight": model.w2})
    numpy_iteration(scaler, model, opt, inject=("fc1.bias", 3, NAN))
    numpy_iteration(scaler, model, opt, inject=("fc2.weight", 0, INF))
    assert scaler.overflow_report().names == ["fc2.weight"]
    numpy_iteration(scaler, model, opt, inject=("fc1.bias", 0, INF))
    assert scaler.overflow_report().names == ["params[1]"]


def test_numpy_several_poisoned_parameters_are_listed_in_parameter_order():
    scaler, model, opt = numpy_setup()
    scaler.watch(model)
    loss, grads = model.loss_and_grads(*batch(), scaler.get_scale())
    grads[2][1, 1] = NAN
    grads[0][0] = INF  # a whole row of fc1.weight
    opt.grads = grads
    scaler.step(opt)
    scaler.update()
    report = scaler.overflow_report()
    assert report.names == ["fc1.weight", "fc2.weight"]
    assert [(o.inf, o.nan) for o in report.overflows] == [(8, 0), (0, 1)]
    assert report.loss_finite is None  # scale() was not called this iteration


def test_numpy_report_after_zero_grad_is_kept_with_diagnose_and_gone_without():
    for diagnose in (True, False):
        scaler, model, opt = numpy_setup(diagnose=diagnose)
        scaler.watch(model)
        numpy_iteration(scaler, model, opt, inject=("fc2.weight", (2, 0), INF))
        opt.zero_grad()
        report = scaler.overflow_report()
        if diagnose:
            assert report.names == ["fc2.weight"] and report.checked == 3
        else:
            assert report.names == [] and report.checked == 0
            assert "zero_grad" in report.note and "diagnose=True" in report.note
            assert report.step == 1 and report.scale == 1024.0


def test_numpy_report_without_diagnose_reads_the_gradients_when_asked():
    scaler, model, opt = numpy_setup()
    numpy_iteration(scaler, model, opt, inject=("fc2.weight", (2, 0), INF))
    opt.grads[2][2, 0] = 0.0  # changed after the update, before the report was asked for
    report = scaler.overflow_report()
    assert report.names == [] and report.note.startswith(
        "No gradient holds inf/NaN any more: they changed after the skipped update. Build "
        "the scaler with diagnose=True")


def test_numpy_non_finite_loss_is_reported_and_ends_the_collapse_warning():
    scaler, model, opt = numpy_setup(max_consecutive_skips=2)
    scaler.watch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one skip is no collapse
        numpy_iteration(scaler, model, opt, poison_input=NAN)
    report = scaler.overflow_report()
    assert report.loss_finite is False
    assert report.names == ["fc1.weight", "fc1.bias", "fc2.weight"]
    assert "the model, not the scale, is the problem" in str(report)
    with pytest.warns(ua.ScaleCollapseWarning) as record:
        numpy_iteration(scaler, model, opt, poison_input=NAN)
    (warning,) = record
    message = str(warning.message)
    assert message.endswith(f"Last overflow: {scaler.overflow_report().summary()}. "
                            f"{scaler.overflow_report().cause()}")
    assert "Last overflow: step 2 at scale 512: fc1.weight (0 inf, " in message
    assert "The loss itself was inf/NaN before scaling" in message and FIXES in message


def test_numpy_collapse_warning_names_the_gradient_when_the_loss_was_finite():
    scaler, model, opt = numpy_setup(max_consecutive_skips=2, on_collapse="raise")
    numpy_iteration(scaler, model, opt, inject=("fc1.bias", 0, INF))
    with pytest.raises(ua.ScaleCollapseError,
                       match=r"Last overflow: step 2 at scale 512: params\[1\] \(1 inf, 0 NaN\)\. "
                             r"The loss was finite before scaling"):
        numpy_iteration(scaler, model, opt, inject=("fc1.bias", 0, INF))
    # raised after the update was applied: the next iteration runs
    numpy_iteration(scaler, model, opt)
    assert scaler.get_scale() == 256.0 and not scaler.last_step_skipped


SCHEDULE = [None, ("fc2.weight", (0, 1), INF), None, None, ("fc1.bias", 2, NAN),
            ("fc1.weight", (3, 3), -INF), None, None, None, ("fc2.weight", (7, 2), NAN),
            None, None, None]


def numpy_run(**options):
    scaler, model, opt = numpy_setup(growth_interval=2, hysteresis=2, **options)
    if options.get("diagnose"):
        scaler.watch(model)
    scales = []
    for step, inject in enumerate(SCHEDULE):
        numpy_iteration(scaler, model, opt, seed=step, inject=inject)
        if options:  # asking for the report changes nothing either
            scaler.overflow_report()
        scales.append(scaler.get_scale())
        opt.zero_grad()
    return scaler, scales, [p.copy() for p in model.params()] + [v.copy() for v in opt.velocity]


def test_numpy_diagnose_and_history_change_no_scale_and_no_weight():
    _, scales, weights = numpy_run()
    _, scales_on, weights_on = numpy_run(diagnose=True, history=4)
    assert scales == scales_on and len(set(scales)) > 2
    for a, b in zip(weights, weights_on, strict=True):
        assert a.tobytes() == b.tobytes()


def reference_state(config, skips):
    """The spec's state after ``skips``."""
    state = spec.ScalerState.initial(config)
    for skipped in skips:
        state = spec.update(config, state, skipped)
    return state


def test_numpy_history_wraps_around_like_the_spec_step_by_step():
    scaler, model, opt = numpy_setup(growth_interval=2, hysteresis=2, history=5)
    assert scaler.history().as_list() == []
    skips = [inject is not None for inject in SCHEDULE]
    reference = reference_history(scaler.config, skips)
    for step, inject in enumerate(SCHEDULE):
        numpy_iteration(scaler, model, opt, seed=step, inject=inject)
        assert scaler.history().as_list() == reference[max(0, step - 4):step + 1], step
    arrays = scaler.history().as_arrays()
    assert arrays["iteration"].tolist() == [9, 10, 11, 12, 13]
    # a manual set is not an update: not recorded
    scaler.update(3.0)
    assert scaler.history().as_list() == reference[-5:]
    assert scaler.overflow_report() is None
    numpy_iteration(scaler, model, opt)
    # the next update's record: the scale it left, what get_scale() says after it
    assert scaler.history().as_list()[-1] == (14, scaler.get_scale(), False)
    assert scaler.get_scale() == spec.update(scaler.config, spec.ScalerState(
        3.0, *reference_state(scaler.config, skips)[1:]), False).scale


def test_numpy_manual_set_after_a_skip_leaves_no_report_as_on_torch():
    scaler, model, opt = numpy_setup()
    numpy_iteration(scaler, model, opt, inject=("fc2.weight", (0, 1), INF))
    assert scaler.overflow_report().names == ["params[2]"]
    scaler.update(3.0)
    assert scaler.overflow_report() is None


def test_numpy_copy_keeps_the_report_and_history_not_the_optimizer():
    scaler, model, opt = numpy_setup(history=4)
    scaler.watch({"fc2.weight": model.params()[2]})
    numpy_iteration(scaler, model, opt, inject=("fc2.weight", (0, 1), INF))
    opt.unpicklable = lambda: None  # a copy must not try to carry the optimizer
    for clone in (copy.deepcopy(scaler), pickle.loads(pickle.dumps(scaler))):
        assert clone.overflow_report() == scaler.overflow_report()
        assert clone.overflow_report().names == ["fc2.weight"]
        assert clone.history().as_list() == scaler.history().as_list()
        assert clone._last.optimizers == [] and clone._watched == {}


def test_numpy_pickle_of_the_previous_release_keeps_its_history_and_report():
    # The previous release kept the ring as one tuple _ring and the scale() input as
    # _last_output; its pickles still load.
    scaler, model, opt = numpy_setup(history=4)
    numpy_iteration(scaler, model, opt, inject=("fc2.weight", (0, 1), INF))
    old = scaler.__getstate__()
    old["_ring"] = (old.pop("_ring_iterations"), old.pop("_ring_scales"),
                    old.pop("_ring_skipped"))
    old["_last_output"] = old.pop("_scale_input")
    clone = NumpyGradScaler.__new__(NumpyGradScaler)
    clone.__setstate__(old)
    assert clone.history().as_list() == scaler.history().as_list() == [(1, 512.0, True)]
    assert clone.overflow_report() == scaler.overflow_report()
    numpy_iteration(clone, model, opt)
    assert len(clone.history()) == 2 and clone.state.scale == 512.0


def test_numpy_history_zero_raises_and_disabled_records_nothing():
    scaler, _, _ = numpy_setup()
    with pytest.raises(ValueError, match=r"history=N"):
        scaler.history()
    scaler = ua.GradScaler(enabled=False, history=3, backend="numpy")
    model = NumpyMLP()
    opt = SGD(model.params())
    numpy_iteration(scaler, model, opt, inject=("fc1.bias", 0, INF))
    assert scaler.history().as_list() == [] and scaler.overflow_report() is None


def test_numpy_several_optimizers_are_told_apart():
    model = NumpyMLP()
    first, second = SGD([model.w1, model.b1]), SGD([model.w2])
    scaler = ua.GradScaler(1024.0, backend="numpy")
    _, grads = model.loss_and_grads(*batch(), 1024.0)
    grads[2][0, 0] = INF
    first.grads, second.grads = grads[:2], grads[2:]
    scaler.step(first)
    scaler.step(second)
    scaler.update()
    report = scaler.overflow_report()
    assert report.names == ["optimizers[1].params[0]"] and report.checked == 3




@pytest.mark.parametrize("options", [{"diagnose": v} for v in BAD_DIAGNOSE]
                         + [{"history": v} for v in BAD_HISTORY], ids=repr)
def test_numpy_bad_options_are_refused_before_anything_is_built(options):
    (name, value), = options.items()
    # checked first: an invalid init_scale is not what the message is about
    with pytest.raises((TypeError, ValueError), match=f"{name} must be .*got {value!r:.5}") as info:
        NumpyGradScaler(-1.0, **options)
    assert ("history=1000" if name == "history" else "diagnose=True") in str(info.value)


def test_numpy_bad_watch_changes_nothing():
    scaler, model, opt = numpy_setup()
    scaler.watch({"fc1.bias": model.b1})
    for bad in (42, [("fc2.weight", model.w2), ("oops", [1.0])], [(1, model.w2)],
                {"fc2.weight": model.w2, "x": "not an array"}):
        with pytest.raises(TypeError, match="watch"):
            scaler.watch(bad)
    numpy_iteration(scaler, model, opt, inject=("fc2.weight", 0, INF))
    assert scaler.overflow_report().names == ["params[2]"]  # no pair of a bad call was kept
    numpy_iteration(scaler, model, opt, inject=("fc1.bias", 0, INF))
    assert scaler.overflow_report().names == ["fc1.bias"]


def test_numpy_tiny_scale_note():
    scaler = ua.GradScaler(1e-45, backend="numpy", max_consecutive_skips=None)
    opt = SGD([np.ones(2, np.float32)])
    opt.grads = [np.ones(2, np.float32)]
    with pytest.warns(ua.ScaleCollapseWarning):
        scaler.step(opt)
        scaler.update()
    report = scaler.overflow_report()
    assert report.names == ["params[0]"] and "1/scale overflows float32" in report.note
