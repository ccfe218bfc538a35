"""Diagnostics of the Paddle scaler: overflow_report(), watch(), history() and the collapse
warning's detail (docs/diagnostics.md), with Paddle's autodiff.

Each test injects inf/NaN into one named parameter's gradient of a real training step and
checks the report against NumPy on the same gradient. NumPy's scaler has the same checks in
tests/core/test_diagnostics_numpy.py; the helpers both use are in
tests/support/imperative_diagnostics.py.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from imperative_diagnostics import (  # noqa: E402
    BAD_DIAGNOSE,
    BAD_HISTORY,
    INF,
    NAN,
    batch,
    expected_overflow,
    reference_history,
)

import unifiedamp as ua  # noqa: E402
from unifiedamp.diagnostics import FIXES, count_overflow  # noqa: E402


def paddle_model(seed=0):
    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc1 = paddle.nn.Linear(4, 8)
            self.fc2 = paddle.nn.Linear(8, 3)

        def forward(self, x):
            return self.fc2(paddle.nn.functional.relu(self.fc1(x)))

    paddle.seed(seed)
    return Net()


def paddle_opt(kind, model):
    if kind == "sgd":
        return paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    return paddle.optimizer.Adam(learning_rate=1e-2, parameters=model.parameters())


def paddle_iteration(scaler, model, opt, seed=1, poison_input=None, inject=None, clear=True):
    """scale(loss).backward(), an optional injection ``(name, index, value)`` into that
    parameter's gradient, step, update, clear_grad. Returns the injected gradient as
    step() saw it (scaled), or None."""
    x, y = (paddle.to_tensor(a) for a in batch(seed, poison_input))
    scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
    seen = None
    if inject is not None:
        name, index, value = inject
        param = dict(model.named_parameters())[name]
        seen = param.grad.numpy()
        seen[index] = value
        param.grad.set_value(seen)
    scaler.step(opt)
    scaler.update()
    if clear:
        opt.clear_grad()
    return seen


def paddle_setup(kind="sgd", **options):
    model = paddle_model()
    return ua.GradScaler(1024.0, backend="paddle", **options), model, paddle_opt(kind, model)


@pytest.mark.parametrize("value", [INF, NAN])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_paddle_report_names_exactly_the_poisoned_parameter(kind, value):
    scaler, model, opt = paddle_setup(kind, diagnose=True)
    scaler.watch(model)
    paddle_iteration(scaler, model, opt)
    assert scaler.overflow_report() is None
    seen = paddle_iteration(scaler, model, opt, inject=("fc2.weight", (0, 1), value))
    assert scaler.last_step_skipped
    report = scaler.overflow_report()  # after clear_grad: computed at update()
    assert report.names == ["fc2.weight"]
    (overflow,) = report.overflows
    unscaled = seen * np.float32(1 / 1024.0)
    assert (overflow.inf, overflow.nan, overflow.max_finite) == expected_overflow(unscaled)
    assert (overflow.inf, overflow.nan) == ((1, 0) if value == INF else (0, 1))
    assert overflow.max_finite > 0 and overflow.shape == (8, 3)
    assert (report.step, report.scale, report.checked, report.loss_finite) == (2, 1024.0, 4, True)
    assert scaler.overflow_report() is report
    paddle_iteration(scaler, model, opt, seed=2)
    assert scaler.overflow_report() is None


def test_paddle_report_without_diagnose_reads_what_the_cpu_kernel_left():
    # Paddle's CPU kernel multiplies the gradients by 0 once it finds inf/NaN: asked
    # before clear_grad, the report names the right parameter from what is left,
    # says so, and matches NumPy on the gradient as stored.
    scaler, model, opt = paddle_setup("adam")
    scaler.watch(model)
    paddle_iteration(scaler, model, opt, inject=("fc2.weight", (0, 1), INF), clear=False)
    report = scaler.overflow_report()
    assert report.names == ["fc2.weight"]
    stored = model.fc2.weight.grad.numpy()
    assert report.overflows[0] == count_overflow("fc2.weight", stored)
    assert (report.overflows[0].inf, report.overflows[0].nan) == (0, 1)
    assert "CPU kernel" in report.note and "diagnose=True" in report.note
    # asked after clear_grad (which zeroes the gradients): nothing left to name
    scaler, model, opt = paddle_setup("adam")
    paddle_iteration(scaler, model, opt, inject=("fc2.weight", (0, 1), INF))
    report = scaler.overflow_report()
    assert report.names == [] and report.checked == 4 and "diagnose=True" in report.note
    # clear_grad(set_to_zero=False) removes them
    scaler, model, opt = paddle_setup("sgd")
    paddle_iteration(scaler, model, opt, inject=("fc2.weight", (0, 1), INF), clear=False)
    opt.clear_grad(set_to_zero=False)
    report = scaler.overflow_report()
    assert report.names == [] and report.checked == 0 and "cleared" in report.note


def test_paddle_float64_gradients_are_reported_exactly_without_diagnose():
    # float64 gradients go through the elementwise path, which leaves them readable.
    paddle.set_default_dtype("float64")
    try:
        model = paddle_model()
        opt = paddle_opt("sgd", model)
        scaler = ua.GradScaler(1024.0, backend="paddle")
        x, y = (paddle.to_tensor(a.astype(np.float64)) for a in batch())
        scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
    finally:
        paddle.set_default_dtype("float32")
    seen = model.fc1.bias.grad.numpy()
    seen[5] = -INF
    model.fc1.bias.grad.set_value(seen)
    scaler.step(opt)
    scaler.update()
    (overflow,) = scaler.overflow_report().overflows
    assert overflow.name == "param_groups[0][1]" and overflow.shape == (8,)
    assert (overflow.inf, overflow.nan, overflow.max_finite) == expected_overflow(
        seen * np.float64(np.float32(1 / 1024.0)))
    # Asked after the next iteration's clear_grad() (a copy asks now: the kept report).
    later = copy.deepcopy(scaler)
    scaler._last.report = None
    opt.clear_grad(set_to_zero=True)
    note = scaler.overflow_report().note
    assert note.startswith("No gradient holds inf/NaN any more: they changed after the skipped "
                           "update (clear_grad() zeroes them). Build"), note
    assert list(later.overflow_report().overflows) == [overflow]


def test_paddle_unwatched_names_follow_the_param_groups():
    scaler, model, opt = paddle_setup(diagnose=True)
    paddle_iteration(scaler, model, opt, inject=("fc2.bias", 2, NAN))
    assert scaler.overflow_report().names == ["param_groups[0][3]"]
    grouped = paddle.optimizer.SGD(learning_rate=0.1, parameters=[
        {"params": [model.fc1.weight, model.fc1.bias]},
        {"params": [model.fc2.weight, model.fc2.bias], "learning_rate": 0.5}])
    scaler = ua.GradScaler(1024.0, backend="paddle", diagnose=True)
    paddle_iteration(scaler, model, grouped, inject=("fc2.bias", 2, NAN))
    assert scaler.overflow_report().names == ["param_groups[1][1]"]
    # named by identity, pairs or a dict
    for watched in (list(model.named_parameters()), {"last bias": model.fc2.bias}):
        scaler = ua.GradScaler(1024.0, backend="paddle", diagnose=True)
        scaler.watch(watched)
        paddle_iteration(scaler, model, grouped, inject=("fc2.bias", 2, NAN))
        assert scaler.overflow_report().names == [
            "fc2.bias" if isinstance(watched, list) else "last bias"]


def test_paddle_several_optimizers_are_told_apart():
    scaler, model, _ = paddle_setup(diagnose=True)
    first = paddle.optimizer.SGD(parameters=model.fc1.parameters())
    second = paddle.optimizer.Adam(parameters=model.fc2.parameters())
    x, y = (paddle.to_tensor(a) for a in batch())
    scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
    grad = model.fc1.weight.grad.numpy()
    grad[1, 1] = INF
    model.fc1.weight.grad.set_value(grad)
    scaler.step(first)
    scaler.step(second)
    scaler.update()
    report = scaler.overflow_report()
    assert report.names == ["optimizers[0].param_groups[0][0]"] and report.checked == 4


def test_paddle_non_finite_loss_is_reported_and_ends_the_collapse_warning():
    scaler, model, opt = paddle_setup(max_consecutive_skips=2)
    scaler.watch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ua.ScaleCollapseWarning)
        paddle_iteration(scaler, model, opt, poison_input=NAN)
    report = scaler.overflow_report()  # after clear_grad: the loss is still known
    assert report.loss_finite is False
    with pytest.warns(ua.ScaleCollapseWarning) as record:
        paddle_iteration(scaler, model, opt, poison_input=NAN)
    message = str(record[0].message)
    report = scaler.overflow_report()
    assert message.endswith(f"Last overflow: {report.summary()}. {report.cause()}")
    assert "Last overflow: step 2 at scale 512: fc1.weight (" in message
    assert "The loss itself was inf/NaN before scaling" in message and FIXES in message


def test_paddle_collapse_warning_with_a_finite_loss_names_the_gradient():
    scaler, model, opt = paddle_setup(max_consecutive_skips=2, on_collapse="raise",
                                      diagnose=True)
    scaler.watch(model)
    paddle_iteration(scaler, model, opt, inject=("fc1.bias", 0, INF))
    with pytest.raises(ua.ScaleCollapseError, match=r"Last overflow: step 2 at scale 512: "
                       r"fc1\.bias \(1 inf, 0 NaN\)\. The loss was finite"):
        paddle_iteration(scaler, model, opt, inject=("fc1.bias", 0, INF), clear=False)
    opt.clear_grad()
    paddle_iteration(scaler, model, opt)  # raised after the update: the next one runs
    assert scaler.get_scale() == 256.0 and not scaler.last_step_skipped


PADDLE_SCHEDULE = [None, ("fc2.weight", (0, 1), INF), None, None, ("fc1.bias", 2, NAN),
                   ("fc1.weight", (3, 3), -INF), None, None, None, ("fc2.bias", 1, NAN),
                   None, None, None]


def paddle_run(**options):
    scaler, model, opt = paddle_setup("adam", growth_interval=2, hysteresis=2, **options)
    scaler.watch(model)
    scales, histories = [], []
    for step, inject in enumerate(PADDLE_SCHEDULE):
        paddle_iteration(scaler, model, opt, seed=step, inject=inject)
        scaler.overflow_report()  # asking changes nothing
        scales.append(scaler.get_scale())
        if options.get("history"):
            histories.append(scaler.history().as_list())
    weights = [p.numpy().copy() for p in model.parameters()]
    return scaler, scales, weights, histories


def test_paddle_diagnose_and_history_change_no_scale_and_no_weight_and_history_is_the_spec():
    _, scales, weights, _ = paddle_run()
    scaler, scales_on, weights_on, histories = paddle_run(diagnose=True, history=5)
    assert scales == scales_on and len(set(scales)) > 2
    for a, b in zip(weights, weights_on, strict=True):
        assert a.tobytes() == b.tobytes()
    reference = reference_history(scaler.config, [i is not None for i in PADDLE_SCHEDULE])
    for step, history in enumerate(histories):
        assert history == reference[max(0, step - 4):step + 1], step
    # the ring survives a copy, and the copy's is its own
    for clone in (copy.deepcopy(scaler), pickle.loads(pickle.dumps(scaler))):
        assert clone.history().as_list() == reference[-5:]
        assert clone.overflow_report() is None
        clone.update(1.0)
    scaler.update(3.0)  # a manual set is not recorded, and no report after it
    assert scaler.history().as_list() == reference[-5:]
    assert scaler.overflow_report() is None


def test_paddle_report_survives_a_copy_and_the_copy_forgets_watch():
    scaler, model, opt = paddle_setup(diagnose=True)
    scaler.watch(model)
    paddle_iteration(scaler, model, opt, inject=("fc2.weight", 0, INF))
    report = scaler.overflow_report()
    clone = pickle.loads(pickle.dumps(scaler))
    assert clone.overflow_report() == report
    paddle_iteration(clone, model, opt, inject=("fc2.weight", 0, INF))
    assert clone.overflow_report().names == ["param_groups[0][2]"]


def test_paddle_pickle_of_the_previous_release_still_loads():
    # The previous release pickled its __dict__: Paddle's attribute names and its own
    # (_scale, _factors, _optimizer_states, _last_output...), besides what a copy keeps now.
    scaler, model, opt = paddle_setup(history=3)
    paddle_iteration(scaler, model, opt, inject=("fc2.weight", 0, INF))
    old = {**scaler.__getstate__(), "_scale": None, "_process_group": None, "_factors": {},
           "_optimizer_states": None, "_functional_found_inf": [], "_iteration_thread": None,
           "_found_inf": False, "_cache_found_inf": True, "_watched": {}, "_checked": {},
           "_prechecked": {}, "_last_output": None, "_enable": True, "_incr_count": 0,
           "_decr_count": 0}
    clone = type(scaler).__new__(type(scaler))
    clone.__setstate__(old)
    assert clone.state == scaler.state and clone.num_skipped_steps == 1
    assert clone.history().as_list() == scaler.history().as_list()
    assert clone.overflow_report() == scaler.overflow_report()
    assert clone._cache_found_inf is True and clone._scale.item() == scaler.get_scale()
    paddle_iteration(clone, model, opt)
    assert len(clone.history()) == 2


def test_paddle_history_zero_raises():
    scaler, _, _ = paddle_setup()
    with pytest.raises(ValueError, match=r"history=N"):
        scaler.history()


def test_paddle_watch_report_and_history_on_a_linear_layer():
    # The members are shared with NumPy (backends/_imperative.py), whose examples their
    # docstrings show; these are Paddle's, on the smallest model.
    from unifiedamp.backends.paddle import PaddleGradScaler

    def step(scaler, model, opt, x, clear=True):
        scaler.scale(model(x).sum()).backward()  # d(out)/d(weight) = x
        scaler.step(opt)
        scaler.update()
        if clear:
            opt.clear_grad()

    model = paddle.nn.Linear(2, 1)
    opt = paddle.optimizer.SGD(parameters=model.parameters())
    scaler = PaddleGradScaler(8.0)
    scaler.watch(model)
    step(scaler, model, opt, paddle.to_tensor([[INF, 1.0]]), clear=False)
    assert scaler.overflow_report().names == ["weight"]
    opt.clear_grad()

    scaler = PaddleGradScaler(8.0, diagnose=True)
    step(scaler, model, opt, paddle.to_tensor([[NAN, 1.0]]))
    assert str(scaler.overflow_report()).splitlines()[:2] == [
        "Step 1 was skipped at scale 8: 1 of 2 gradients held inf/NaN.",
        "  param_groups[0][0] (2, 1): 0 inf, 1 NaN, largest finite |g| 1"]
    assert scaler.overflow_report().loss_finite is False

    scaler = PaddleGradScaler(8.0, history=2)
    for poison in (1.0, INF, 1.0):
        step(scaler, model, opt, paddle.full([1, 2], poison))
    assert scaler.history().as_list() == [(2, 4.0, True), (3, 4.0, False)]


@pytest.mark.parametrize("options", [{"diagnose": v} for v in BAD_DIAGNOSE]
                         + [{"history": v} for v in BAD_HISTORY], ids=repr)
def test_paddle_bad_options_are_refused_before_anything_is_built(options):
    (name, value), = options.items()
    # checked first: neither the bad device nor the bad init_scale is reached
    with pytest.raises((TypeError, ValueError), match=f"{name} must be .*got {value!r:.5}"):
        ua.GradScaler(-1.0, device="nowhere", backend="paddle", **options)


def test_paddle_bad_watch_changes_nothing():
    scaler, model, opt = paddle_setup(diagnose=True)
    scaler.watch({"b1": model.fc1.bias})
    for bad in (42, [("fc2.weight", model.fc2.weight), ("x", np.ones(2))],
                [(0, model.fc2.weight)]):
        with pytest.raises(TypeError, match="watch"):
            scaler.watch(bad)
    paddle_iteration(scaler, model, opt, inject=("fc2.weight", 0, INF))
    assert scaler.overflow_report().names == ["param_groups[0][2]"]
    paddle_iteration(scaler, model, opt, inject=("fc1.bias", 0, INF))
    assert scaler.overflow_report().names == ["b1"]
