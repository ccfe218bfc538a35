"""What the spec, the facade and the keras backend assume of Keras, checked against the
installed one on the session's Keras backend (the checks every framework shares:
tests/support/framework_assumptions_checks.py)."""

from __future__ import annotations

import inspect

import pytest
from framework_assumptions_checks import NativeScalerContract


class TestNativeScaler(NativeScalerContract):
    framework = "keras"
    native = "keras:optimizers.LossScaleOptimizer"


def test_keras_members_the_keras_backend_relies_on():
    # The keras backend (backends/keras/_compat.py) overrides these members of Keras's
    # LossScaleOptimizer and relies on how Keras calls them; a release that changes one
    # fails here, naming it.
    keras = pytest.importorskip("keras", reason="keras is not installed: its defaults were "
                                                "not checked")
    from keras.src.optimizers import loss_scale_optimizer  # noqa: F401  (it is still there)
    from keras.src.trainers import trainer
    from keras.src.utils import tracking

    cls = keras.optimizers.LossScaleOptimizer
    overridden = ["_stateful_handle_finite_grads", "_stateful_handle_non_finite_grads",
                  "_stateless_handle_finite_grads", "_stateless_handle_non_finite_grads",
                  "_common_apply", "_tf_apply", "check_finite", "scale_loss",
                  "stateless_apply", "build", "get_config"]
    missing = [n for n in overridden if not callable(getattr(cls, n, None))]
    assert not missing, missing
    assert callable(tracking.no_automatic_dependency_tracking)
    assert callable(keras.optimizers.SGD()._overwrite_variable_with_gradient)
    apply = inspect.getsource(cls.apply)
    assert "_tf_apply" in apply and "_common_apply" in apply, apply
    # compile() wraps an optimizer in a LossScaleOptimizer under mixed_float16 unless
    # it is one already: the wrapper must stay an instance.
    assert "isinstance(self.optimizer, LossScaleOptimizer)" in inspect.getsource(trainer)
    opt = cls(keras.optimizers.SGD())
    opt.build([keras.Variable(1.0)])
    assert {v.name for v in opt.variables} >= {"step_counter", "dynamic_scale"}
