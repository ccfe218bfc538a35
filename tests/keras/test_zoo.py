"""The zoo's adapter of Keras 3 drives the real ``keras.optimizers.LossScaleOptimizer``, on
the session's Keras backend (the keras session runs once per ``KERAS_BACKEND``).

The check looks at the native object after the adapter's steps (its scale, its counter,
the class it is), so an adapter that fell back on this project's own scalers, or skipped
the native calls, fails.
"""

from __future__ import annotations

import json

import pytest

from unifiedamp.conformance.zoo import ZOO
from unifiedamp.spec import ScalerConfig


def _steps(keras) -> dict:
    """What the adapter's steps leave on the native optimizer, for the assertions."""
    from unifiedamp.conformance.zoo.keras_loss_scale_optimizer import KerasLossScaleOptimizer

    def scale(h):
        return float(keras.ops.convert_to_numpy(h[0].dynamic_scale))

    def bits(h):
        return [a.tobytes() for a in adapter.snapshot(h)]

    adapter = KerasLossScaleOptimizer()
    out = {"name": adapter.name, "jit": "jit" in adapter.capabilities}
    h = adapter.new(ScalerConfig(1024.0, growth_interval=2))
    out["native"] = type(h[0]) is keras.optimizers.LossScaleOptimizer
    before = bits(h)
    h = adapter.iterate(h, "I")
    out["inf"] = [scale(h), bits(h) == before]
    h = adapter.iterate(adapter.iterate(h, "F"), "F")
    out["finite"] = [scale(h), int(keras.ops.convert_to_numpy(h[0].step_counter)),
                     bits(h) != before]
    if out["jit"]:
        before = bits(h)
        h = adapter.compiled_iterate(h, "N")
        out["compiled"] = [scale(h), bits(h) == before]
    saved = json.loads(json.dumps(adapter.save(adapter.iterate(h, "F"))))
    loaded = adapter.load(adapter.new(ScalerConfig()), saved)
    out["reloaded"] = [scale(loaded), int(keras.ops.convert_to_numpy(loaded[0].step_counter)),
                       int(loaded[0].dynamic_growth_steps)]
    # Keras's growth has no inf guard (a documented difference): the real scale becomes inf.
    h = adapter.iterate(adapter.new(ScalerConfig(2.0**127, growth_interval=1)), "F")
    out["overflow"] = scale(h)
    return out


@pytest.mark.parametrize("backend", [pytest.param("tensorflow", marks=pytest.mark.slow),
                                     "jax", "torch"])
def test_keras_steps_the_real_loss_scale_optimizer(backend: str) -> None:
    keras = pytest.importorskip("keras", reason=ZOO[f"keras-{backend}"].install)
    if keras.backend.backend() != backend:
        pytest.skip(f"checks the {backend} Keras backend; this session runs "
                    f"KERAS_BACKEND={keras.backend.backend()}")
    out = _steps(keras)
    assert out["name"] == f"keras-{backend}" and out["native"] is True
    assert out["jit"] is (backend != "torch")
    assert out["inf"] == [512.0, True], "an inf step: halve, skip"
    assert out["finite"] == [1024.0, 0, True], "two finite steps: grow, step"
    if out["jit"]:
        assert out["compiled"] == [512.0, True], "a NaN step through train_on_batch"
    # Saved after one more finite step: the counter is 1 at the scale the last backoff left.
    assert out["reloaded"] == [512.0 if out["jit"] else 1024.0, 1, 2]
    assert out["overflow"] == float("inf")
