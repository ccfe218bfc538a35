"""The Keras backend passes the packaged conformance suite, through its mixins, on the Keras
backend this session runs (``KERAS_BACKEND``: the keras session runs once per backend, so
TensorFlow, JAX and torch each run both classes here)."""

from __future__ import annotations

import pytest
from builtin_conformance import builtin_adapter

from unifiedamp.conformance import ScalerContract


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
        return 25


class TestKerasSGDConformance(TestKerasConformance):
    """The same through a wrapped SGD with momentum (Keras's other optimizer family)."""

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("keras", "keras", optimizer="sgd")
