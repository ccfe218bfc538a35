"""The keras session: Keras runs on the backend ``KERAS_BACKEND`` names (TensorFlow when it
names none), fixed when Keras is imported; ``tools/run_tests.py`` runs this folder once per
backend (tensorflow, jax, torch). Every test leaves Keras's global dtype policy as it found
it.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def keras():
    """Keras, on the session's backend."""
    import keras

    return keras


@pytest.fixture(autouse=True)
def _keeps_the_dtype_policy():
    """Puts back the global dtype policy a test set (``mixed_float16``...) and did not
    restore."""
    import keras

    before = keras.mixed_precision.dtype_policy()
    yield
    keras.mixed_precision.set_dtype_policy(before)
