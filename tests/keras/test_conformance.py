"""The Keras backend passes the packaged conformance suite, through its mixins, on the Keras
backend this session runs (``KERAS_BACKEND``: the keras session runs once per backend).

TensorFlow runs both classes with 25 examples per property; JAX and torch run the Adam class
with 10, what the suite's own run of them holds: the rule and the optimizer families are the
wrapper's, the same on every backend, and checked once; what JAX and torch add (their
autodiff, their compiled step, their float32 arithmetic) the Adam class reaches."""

from __future__ import annotations

import keras
import pytest
from builtin_conformance import builtin_adapter

from unifiedamp.conformance import ScalerContract

ON_TENSORFLOW = keras.backend.backend() == "tensorflow"


class TestKerasConformance(ScalerContract):
    """Keras on the session's backend: a custom loop with the backend's own autodiff
    (tf.GradientTape, jax.grad over stateless_call, torch autograd) and the wrapped Adam's
    apply; the fit step (train_on_batch) for the compiled vectors (tf.function, jax.jit;
    eager on torch)."""

    backend = "keras"

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("keras", "keras")

    @pytest.fixture
    def max_examples(self):
        return 25 if ON_TENSORFLOW else 10


@pytest.mark.skipif(not ON_TENSORFLOW, reason="the optimizer family is the wrapper's, the same "
                    "on every Keras backend: checked once, on TensorFlow")
class TestKerasSGDConformance(TestKerasConformance):
    """The same through a wrapped SGD with momentum (Keras's other optimizer family)."""

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("keras", "keras", optimizer="sgd")
