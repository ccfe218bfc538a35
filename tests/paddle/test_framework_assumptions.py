"""What the spec, the facade and the paddle backend assume of Paddle, checked against the
installed one (the checks every framework shares:
tests/support/framework_assumptions_checks.py)."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from framework_assumptions_checks import NativeScalerContract


class TestNativeScaler(NativeScalerContract):
    framework = "paddle"
    native = "paddle:amp.GradScaler"


def test_paddle_members_the_paddle_backend_relies_on():
    # The paddle backend (backends/paddle/_compat.py) uses these private parts of paddle; a
    # release that changes one fails here, naming it, instead of deep inside a training step.
    paddle = pytest.importorskip("paddle", reason="paddle is not installed: its defaults were "
                                                  "not checked")
    from paddle import _C_ops
    from paddle.amp.grad_scaler import OptimizerState, _refresh_optimizer_state
    from paddle.base.framework import _dygraph_tracer

    from unifiedamp.backends.paddle import PaddleGradScaler

    assert [s.name for s in OptimizerState] == ["INIT", "UNSCALED", "STEPPED"]
    assert _refresh_optimizer_state() == {"state": OptimizerState.INIT}
    # The unscale kernel returns its flag (the one passed in is not written) and
    # multiplies by the float64 reciprocal rounded to float32.
    g = paddle.to_tensor(np.array([3.0, 1e30], np.float32))
    _, flag = _C_ops.check_finite_and_unscale_(
        [g], paddle.to_tensor(np.array([3.0], np.float32)), paddle.zeros([1], "bool"))
    assert not bool(flag), flag
    assert (g.numpy() == np.array([3.0, 1e30], np.float32) * np.float32(1 / 3.0)).all()
    _, flag = _C_ops.check_finite_and_unscale_(
        [paddle.to_tensor(np.array([np.nan], np.float32))],
        paddle.to_tensor(np.array([1.0], np.float32)), paddle.zeros([1], "bool"))
    assert bool(flag), flag
    tracer = _dygraph_tracer()
    assert str(tracer._amp_level) == "AmpLevel.O0" and tracer._amp_dtype == "float32"
    assert str(paddle.device._convert_to_place("cpu")) == "Place(cpu)"
    layer = paddle.nn.Linear(2, 1)
    opt = paddle.optimizer.SGD(parameters=[{"params": [layer.weight]},
                                           {"params": [layer.bias]}])
    assert [len(g["params"]) for g in opt._param_groups] == [1, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # built disabled, it must not warn on a CPU place
        paddle.amp.GradScaler(enable=False)
    # Every public member of Paddle's scaler is this backend's own, so none runs
    # Paddle's behaviour on this backend's state.
    native = {n for n, v in inspect.getmembers(paddle.amp.GradScaler, callable)
              if not n.startswith("__")}
    ours = {n for klass in PaddleGradScaler.__mro__[:1] for n in vars(klass)}
    missing = sorted(n for n in native if n not in ours and not n.startswith("_"))
    missing += sorted(n for n in ("_unscale", "_update") if n not in ours)
    assert not missing, missing
