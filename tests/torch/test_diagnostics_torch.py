"""The torch backend's diagnostics: ``overflow_report()``, ``watch()``, ``history()``,
``diagnose=`` and the collapse warning's detail, on real models, optimizers and autograd.

An inf or NaN is written into exactly one parameter's gradient after ``backward()``
(the scaled gradients), and the report must name exactly that parameter with the
counts NumPy finds in the same gradient."""

from __future__ import annotations

import copy
import math
import pickle
import random
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_helpers import DEVICES, CountOps  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.backends.torch import TorchGradScaler  # noqa: E402
from unifiedamp.backends.torch._diagnostics import (  # noqa: E402
    DIAGNOSTICS_ATTRIBUTES,
    TorchDiagnostics,
    scale_before_skip,
)
from unifiedamp.diagnostics import FIXES, count_overflow  # noqa: E402
from unifiedamp.errors import ScaleCollapseWarning  # noqa: E402

OPTIMIZERS = ["foreach", "fused"]
#: A config torch's kernel runs, and one the tensor-op rule runs.
CONFIGS = {"torch-kernel": {}, "rule": {"hysteresis": 2, "min_scale": 1.0}}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def setup(device="cpu", kind="foreach", seed=0, **options):
    torch.manual_seed(seed)
    model = Net().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=kind == "fused",
                            foreach=None if kind == "fused" else True)
    scaler = ua.GradScaler(1024.0, backend="torch", device=device, **options)
    return model, opt, scaler


def inputs(device="cpu", seed=1, poison=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, generator=g)
    if poison is not None:
        x[0, 0] = poison
    return x.to(device)


def iteration(model, opt, scaler, x, inject=None, zero_grad=True):
    """One training iteration; ``inject(model)`` edits the scaled gradients after backward.
    Returns copies of the gradients as they were after update(), by name."""
    loss = model(x).pow(2).mean()
    scaler.scale(loss).backward()
    if inject is not None:
        with torch.no_grad():
            inject(model)
    scaler.step(opt)
    scaler.update()
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    if zero_grad:
        opt.zero_grad(set_to_none=True)
    return grads


def poison_fc2_weight(value):
    def inject(model):
        model.fc2.weight.grad[0, 1] = value
        model.fc2.weight.grad[2, 4] = value
    return inject


# ---------------------------------------------------------------- where it overflowed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize("diagnose", [False, True], ids=["lazy", "diagnose"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_the_report_names_exactly_the_poisoned_parameter(device, kind, diagnose, value):
    model, opt, scaler = setup(device, kind, diagnose=diagnose)
    scaler.watch(model)
    iteration(model, opt, scaler, inputs(device))
    assert scaler.overflow_report() is None  # a step that was not skipped
    grads = iteration(model, opt, scaler, inputs(device, seed=2), poison_fc2_weight(value),
                      zero_grad=diagnose)  # the lazy report reads the gradients when asked
    report = scaler.overflow_report()
    assert report.names == ["fc2.weight"]
    assert report.overflows[0] == count_overflow("fc2.weight", grads["fc2.weight"].numpy())
    got = report.overflows[0]
    assert got.shape == (3, 5)
    assert (got.inf, got.nan) == ((0, 2) if math.isnan(value) else (2, 0))
    finite = grads["fc2.weight"].numpy()
    assert got.max_finite == float(np.abs(finite[np.isfinite(finite)]).max()) > 0
    assert report.step == 2 and report.scale == 1024.0 and report.checked == 4
    assert report.loss_finite is True
    assert "loss was finite" in report.cause()
    # The report changed nothing: the step was skipped and the scale backed off as usual.
    assert scaler.last_step_skipped and scaler.get_scale() == 512.0
    # Kept until the next update, and gone after it.
    assert scaler.overflow_report() is report
    opt.zero_grad(set_to_none=True)
    iteration(model, opt, scaler, inputs(device, seed=3))
    assert scaler.overflow_report() is None


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_building_the_report_leaves_the_gradients_bit_identical(kind):
    model, opt, scaler = setup(kind=kind, diagnose=True)
    scaler.scale(model(inputs()).pow(2).mean()).backward()
    model.fc2.weight.grad[0, 1] = -math.inf
    model.fc1.bias.grad[2] = math.nan
    scaler.step(opt)
    before = [p.grad.clone() for p in model.parameters()]
    scaler.update()  # builds the report
    assert scaler.overflow_report().names == ["param_groups[0][1]", "param_groups[0][2]"]
    for grad, copy_ in zip((p.grad for p in model.parameters()), before, strict=True):
        torch.testing.assert_close(grad, copy_, rtol=0, atol=0, equal_nan=True)


def test_a_gradient_whose_sum_overflows_but_holds_no_inf_is_not_reported():
    model, opt, _ = setup()
    scaler = TorchGradScaler(1.0, device="cpu", diagnose=True)  # unscaling keeps 3e38
    scaler.scale(model(inputs()).pow(2).mean()).backward()
    model.fc1.weight.grad.fill_(3e38)  # finite, with a sum that is inf in float32
    model.fc2.bias.grad[0] = math.inf
    scaler.step(opt)
    scaler.update()
    assert scaler.overflow_report().names == ["param_groups[0][3]"]


def test_the_gradient_is_counted_as_stored_unscaled_after_a_plain_step():
    model, opt, scaler = setup(diagnose=True)
    scaler.watch(model)
    grads = iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.inf))
    report = scaler.overflow_report()
    # The stored gradient was divided by the scale (1024) by unscale_.
    assert report.overflows[0].max_finite == float(
        np.abs(np.nan_to_num(grads["fc2.weight"].numpy(), posinf=0)).max())
    assert "fused" not in report.note


def test_a_fused_optimizers_gradients_stay_scaled_and_the_note_says_so():
    model, opt, scaler = setup(kind="fused", diagnose=True)
    scaler.watch(model)
    loss = model(inputs()).pow(2).mean()
    scaler.scale(loss).backward()
    scaled = model.fc2.weight.grad.clone()
    model.fc2.weight.grad[0, 0] = math.inf
    scaler.step(opt)
    scaler.update()
    report = scaler.overflow_report()
    assert report.overflows[0].max_finite == float(scaled.flatten()[1:].abs().max())
    assert "still multiplied by the scale" in report.note


def test_names_without_watch_are_group_and_index_and_several_optimizers_are_told_apart():
    model, _, scaler = setup()
    opt = torch.optim.SGD([{"params": model.fc1.parameters()},
                           {"params": model.fc2.parameters()}], lr=0.1)
    iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.inf), zero_grad=False)
    assert scaler.overflow_report().names == ["param_groups[1][0]"]

    model, _, scaler = setup()
    opt1 = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(model.fc2.parameters(), lr=0.1)
    scaler.scale(model(inputs()).sum()).backward()
    model.fc2.bias.grad[1] = math.nan
    model.fc1.weight.grad[0, 0] = -math.inf
    scaler.step(opt1)
    scaler.step(opt2)
    scaler.update()
    scaler.watch([("head.bias", model.fc2.bias)])  # before the report is built: used
    assert scaler.overflow_report().names == ["optimizers[0].param_groups[0][0]", "head.bias"]


def test_checked_counts_the_gradients_that_exist():
    model, opt, scaler = setup(diagnose=True)
    scaler.watch(model)
    model.fc1.bias.requires_grad_(False)  # no gradient: not looked at
    iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.inf))
    assert scaler.overflow_report().checked == 3


def test_the_lazy_report_after_zero_grad_lists_none_and_says_why():
    model, opt, scaler = setup()
    scaler.watch(model)
    iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.inf))  # zero_grad too
    report = scaler.overflow_report()
    assert report.overflows == () and report.checked == 0
    assert "diagnose=True" in report.note and report.step == 1 and report.scale == 1024.0


def test_diagnose_keeps_the_report_past_zero_grad_and_the_next_scale():
    model, opt, scaler = setup(diagnose=True)
    scaler.watch(model)
    iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.nan))
    scaler.scale(model(inputs()).sum())  # the next iteration has begun
    assert scaler.overflow_report().names == ["fc2.weight"]
    assert scaler.overflow_report().loss_finite is True


def test_a_nonfinite_loss_is_reported_as_the_models_fault():
    model, opt, scaler = setup(diagnose=True)
    scaler.watch(model)
    iteration(model, opt, scaler, inputs(poison=math.nan))
    report = scaler.overflow_report()
    assert report.loss_finite is False
    assert set(report.names) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert "loss itself was inf/NaN" in report.cause() and FIXES in report.cause()


def test_a_finite_float16_loss_whose_scaled_value_overflows_is_finite_before_scaling():
    # 60000 * 1024 is inf in float16: the scaled loss and the gradient are not finite,
    # the loss was.
    param = torch.nn.Parameter(torch.ones(()))
    opt = torch.optim.SGD([param], lr=0.1)
    scaler = TorchGradScaler(1024.0, device="cpu", diagnose=True)
    scaled = scaler.scale(param.to(torch.float16) * 60000.0)
    assert scaled.dtype == torch.float16 and not torch.isfinite(scaled)
    scaled.backward()
    scaler.step(opt)
    scaler.update()
    report = scaler.overflow_report()
    assert report.loss_finite is True and report.names == ["param_groups[0][0]"]


def test_a_list_of_losses_leaves_loss_finite_unknown():
    model, opt, scaler = setup(diagnose=True)
    out = model(inputs())
    for scaled in scaler.scale([out[:, 0].sum(), out[:, 1].sum()]):
        scaled.backward(retain_graph=True)
    model.fc1.bias.grad[0] = math.inf
    scaler.step(opt)
    scaler.update()
    assert scaler.overflow_report().loss_finite is None


@pytest.mark.parametrize("diagnose", [False, True], ids=["lazy", "diagnose"])
def test_no_report_before_an_update_after_a_manual_update_or_when_disabled(diagnose):
    model, opt, scaler = setup(diagnose=diagnose)
    assert scaler.overflow_report() is None
    iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.inf), zero_grad=False)
    assert scaler.overflow_report() is not None
    scaler.update(new_scale=64.0)
    assert scaler.overflow_report() is None
    disabled = TorchGradScaler(enabled=False, diagnose=diagnose)
    iteration(model, opt, disabled, inputs())
    assert disabled.overflow_report() is None


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_the_lazy_report_recovers_the_scale_before_the_backoff(config):
    # No history and no diagnose: the report's scale is inverted from the state left.
    model, opt, scaler = setup(**config)
    expected = spec.ScalerState(1024.0)
    for step, poisoned in enumerate([0, 1, 1, 1, 0, 1, 1]):
        used = expected.scale
        expected = spec.update(scaler.config, expected, bool(poisoned))
        iteration(model, opt, scaler, inputs(poison=math.inf if poisoned else None))
        report = scaler.overflow_report()
        assert (report is not None) == bool(poisoned), step
        if poisoned:
            assert report.scale == used and "inferred" not in report.note, step


def test_with_history_the_lazy_report_has_the_exact_scale_whatever_the_backoff():
    model, opt, scaler = setup(backoff_factor=0.7, history=4)
    iteration(model, opt, scaler, inputs(poison=math.inf))
    iteration(model, opt, scaler, inputs(poison=math.inf))
    assert scaler.overflow_report().scale == spec.f32(1024.0 * spec.f32(0.7))


@pytest.mark.parametrize("set_scale", ["update", "load_state_dict"])
def test_a_scale_set_between_two_updates_is_not_read_from_the_ring(set_scale):
    # The ring holds the scale each update left: the record before a skip holds the scale
    # the skip started from, unless the scale was set in between.
    model, opt, scaler = setup(history=4)
    iteration(model, opt, scaler, inputs())
    if set_scale == "update":
        scaler.update(new_scale=64.0)
    else:
        scaler.load_state_dict({**scaler.state_dict(), "scale": 64.0})
    iteration(model, opt, scaler, inputs(poison=math.inf))
    assert scaler.history().as_list() == [(1, 1024.0, False), (2, 32.0, True)]
    assert scaler.overflow_report().scale == 64.0


def test_scale_before_skip_is_exact_when_it_says_so():
    rng = random.Random(0)
    for backoff in (0.5, 0.25, 0.7, 0.3, 0.9, 0.999):
        config = ua.spec.ScalerConfig(backoff_factor=backoff)
        exact_count = 0
        for _ in range(400):
            before = spec.f32(2.0 ** rng.uniform(-100, 100))
            after = spec.f32(before * spec.f32(backoff))
            got, exact = scale_before_skip(config, after, 0)
            assert got == before or not exact, (backoff, before, got)
            exact_count += exact
            assert abs(got - before) <= before * 2.0**-22
        assert exact_count == 400 or backoff not in (0.5, 0.25)


def test_a_skip_from_an_unscalable_scale_says_so():
    model, opt, scaler = setup(diagnose=True)
    scaler.update(new_scale=1e-39)  # 1/scale is inf in float32: every check fails
    iteration(model, opt, scaler, inputs())
    report = scaler.overflow_report()
    assert "below" in report.note and "min_scale" in report.note


def test_functional_unscale_checks_are_noted():
    model, opt, scaler = setup(diagnose=True)
    scaler.scale(model(inputs()).sum()).backward()
    grads = [p.grad for p in model.parameters()]
    grads[0][0, 0] = math.inf
    scaler.unscale(grads)
    scaler.update()
    assert "unscale(grads)" in scaler.overflow_report().note


# ---------------------------------------------------------------- why it keeps skipping


@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize("diagnose", [False, True], ids=["lazy", "diagnose"])
def test_the_collapse_warning_ends_with_the_last_report(kind, diagnose):
    model, opt, scaler = setup(kind=kind, diagnose=diagnose, max_consecutive_skips=3)
    scaler.watch(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            iteration(model, opt, scaler, inputs(poison=math.nan))
    (warning,) = [w for w in caught if issubclass(w.category, ScaleCollapseWarning)]
    message = str(warning.message)
    report = scaler.overflow_report()
    assert report.step == 3
    assert message.endswith(f"Last overflow: {report.summary()}. {report.cause()}")
    assert "The loss itself was inf/NaN before scaling" in message and FIXES in message


def test_the_collapse_warning_names_the_poisoned_parameter_when_the_loss_is_finite():
    model, opt, scaler = setup(max_consecutive_skips=2, on_collapse="raise")
    scaler.watch(model)
    iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.inf))
    with pytest.raises(ua.ScaleCollapseError, match=r"Last overflow: step 2 at scale 512: "
                       r"fc2\.weight \(2 inf, 0 NaN\)\. The loss was"):
        iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.inf), zero_grad=False)


# ---------------------------------------------------------------- it changes nothing


@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_diagnose_and_history_leave_trajectory_and_weights_bit_identical(kind, config):
    runs = []
    for options in ({}, {"diagnose": True, "history": 3}, {"history": 5}):
        model, opt, scaler = setup(kind=kind, **config, **options)
        scales = []
        for step in range(12):
            poisoned = step in (2, 3, 7)
            iteration(model, opt, scaler, inputs(seed=step, poison=math.inf if poisoned
                                                 else None))
            if options:
                scaler.overflow_report()  # asked at every step: changes nothing either
            scales.append(scaler.state)
        runs.append((scales, [p.detach().clone() for p in model.parameters()],
                     scaler.num_skipped_steps))
    for scales, params, skipped in runs[1:]:
        assert scales == runs[0][0] and skipped == runs[0][2] == 3
        assert all(torch.equal(a, b) for a, b in zip(params, runs[0][1], strict=True))


# ---------------------------------------------------------------- history


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_history_wraps_around_and_follows_the_spec_step_by_step(device, kind, config):
    model, opt, scaler = setup(device, kind, history=5, growth_interval=2, **config)
    expected_state = spec.ScalerState(1024.0)
    records = []
    assert scaler.history().as_list() == []
    for step in range(13):
        poisoned = step in (3, 4, 5, 9)
        expected_state = spec.update(scaler.config, expected_state, poisoned)
        records.append((step + 1, expected_state.scale, poisoned))  # the scale it left
        iteration(model, opt, scaler, inputs(device, seed=step,
                                             poison=math.inf if poisoned else None))
        history = scaler.history()
        assert history.as_list() == records[-5:], step
        assert scaler.state == expected_state
    arrays = history.as_arrays()
    assert arrays["iteration"].tolist() == [9, 10, 11, 12, 13]
    assert scaler._ring.device.type == device  # kept on the scale's device


def test_a_manual_update_is_not_recorded():
    model, opt, scaler = setup(history=4)
    iteration(model, opt, scaler, inputs())
    scaler.update(new_scale=8.0)
    iteration(model, opt, scaler, inputs())
    assert scaler.history().as_list() == [(1, 1024.0, False), (2, 8.0, False)]


def test_history_zero_refuses_to_read_and_names_the_option():
    with pytest.raises(ValueError, match=r"history=0.*history=N"):
        TorchGradScaler().history()


@pytest.mark.parametrize("options, error", [
    ({"diagnose": "yes"}, TypeError), ({"diagnose": 1}, TypeError),
    ({"history": -1}, ValueError), ({"history": True}, TypeError),
    ({"history": 2.0}, TypeError), ({"history": "8"}, TypeError),
])
def test_options_are_validated_with_the_value_and_the_fix(options, error):
    (name, value), = options.items()
    with pytest.raises(error, match=rf"{name} must be .*got {value!r}.*pass"):
        ua.GradScaler(backend="torch", **options)


def test_numpy_ints_are_history_sizes_and_typos_are_suggested():
    assert len(TorchGradScaler(history=np.int64(3), device="cpu")._ring) == 3
    with pytest.raises(TypeError, match="did you mean 'history'"):
        TorchGradScaler(histroy=3)


def test_watch_refuses_what_is_not_named_parameters():
    scaler = TorchGradScaler()
    with pytest.raises(TypeError, match="named_parameters"):
        scaler.watch(3)
    with pytest.raises(TypeError, match=r"item 0 must be a \(name, parameter\) pair"):
        scaler.watch([torch.zeros(1)])


def test_watch_holds_no_parameter_alive():
    scaler = TorchGradScaler()
    model = Net()
    scaler.watch(model)
    ref = __import__("weakref").ref(model.fc1.weight)
    del model
    assert ref() is None


def test_state_dict_is_unchanged_and_copies_start_history_and_reports_afresh():
    model, opt, scaler = setup(history=3, diagnose=True)
    scaler.watch(model)
    iteration(model, opt, scaler, inputs(), poison_fc2_weight(math.inf))
    plain_model, plain_opt, plain = setup()
    iteration(plain_model, plain_opt, plain, inputs(), poison_fc2_weight(math.inf))
    assert scaler.state_dict() == plain.state_dict()
    for clone in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert clone.state == scaler.state and clone.overflow_report() is None
        assert clone.history().as_list() == []
        iteration(model, opt, clone, inputs())
        assert clone.history().as_list() == [(2, 512.0, False)]  # its second update
    assert scaler.history().as_list() == [(1, 512.0, True)]
    # Loading a state dict leaves them too.
    scaler.load_state_dict(plain.state_dict())
    assert scaler.history().as_list() == [(1, 512.0, True)]
    assert scaler.overflow_report().names == ["fc2.weight"]


def test_a_copy_drops_exactly_what_the_diagnostics_reset():
    # __getstate__ leaves out DIAGNOSTICS_ATTRIBUTES and __setstate__ assigns them afresh:
    # a name the reset assigns but the list lacks would be pickled (a weak reference fails).
    probe = TorchDiagnostics()
    probe._config = spec.ScalerConfig()
    probe._reset_diagnostics()
    assert set(vars(probe)) - {"_config"} == DIAGNOSTICS_ATTRIBUTES


# ---------------------------------------------------------------- the cost


def ops_per_iteration(kind, poison_at=None, **options):
    model, opt, scaler = setup(kind=kind, **options)
    scaler.watch(model)
    counts = []
    for i in range(4):
        x = inputs(seed=i, poison=math.inf if i == poison_at else None)
        with CountOps() as counter:
            iteration(model, opt, scaler, x)
        counts.append(counter.ops)
    return counts[1:]  # the first creates the optimizer's state


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_diagnose_adds_no_op_to_a_plain_optimizers_steps_that_do_not_skip(config):
    off = ops_per_iteration("foreach", **config)
    assert ops_per_iteration("foreach", diagnose=True, **config) == off
    # history: one op per update, the record.
    with_history = ops_per_iteration("foreach", diagnose=True, history=8, **config)
    assert [dict(h - o) for h, o in zip(with_history, off, strict=True)] == [{"stack": 1}] * 3
    assert all(not (o - h) for h, o in zip(with_history, off, strict=True))


def test_diagnose_reads_found_inf_once_per_update_with_a_fused_optimizer():
    off = ops_per_iteration("fused")
    on = ops_per_iteration("fused", diagnose=True)
    assert [dict(h - o) for h, o in zip(on, off, strict=True)] == [
        {"_local_scalar_dense": 1}] * 3
    assert all(not (o - h) for h, o in zip(on, off, strict=True))


def test_update_with_history_and_diagnose_traces_into_a_full_graph():
    """update() under torch.compile(fullgraph=True): the ring's record traces, into as
    many graphs as without a ring (not one per slot); diagnose steps aside (a traced
    graph cannot read the device) and the report is built when asked, from the same
    gradients."""
    from torch._dynamo.utils import counters

    def run(compiled, **options):
        torch._dynamo.reset()
        counters.clear()
        model, opt, scaler = setup(kind="fused", growth_interval=2, **options)
        scaler.watch(model)
        update = torch.compile(scaler.update, fullgraph=True) if compiled else scaler.update
        names = []
        for step in range(7):
            poison = math.inf if step in (2, 3) else None
            scaler.scale(model(inputs(seed=step, poison=poison)).pow(2).mean()).backward()
            scaler.step(opt)
            update()
            report = scaler.overflow_report()
            names.append(report and report.names)
            opt.zero_grad()
        history = scaler.history().as_list() if options else None
        return history, names, counters["stats"]["unique_graphs"]

    eager = run(False, history=4, diagnose=True)
    compiled = run(True, history=4, diagnose=True)
    assert compiled[:2] == eager[:2]
    assert compiled[2] == run(True)[2]  # no graph per slot
    # The inf input meets fc1.weight's gradient only (ReLU zeroes the -inf it makes).
    assert eager[1][2:4] == [["fc1.weight"]] * 2 and eager[1][4] is None
    assert eager[0] == [(4, 512.0, True), (5, 512.0, False), (6, 1024.0, False),
                        (7, 1024.0, False)]


def test_watch_takes_a_dict_of_names_as_the_other_backends_do():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ua.GradScaler(8.0, backend="torch", device="cpu")
    scaler.watch({"dense.kernel": model[0].weight})
    scaler.scale(model(torch.ones(1, 3)).sum()).backward()
    model[0].weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert scaler.overflow_report().names == ["dense.kernel"]


def test_a_load_between_the_skip_and_the_question_keeps_the_skipped_scale():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ua.GradScaler(1024.0, backend="torch", device="cpu")
    saved = ua.GradScaler(8.0, backend="torch", device="cpu").state_dict()
    scaler.scale(model(torch.ones(1, 3)).sum()).backward()
    model[0].bias.grad[1] = float("nan")
    scaler.step(opt)
    scaler.update()
    scaler.load_state_dict(saved)  # before asking: the state the skip left is gone
    report = scaler.overflow_report()
    assert (report.scale, report.names, report.note) == (1024.0, ["param_groups[0][1]"], "")
