"""``unifiedamp port`` with Keras: each source ported to or from Keras (Keras's own
LossScaleOptimizer or unifiedamp's wrapper) runs with the real frameworks and builds the same
scaler, or one whose differences its problems name: in this process on the session's Keras
backend, beside torch or JAX when the file imports them. A pair with paddle beside Keras runs
in a process of its own, paddle imported first and Keras on JAX (paddle and TensorFlow cannot
share a process), once: in the keras session on JAX. The framework-free checks of the
rewriter: tests/core/test_port_source.py."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("libcst")

import port_sources  # noqa: E402

PAIRS = port_sources.pairs("keras")
WITH_PADDLE = port_sources.pairs("keras", paddle_with_keras=True)
SUPPORT = pathlib.Path(__file__).resolve().parents[1] / "support"


@pytest.fixture(scope="module")
def built_by_target():
    """Each rewritten source of this session without paddle, run once in this process."""
    return port_sources.build_pairs(PAIRS)


@pytest.fixture(scope="module")
def built_beside_paddle():
    """The sources with paddle beside Keras, run once in a new interpreter (paddle first,
    Keras on JAX)."""
    if keras.backend.backend() != "jax":
        pytest.skip("paddle beside Keras runs in a process of its own with Keras on JAX: "
                    f"once, in the keras session on JAX (this one: {keras.backend.backend()})")
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddle is not installed")
    proc = subprocess.run([sys.executable, "-c", port_sources.CHILD, json.dumps(WITH_PADDLE),
                           str(SUPPORT)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KERAS_BACKEND": "jax",
                               "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CASES = [*(pytest.param(to, False, id=to) for to in PAIRS),
         *(pytest.param(to, True, id=f"{to}-with-paddle") for to in WITH_PADDLE)]


@pytest.mark.parametrize(("to", "beside_paddle"), CASES)
def test_the_rewritten_source_builds_the_same_scaler_in_the_real_framework(to, beside_paddle,
                                                                            request):
    chosen = WITH_PADDLE if beside_paddle else PAIRS
    built = request.getfixturevalue("built_beside_paddle" if beside_paddle else "built_by_target")
    port_sources.check_built(to, chosen[to], built[to])


#: The tf.keras sources of the corpus: each spelling (tf-keras 2's static scale, TensorFlow
#: 2.1-2.3's experimental optimizer with "dynamic", a number or a DynamicLossScale, tf.keras
#: read as tf-keras 2 or Keras 3 from the file).
TF_KEYS = [k for k, v in port_sources.SOURCES.items() if v[1].startswith("tf.keras")]


@pytest.mark.parametrize("key", TF_KEYS)
def test_the_lifted_tf_keras_line_follows_the_sources_trajectory(key):
    """The rewritten line, run with Keras, steps the source's trajectory (its own Keras's
    rule: tf-keras 2's floor of 1, a static scale that never moves) over forced overflows."""
    from keras_helpers import apply_kinds
    from port_runs import KINDS, hexes, reference

    result = port_sources.ported(key, "unifiedamp")
    assert result.ok, result.problems
    namespace: dict = {}
    exec(result.code, namespace)
    opt, config = namespace["scaler"], port_sources.expected(key)
    scales, _ = apply_kinds(opt, KINDS)
    assert hexes(scales) == reference(config, KINDS), (key, config)
    if not config.dynamic:
        assert set(scales) == {config.init_scale}
