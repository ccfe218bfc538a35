"""The zoo's adapter of TensorFlow's ``tf.compat.v1.mixed_precision.DynamicLossScale`` drives
the real scaler through ``MixedPrecisionLossScaleOptimizer`` (where ``KERAS_BACKEND`` is
tensorflow: that process has TensorFlow imported).

Each check looks at the native objects after the adapter's steps (the loss scale's
variables, the parameters, the classes), so an adapter that fell back on this project's
own scalers, or skipped the native calls, fails.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from keras_helpers import only_on

from unifiedamp.conformance.zoo import ZOO
from unifiedamp.spec import ScalerConfig

pytestmark = only_on("tensorflow", why="the column runs TensorFlow's own tf.compat.v1 classes")


def _bits(arrays: list[np.ndarray]) -> list[bytes]:
    return [np.asarray(a).tobytes() for a in arrays]


def _native(handle) -> tuple[float, int]:
    """The loss scale's two variables, read from the wrapper's variables."""
    found = {v.name.split(":")[0]: v.numpy() for v in handle.optimizer.variables()}
    return float(found["current_loss_scale"]), int(found["good_steps"])


def test_tensorflow_v1_steps_the_real_dynamic_loss_scale() -> None:
    tf = pytest.importorskip("tensorflow", reason=ZOO["tensorflow-v1"].install)
    from unifiedamp.conformance.zoo.tensorflow_loss_scale import TensorFlowV1DynamicLossScale

    adapter = TensorFlowV1DynamicLossScale()
    for iterate in (adapter.iterate, adapter.compiled_iterate):
        handle = adapter.new(ScalerConfig(1024.0, growth_interval=2))
        mixed_precision = tf.compat.v1.mixed_precision
        assert type(handle.loss_scale) is mixed_precision.DynamicLossScale
        assert type(handle.optimizer) is mixed_precision.MixedPrecisionLossScaleOptimizer
        # The parameters: under tf.function Adam's moments appear (at 0) when it traces.
        before = adapter.snapshot(handle)[:2]
        handle = iterate(handle, "N")
        assert _native(handle) == (512.0, 0)
        assert _bits(adapter.snapshot(handle)[:2]) == _bits(before), "the NaN step was taken"
        seen = []
        for _ in range(3):
            handle = iterate(handle, "F")
            seen.append(_native(handle))
        # good_steps + 1 >= increment_period grows: on the second finite step, as the spec.
        assert seen == [(512.0, 1), (1024.0, 0), (1024.0, 1)], iterate
        assert _bits(adapter.snapshot(handle)[:2]) != _bits(before), "the finite steps did nothing"

    # The floor of 1: from 2, two overflows give 1 and 1.
    handle = adapter.new(ScalerConfig(2.0))
    handle = adapter.iterate(adapter.iterate(handle, "I"), "I")
    assert _native(handle) == (1.0, 0)
    with pytest.raises(ValueError, match="one optimizer only"):
        adapter.new(ScalerConfig(), optimizers=2)


def test_tensorflow_v1_moves_nothing_above_a_scale_of_2_to_the_126() -> None:
    """1 / 2**127 flushes to 0 on CPU: the finite step applies zero gradients."""
    pytest.importorskip("tensorflow", reason=ZOO["tensorflow-v1"].install)
    from unifiedamp.conformance.zoo.tensorflow_loss_scale import TensorFlowV1DynamicLossScale

    adapter = TensorFlowV1DynamicLossScale()
    handle = adapter.new(ScalerConfig(2.0**127, growth_interval=1000))
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "F")
    assert _native(handle) == (2.0**127, 1)
    assert _bits(adapter.snapshot(handle)[:2]) == _bits(before[:2])
    # At 2**126 the reciprocal is normal and the same step moves the parameters.
    handle = adapter.new(ScalerConfig(2.0**126, growth_interval=1000))
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "F")
    assert _bits(adapter.snapshot(handle)[:2]) != _bits(before[:2])


def test_tensorflow_v1_saves_and_loads_its_variables() -> None:
    pytest.importorskip("tensorflow", reason=ZOO["tensorflow-v1"].install)
    from unifiedamp.conformance.zoo.tensorflow_loss_scale import TensorFlowV1DynamicLossScale

    adapter = TensorFlowV1DynamicLossScale()
    handle = adapter.new(ScalerConfig(64.0, 4.0, 0.25, 3))
    for kind in "IFF":
        handle = adapter.iterate(handle, kind)
    saved = json.loads(json.dumps(adapter.save(handle)))
    assert (saved["scale"], saved["growth_tracker"], saved["config"]["growth_factor"]) == (
        16.0, 2, 4.0)
    loaded = adapter.load(adapter.new(ScalerConfig()), saved)
    assert _native(loaded) == (16.0, 2)
    assert loaded.loss_scale.get_config() == {
        "initial_loss_scale": 64.0, "increment_period": 3, "multiplier": 4.0}
    loaded = adapter.iterate(loaded, "F")
    assert _native(loaded) == (64.0, 0)
    with pytest.raises(ValueError, match="hysteresis_tracker=1"):
        adapter.load(loaded, {**saved, "hysteresis_tracker": 1})


def test_tensorflow_v1_snippets_show_their_causes() -> None:
    pytest.importorskip("tensorflow", reason=ZOO["tensorflow-v1"].install)
    from zoo_snippets import run_snippets

    lines = run_snippets(["tensorflow-v1"])
    assert sorted(lines) == ["floor_of_1.py", "flushes_a_subnormal_reciprocal_to_zero.py"]
    assert all(line.startswith("tf.compat.v1") for line in lines.values()), lines
