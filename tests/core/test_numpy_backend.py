"""The NumPy backend: torch's verbs, call-order rules, skipping and collapse reporting."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from imperative_misuse_checks import check_update_new_scale_types

import unifiedamp as ua
from unifiedamp.backends.numpy import SGD, NumpyGradScaler
from unifiedamp.conformance import run_vector
from unifiedamp.spec import VECTORS, ScalerState


def make(**config) -> tuple[NumpyGradScaler, SGD]:
    scaler = ua.GradScaler(backend="numpy", **{"init_scale": 1024.0, **config})
    return scaler, SGD([np.ones(3, np.float32)], lr=0.1, momentum=0.9)


def fill(opt: SGD, value: float = 1.0) -> None:
    opt.grads = [np.array([1.0, value, 2.0], np.float32) * 1024]


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.name)
def test_every_reference_vector_bit_for_bit(vector):
    assert run_vector(NumpyGradScaler.conformance_adapter(), vector) is None


def test_real_training_loop_in_float16_converges_and_skips_overflowing_steps():
    # Linear regression; float16 gradients from the scaled loss, computed by hand
    # (NumPy has no autodiff): d/dw mean((xw - y)^2) = 2 x^T (xw - y) / n.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    w_true = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    y = x @ w_true
    w = np.zeros(4, np.float32)
    opt = SGD([w], lr=0.05)
    scaler = ua.GradScaler(2.0**20, growth_interval=5, backend="numpy")
    scales = []
    for _ in range(300):
        residual = x @ w - y
        loss = np.float16(np.mean(residual**2))
        scaled_loss = scaler.scale(loss)
        assert scaled_loss.dtype == np.float16
        # backprop of the scaled loss in float16: overflows to inf while the scale is too big
        with np.errstate(over="ignore"):
            opt.grads = [((2 * x.T @ residual / len(y)) * scaler.get_scale()).astype(np.float16)]
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert np.allclose(w, w_true, atol=1e-2)
    assert scaler.num_skipped_steps > 0  # 2^20 overflows float16 at first
    assert scaler.num_steps == 300
    assert min(scales) < 2.0**20 < scales[-1]  # backed off, then grew as the loss shrank


def test_skipped_step_leaves_params_and_optimizer_state_untouched():
    scaler, opt = make()
    fill(opt)
    scaler.step(opt)
    scaler.update()
    params, velocity, count = opt.params[0].copy(), opt.velocity[0].copy(), opt.step_count
    fill(opt, np.nan)
    assert scaler.step(opt) is None
    scaler.update()
    assert scaler.last_step_skipped is True
    np.testing.assert_array_equal(opt.params[0], params)
    np.testing.assert_array_equal(opt.velocity[0], velocity)
    assert opt.step_count == count
    assert (scaler.num_steps, scaler.num_skipped_steps) == (2, 1)


def test_step_returns_the_optimizer_result_and_passes_arguments():
    class Recording(SGD):
        def step(self, *args, **kwargs):
            super().step()
            return ("stepped", args, kwargs)

    scaler = ua.GradScaler(backend="numpy")
    opt = Recording([np.zeros(1, np.float32)])
    opt.grads = [np.ones(1, np.float32)]
    assert scaler.step(opt, 1, lr=2) == ("stepped", (1,), {"lr": 2})
    assert scaler.last_step_skipped is False


def test_unscale_then_step_unscales_once_in_place_and_keeps_dtype():
    scaler, opt = make()
    opt.grads = [np.array([1024.0, 2048.0, 512.0], np.float16)]
    scaler.unscale_(opt)
    np.testing.assert_array_equal(opt.grads[0], np.array([1, 2, 0.5], np.float16))
    assert opt.grads[0].dtype == np.float16
    scaler.step(opt)  # must not unscale a second time
    np.testing.assert_array_equal(opt.grads[0], np.array([1, 2, 0.5], np.float16))


def test_scale_preserves_structure_and_dtype():
    scaler, _ = make()
    out = scaler.scale({"a": np.ones(2, np.float16), "b": [np.float32(0.5), 2.0],
                        "c": np.ones(1, np.float64)})
    assert out["a"].dtype == np.float16 and out["a"][0] == 1024
    assert out["b"][0] == np.float32(512) and isinstance(out["b"][0], np.float32)
    assert out["b"][1] == 2048.0 and isinstance(out["b"][1], float)
    assert out["c"].dtype == np.float64
    with pytest.raises(TypeError, match="floating-point values, got dtype int64"):
        scaler.scale(np.ones(2, np.int64))


def test_scale_of_a_float16_loss_that_overflows_is_inf():
    scaler, _ = make(init_scale=65536.0)
    with np.errstate(over="ignore"):
        assert np.isinf(scaler.scale(np.float16(2.0)))


def test_functional_unscale_returns_copies_and_feeds_update():
    scaler, _ = make()
    grads = {"w": np.array([2048.0], np.float32), "b": np.array([np.inf], np.float32)}
    out, finite = scaler.unscale(grads)
    assert finite is False and out["w"][0] == 2.0 and grads["w"][0] == 2048.0
    scaler.update()
    assert scaler.get_scale() == 512.0
    assert scaler.unscale([]) == ([], True)


def test_update_clears_the_functional_checks_so_one_inf_skips_one_update():
    w = np.ones(3, np.float32)
    opt = SGD([w], lr=0.1)
    scaler = ua.GradScaler(1024.0, growth_interval=1, backend="numpy", history=3)
    for value in (np.inf, 1.0, 1.0):
        grads, finite = scaler.unscale([scaler.scale(np.array([1.0, value, 2.0], np.float32))])
        if finite:
            opt.grads = grads
            opt.step()
        scaler.update()
    # backed off once, then grew at each finite update
    assert scaler.history().as_list() == [(1, 512.0, True), (2, 1024.0, False),
                                          (3, 2048.0, False)]
    assert scaler.get_scale() == 2048.0 and opt.step_count == 2


def test_unscale_checks_the_gradients_as_given_not_as_unscaled():
    """As torch's kernel and the functional unscale (the conformance contract): at a scale
    below 1, unscaling multiplies by more than 1 and takes finite gradients near float32's
    maximum past it; they were finite as backpropagated, so the update counts them so."""
    scaler = ua.GradScaler(2.0**-10, growth_interval=1, backend="numpy")
    opt = SGD([np.zeros(2, np.float32)])
    opt.grads = [np.full(2, 3e38, np.float32)]
    scaler.unscale_(opt)
    assert np.isinf(opt.grads[0]).all()  # the unscaled values did overflow
    scaler.update()
    assert scaler.state == ScalerState(2.0**-9, 0, 0)  # a finite update: it grew


def test_one_inf_in_either_of_two_optimizers_backs_off_once():
    scaler = ua.GradScaler(1024.0, growth_interval=1, backend="numpy")
    a, b = SGD([np.zeros(1, np.float32)]), SGD([np.zeros(1, np.float32)])
    a.grads, b.grads = [np.array([np.inf], np.float32)], [np.array([1.0], np.float32)]
    scaler.step(a)
    scaler.step(b)  # b's gradients are finite: b steps, as in torch
    assert a.params[0][0] == 0 and b.params[0][0] != 0
    assert scaler.num_steps == 0  # the counters are the updates'
    scaler.update()
    assert scaler.get_scale() == 512.0
    assert scaler.last_step_skipped and (scaler.num_steps, scaler.num_skipped_steps) == (1, 1)


CALL_ORDER = [
    ("unscale_ twice", lambda s, o: (s.unscale_(o), s.unscale_(o)), RuntimeError,
     r"^unscale_\(\) has already been called on this optimizer since the last update\(\)\.$"),
    ("unscale_ after step", lambda s, o: (s.step(o), s.unscale_(o)), RuntimeError,
     r"^unscale_\(\) is being called after step\(\)\.$"),
    ("step twice", lambda s, o: (s.step(o), s.step(o)), RuntimeError,
     r"^step\(\) has already been called since the last update\(\)\.$"),
    # torch's sentence, then the cause and the fix
    ("update without checks", lambda s, o: s.update(), AssertionError,
     r"^No inf checks were recorded prior to update\. Nothing checked the gradients since the "
     r"last update\(\): call scaler\.step\(optimizer\) \(or scaler\.unscale_\(optimizer\)\) "
     r"before scaler\.update\(\), once per iteration"),
    ("closure", lambda s, o: s.step(o, closure=lambda: 0.0), RuntimeError,
     r"^Closure use is not currently supported if GradScaler is enabled\.$"),
]


@pytest.mark.parametrize("name,calls,exc,message", CALL_ORDER, ids=[c[0] for c in CALL_ORDER])
def test_call_order_errors_use_torchs_texts(name, calls, exc, message):
    scaler, opt = make()
    fill(opt)
    with pytest.raises(exc, match=message):
        calls(scaler, opt)


def test_update_without_checks_is_also_a_runtime_error():
    with pytest.raises(RuntimeError):
        make()[0].update()


def test_step_with_no_gradients_at_all_says_so():
    scaler, opt = make()
    with pytest.raises(AssertionError, match=r"^No inf checks were recorded for this optimizer\. "
                                             r"None of its parameters has a gradient.*: set "
                                             r"optimizer\.grads to the gradients of "
                                             r"scaler\.scale\(loss\) before "
                                             r"scaler\.step\(optimizer\)"):
        scaler.step(opt)


def test_update_starts_a_new_iteration():
    scaler, opt = make()
    for _ in range(3):
        fill(opt)
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()


def test_update_with_new_scale_sets_it_and_keeps_trackers():
    scaler, opt = make(growth_interval=10)
    fill(opt)
    scaler.step(opt)
    scaler.update()
    scaler.update(8.0)
    assert scaler.state == ScalerState(8.0, 1, 0)
    scaler.update(new_scale=np.array([0.1]))
    assert scaler.get_scale() == float(np.float32(0.1))
    for bad, exc in [(0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError),
                     (np.ones(2), TypeError), ("8", TypeError)]:
        with pytest.raises(exc, match="new_scale must be"):
            scaler.update(new_scale=bad)
    assert scaler.get_scale() == float(np.float32(0.1))


def test_disabled_scaler_is_a_pass_through():
    scaler, opt = make(enabled=False)
    loss = np.float32(3.0)
    assert scaler.scale(loss) is loss
    opt.grads = [np.array([np.inf, 1.0, 1.0], np.float32)]
    scaler.unscale_(opt)
    scaler.unscale_(opt)  # no call-order bookkeeping either
    assert np.isinf(opt.grads[0][0])
    scaler.step(opt)
    assert opt.step_count == 1
    scaler.update()
    assert scaler.get_scale() == 1.0 and not scaler.is_enabled()
    assert scaler.state_dict()["scale"] == 1024.0


def test_setters_validate_and_change_nothing_on_error():
    scaler, _ = make()
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(7)
    scaler.set_hysteresis(2)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(),
            scaler.get_growth_interval(), scaler.get_hysteresis()) == (3.0, 0.25, 7, 2)
    before = scaler.config
    with pytest.raises(ValueError, match="growth_factor must be a finite number >= 1 that "
                                         "float32 can hold, got 0.5"):
        scaler.set_growth_factor(0.5)
    with pytest.raises(TypeError, match="growth_interval must be an int with 1 <= "
                                        "growth_interval <= 2147483647, got 2.5"):
        scaler.set_growth_interval(2.5)
    assert scaler.config == before


def test_growth_interval_lowered_below_the_tracker_grows_on_next_finite_step():
    scaler, opt = make(growth_interval=10)
    for _ in range(5):
        fill(opt)
        scaler.step(opt)
        scaler.update()
    scaler.set_growth_interval(3)
    fill(opt)
    scaler.step(opt)
    scaler.update()
    assert scaler.state == ScalerState(2048.0, 0, 0)


def test_optimizer_without_the_protocol_gets_a_clear_error():
    scaler, _ = make()
    with pytest.raises(TypeError, match=r"needs an optimizer with \.params, \.grads.*has no "
                                        r"grads"):
        scaler.step(object.__new__(type("Opt", (), {"params": [], "step": lambda self: 0})))
    opt = SGD([np.zeros(1)])
    opt.grads = [[1.0]]
    with pytest.raises(TypeError, match=r"optimizer.grads\[0\] must be a floating-point numpy "
                                        r"array"):
        scaler.unscale_(opt)


def skip_forever(scaler: NumpyGradScaler, n: int) -> None:
    opt = SGD([np.zeros(1, np.float32)])
    for _ in range(n):
        opt.grads = [np.array([np.nan], np.float32)]
        scaler.step(opt)
        scaler.update()


def test_consecutive_skips_warn_once_naming_step_and_scale():
    scaler = ua.GradScaler(backend="numpy", max_consecutive_skips=5)
    with pytest.warns(ua.ScaleCollapseWarning) as record:
        skip_forever(scaler, 8)
    assert len(record) == 1
    message = str(record[0].message)
    assert "collapsed at step 5: scale 2048.0 (0x45000000)" in message
    assert "the gradients were inf/NaN at each of the last 5 steps" in message
    assert record[0].filename == __file__  # points at the user's update() call


def test_scale_below_float32_min_normal_warns_even_without_a_skip_limit():
    scaler = ua.GradScaler(2.0**-120, max_consecutive_skips=None, backend="numpy")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        skip_forever(scaler, 6)
    assert len(record) == 0
    with pytest.warns(ua.ScaleCollapseWarning, match=r"at step 7: scale 5\.877471754111438e-39"
                                                     r" \(0x00400000\); it is below float32's "
                                                     r"smallest normal"):
        skip_forever(scaler, 1)


def test_collapse_can_raise_instead_and_reports_again_after_recovery():
    scaler = ua.GradScaler(backend="numpy", max_consecutive_skips=2, on_collapse="raise")
    skip_forever(scaler, 1)
    with pytest.raises(ua.ScaleCollapseError, match="at step 2"):
        skip_forever(scaler, 1)
    skip_forever(scaler, 1)  # same episode: reported once
    opt = SGD([np.zeros(1, np.float32)])
    opt.grads = [np.ones(1, np.float32)]
    scaler.step(opt)
    scaler.update()
    skip_forever(scaler, 1)
    with pytest.raises(ua.ScaleCollapseError, match="at step 6"):
        skip_forever(scaler, 1)


@pytest.mark.parametrize("kwargs,message", [
    ({"max_consecutive_skips": 0}, "max_consecutive_skips must be None or an int >= 1, got 0"),
    ({"on_collapse": "ignore"}, "on_collapse must be 'warn' or 'raise', got 'ignore'"),
])
def test_monitor_options_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ua.GradScaler(backend="numpy", **kwargs)


def test_a_read_only_gradient_is_refused_before_any_gradient_is_divided():
    w = [np.zeros(2, np.float32), np.zeros(2, np.float32)]
    opt = SGD(w, lr=0.1)
    scaler = ua.GradScaler(4.0, backend="numpy")
    frozen = np.full(2, 8.0, np.float32)
    frozen.flags.writeable = False
    opt.grads = [np.full(2, 8.0, np.float32), frozen]
    with pytest.raises(ValueError, match=r"optimizer.grads\[1\] is read-only.*np.array\(g\)"):
        scaler.unscale_(opt)
    assert opt.grads[0].tolist() == [8.0, 8.0]  # untouched: a retry divides it once
    opt.grads[1] = np.array(frozen)
    scaler.unscale_(opt)
    assert [g.tolist() for g in opt.grads] == [[2.0, 2.0], [2.0, 2.0]]


def test_max_consecutive_skips_takes_numpy_ints_like_the_config():
    scaler = ua.GradScaler(backend="numpy", max_consecutive_skips=np.int64(5),
                           growth_interval=np.int64(5))
    assert scaler._monitor.max_consecutive_skips == 5
    assert type(scaler._monitor.max_consecutive_skips) is int


def test_a_scale_whose_reciprocal_overflows_skips_every_step_and_reloads_at_zero():
    # Unscaling multiplies by f32(1/scale): inf below about 2.94e-39, so finite
    # gradients would reach the parameters as inf; every step is skipped instead.
    w = np.ones(2, np.float32)
    opt = SGD([w], lr=0.1)
    scaler = ua.GradScaler(2.0**-140, growth_interval=1, backend="numpy")
    with pytest.warns(ua.ScaleCollapseWarning, match="below float32's smallest normal"):
        for _ in range(12):
            opt.grads = [scaler.scale(np.ones(2, np.float32))]
            scaler.step(opt)
            scaler.update()
            assert scaler.last_step_skipped
    assert w.tolist() == [1.0, 1.0] and scaler.get_scale() == 0.0
    resumed = ua.GradScaler(backend="numpy")
    resumed.load_state_dict(scaler.state_dict())
    assert resumed.state == scaler.state


def test_update_new_scale_takes_the_same_types_on_every_imperative_backend():
    # The torch backend's case: tests/torch/test_torch_porting.py, under the same name.
    scaler = ua.GradScaler(1024.0, backend="numpy")
    check_update_new_scale_types(scaler)
