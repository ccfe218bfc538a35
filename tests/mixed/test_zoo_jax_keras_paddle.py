"""The zoo's adapters of jmp, Keras 3 and Paddle drive the real third-party scalers.

Each check looks at the native object after the adapter's steps (its scale, its
parameters, the class it is), so an adapter that fell back on this project's own
scalers, or skipped the native calls, fails. Keras runs in one child process per
Keras backend (the backend is fixed when Keras is imported, and TensorFlow must not
share a process with Paddle); jmp and Paddle run here, ordered by tests/conftest.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import json

import numpy as np
import pytest

from unifiedamp import spec
from unifiedamp.conformance.contract import ScalerContract
from unifiedamp.conformance.zoo import ZOO, Difference
from unifiedamp.spec import ScalerConfig

MODULES = ("jmp_loss_scale", "keras_loss_scale_optimizer", "paddle_grad_scaler")


def _bits(arrays: list[np.ndarray]) -> list[bytes]:
    return [np.asarray(a).tobytes() for a in arrays]


@pytest.mark.parametrize("module", MODULES)
def test_every_difference_names_a_test_of_the_suite(module: str) -> None:
    differences = importlib.import_module(f"unifiedamp.conformance.zoo.{module}").DIFFERENCES
    vectors = {v.name for v in spec.VECTORS}
    assert differences, f"{module} lists no differences"
    for test_id, difference in differences.items():
        name, _, param = test_id.partition("[")
        assert callable(getattr(ScalerContract, name, None)), f"{test_id}: no such test"
        assert not param or param.rstrip("]") in vectors, f"{test_id}: no such vector"
        assert isinstance(difference, Difference)
        assert all(len(field) > 20 for field in difference), f"{test_id}: a field is empty"


# ------------------------------------------------------------ jmp


@pytest.mark.framework("jax")
def test_jmp_steps_the_real_dynamic_loss_scale() -> None:
    jmp = pytest.importorskip("jmp", reason=ZOO["jmp"].install)
    from unifiedamp.conformance.zoo.jmp_loss_scale import JmpDynamicLossScale

    adapter = JmpDynamicLossScale()
    handle = adapter.new(ScalerConfig(1024.0, growth_interval=2))
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "I")
    assert type(handle[0]) is jmp.DynamicLossScale
    assert float(handle[0].loss_scale) == 512.0 and int(handle[0].counter) == 0
    assert _bits(adapter.snapshot(handle)) == _bits(before), "the inf step was not skipped"
    handle = adapter.iterate(adapter.iterate(handle, "F"), "F")
    assert float(handle[0].loss_scale) == 1024.0 and int(handle[0].counter) == 0
    assert _bits(adapter.snapshot(handle)) != _bits(before), "the finite steps changed nothing"

    # One loss scale for two optimizers: an inf in either skips both.
    handle = adapter.new(ScalerConfig(8.0), optimizers=2)
    before = adapter.snapshot(handle)
    handle = adapter.iterate(handle, "FI")
    assert float(handle[0].loss_scale) == 4.0
    assert _bits(adapter.snapshot(handle)) == _bits(before)


@pytest.mark.framework("jax")
def test_jmp_floor_holds_eagerly_and_is_lost_under_jit() -> None:
    """The documented difference, seen on jmp's own object: tree_flatten drops the floor."""
    pytest.importorskip("jmp", reason=ZOO["jmp"].install)
    from unifiedamp.conformance.zoo.jmp_loss_scale import JmpDynamicLossScale

    adapter = JmpDynamicLossScale()
    config = ScalerConfig(4.0, min_scale=1.5)
    eager = adapter.iterate(adapter.iterate(adapter.new(config), "I"), "I")
    assert float(eager[0].loss_scale) == 1.5 and float(eager[0].min_loss_scale) == 1.5
    jitted = adapter.compiled_iterate(adapter.compiled_iterate(adapter.new(config), "I"), "I")
    assert float(jitted[0].loss_scale) == 1.0 and float(jitted[0].min_loss_scale) == 1.0


@pytest.mark.framework("jax")
def test_jmp_runs_one_factor_and_reloads_its_fields() -> None:
    pytest.importorskip("jmp", reason=ZOO["jmp"].install)
    from unifiedamp.conformance.contract import fit
    from unifiedamp.conformance.zoo.jmp_loss_scale import JmpDynamicLossScale

    adapter = JmpDynamicLossScale()
    assert fit(adapter, ScalerConfig(growth_factor=4.0)).backoff_factor == 0.25
    assert fit(adapter, ScalerConfig(growth_factor=3.0)) is None  # 1/3 rounds differently
    with pytest.raises(ValueError, match="hysteresis=2"):
        adapter.new(ScalerConfig(hysteresis=2))
    handle = adapter.new(ScalerConfig(64.0, 4.0, 0.25, 3))
    handle = adapter.iterate(adapter.iterate(adapter.iterate(handle, "F"), "F"), "F")
    assert float(handle[0].loss_scale) == 256.0
    handle = adapter.iterate(handle, "F")
    saved = json.loads(json.dumps(adapter.save(handle)))
    assert (saved["scale"], saved["growth_tracker"], saved["config"]["growth_factor"]) == (
        256.0, 1, 4.0)
    loaded = adapter.load(adapter.new(ScalerConfig()), saved)
    assert (float(loaded[0].loss_scale), int(loaded[0].counter), loaded[0].factor,
            loaded[0].period) == (256.0, 1, 4.0, 3)


# ------------------------------------------------------------ Keras, one process per backend

_KERAS_CHILD = r"""
import json
import keras
import numpy as np
from unifiedamp.spec import ScalerConfig
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
out["finite"] = [scale(h), int(keras.ops.convert_to_numpy(h[0].step_counter)), bits(h) != before]
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
print(json.dumps(out))
"""


@pytest.mark.framework("keras")
@pytest.mark.parametrize("backend", [pytest.param("tensorflow", marks=pytest.mark.slow),
                                     "jax", "torch"])
def test_keras_steps_the_real_loss_scale_optimizer(backend: str, run_python) -> None:
    pytest.importorskip("keras", reason=ZOO[f"keras-{backend}"].install)
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed: {ZOO[f'keras-{backend}'].install}")
    proc = run_python(_KERAS_CHILD, env={"KERAS_BACKEND": backend})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["name"] == f"keras-{backend}" and out["native"] is True
    assert out["jit"] is (backend != "torch")
    assert out["inf"] == [512.0, True], "an inf step: halve, skip"
    assert out["finite"] == [1024.0, 0, True], "two finite steps: grow, step"
    if out["jit"]:
        assert out["compiled"] == [512.0, True], "a NaN step through train_on_batch"
    # Saved after one more finite step: the counter is 1 at the scale the last backoff left.
    assert out["reloaded"] == [512.0 if out["jit"] else 1024.0, 1, 2]
    assert out["overflow"] == float("inf")


# ------------------------------------------------------------ Paddle


@pytest.mark.framework("paddle")
def test_paddle_on_cpu_runs_the_native_scaler_disabled_and_says_why() -> None:
    paddle = pytest.importorskip("paddle", reason=ZOO["paddle"].install)
    from unifiedamp.conformance.contract import fit
    from unifiedamp.conformance.zoo.paddle_grad_scaler import CPU_SKIP, PaddleGradScaler

    adapter = PaddleGradScaler()
    if adapter.scales:
        pytest.skip(f"paddle scales on {adapter.device}: the CPU behaviour is not shown there")
    # What the adapter reports is what paddle does: a scaler built on CPU disables itself.
    with pytest.warns(UserWarning, match="CUDAPlace"):
        assert paddle.amp.GradScaler(init_loss_scaling=1024.0).is_enable() is False
    assert adapter.expresses(ScalerConfig()) == CPU_SKIP and "only on GPU" in CPU_SKIP
    assert fit(adapter, ScalerConfig()) is None
    with pytest.raises(ValueError, match="disables itself on a CPU place"):
        adapter.new(ScalerConfig())

    handle = adapter.new(ScalerConfig(1024.0, enabled=False))
    assert type(handle[0]) is paddle.amp.GradScaler and handle[0].is_enable() is False
    handle = adapter.iterate(handle, "I")
    # The disabled scaler steps with the inf: the weights are no longer finite.
    assert not all(np.isfinite(a).all() for a in adapter.snapshot(handle))
    assert handle[0].state_dict() == {} and adapter.read(handle).scale == 1.0
    assert adapter.save(handle)["config"]["enabled"] is False
