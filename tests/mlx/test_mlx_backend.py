"""The MLX backend: what is specific to MLX (the shared contract runs in
test_conformance.py)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.backends.mlx import MlxGradScaler, all_finite  # noqa: E402


def test_detected_from_mlx_arrays_and_immutable():
    scaler = ua.GradScaler(backend=mx.ones(2))
    assert type(scaler) is MlxGradScaler and isinstance(scaler, ua.GradScaler)
    with pytest.raises(AttributeError, match="immutable"):
        scaler.loss_scale = mx.array(1.0)


def test_torch_style_load_state_dict_fails_loudly_showing_the_right_line():
    # The JAX scaler says the same (tests/jax/test_jax_backend.py).
    scaler = ua.GradScaler(8.0, backend="mlx")
    saved = ua.GradScaler(64.0, backend="mlx").state_dict()
    with pytest.raises(TypeError, match=r"immutable value: load_state_dict\(\) cannot change it "
                                        r"in place.*scaler = scaler.restore\(state_dict\)"):
        scaler.load_state_dict(saved)  # torch's habit: the result would be dropped
    assert scaler.restore(saved).get_scale() == 64.0


def test_subnormal_scales_follow_the_spec_on_the_cpu():
    config = spec.ScalerConfig(2.0**-140, growth_factor=1.1, backoff_factor=0.7,
                               growth_interval=1)
    scaler, state = MlxGradScaler(**config.to_dict()), spec.ScalerState.initial(config)
    for finite in [True, False, True, False, False]:
        scaler = scaler.update(mx.array(finite))
        state = spec.update(config, state, not finite)
        assert spec.f32_hex(scaler.get_scale()) == spec.f32_hex(state.scale)


def test_compiled_training_loop_with_a_real_model_and_optimizer():
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(4, 16), nn.Linear(16, 1)

        def __call__(self, x):
            return self.l2(nn.relu(self.l1(x)))

    mx.random.seed(0)
    model, optimizer = MLP(), optim.Adam(learning_rate=1e-2)
    optimizer.init(model.trainable_parameters())
    scaler = MlxGradScaler(2.0**15, growth_interval=5, hysteresis=2)
    x = mx.random.normal((64, 4))
    y = mx.sum(x, axis=1, keepdims=True)
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(tree, x, y, poison):
        s = scaler.with_tree(tree)
        loss_fn = nn.value_and_grad(
            model, lambda m: s.scale(mx.mean((m(x).astype(mx.float16) - y) ** 2) * poison))
        loss, grads = loss_fn(model)
        grads, finite = s.unscale(grads)
        s.apply(optimizer, model, grads, finite)
        return s.update(finite).tree(), loss / s.loss_scale, finite

    tree, losses, finites = scaler.tree(), [], []
    for i in range(60):
        tree, loss, finite = step(tree, x, y, mx.array(float("inf") if i in (3, 4) else 1.0))
        mx.eval(tree, state)
        losses.append(loss.item())
        finites.append(finite.item())
    final = scaler.with_tree(tree)
    assert losses[-1] < losses[0] / 4
    assert finites[3] is False and finites[4] is False and finites.count(True) > 40
    # The compiled trajectory is the reference's for the same finite/non-finite steps
    # (float16 overflows add skips of their own while the scale is large).
    expected = spec.ScalerState.initial(final.config)
    for finite in finites:
        expected = spec.update(final.config, expected, not finite)
    assert final.state == expected


def test_apply_skips_without_touching_parameters_or_optimizer_state():
    model, optimizer = nn.Linear(3, 1), optim.Adam(1e-2)
    scaler = MlxGradScaler(8.0)
    grads = {"weight": mx.full((1, 3), float("nan")), "bias": mx.zeros((1,))}
    before = [np.array(v) for v in (model.weight, model.bias)]
    scaler.apply(optimizer, model, grads, all_finite(grads))
    mx.eval(model.parameters(), optimizer.state)
    assert all((np.array(a) == b).all() for a, b in zip((model.weight, model.bias), before,
                                                        strict=True))
    assert optimizer.state["step"].item() == 0


def test_update_refuses_anything_but_one_flag_like_the_jax_backend():
    scaler = MlxGradScaler(8.0)
    for bad, error in (("no", TypeError), (float("nan"), TypeError),
                       (mx.array([True, False]), ValueError), (mx.array(1.0), TypeError)):
        with pytest.raises(error, match="update\\(finite\\) got"):
            scaler.update(bad)
    assert MlxGradScaler(8.0).update(mx.array(False)).get_scale() == 4.0
    assert scaler.update(np.bool_(True)).state == scaler.state._replace(growth_tracker=1)


def test_skip_counters_and_their_tree():
    scaler = MlxGradScaler(8.0).update(mx.array(False)).update(mx.array(False))
    assert (scaler.num_skipped_steps, scaler.last_step_skipped) == (2, True)
    assert sorted(scaler.tree()) == ["consecutive_skips", "growth_tracker",
                                     "hysteresis_tracker", "loss_scale", "skipped_steps",
                                     "updates"]
    assert scaler.num_steps == 2
    assert scaler.with_tree(scaler.tree()).update(mx.array(True)).last_step_skipped is False


def test_get_scale_and_counters_are_arrays_inside_mx_compile():
    scaler = MlxGradScaler(8.0).update(mx.array(False))

    def read(tree):
        s = MlxGradScaler(8.0).with_tree(tree)
        return s.get_scale(), s.num_skipped_steps, s.last_step_skipped

    scale, skipped, last = mx.compile(read)(scaler.tree())
    assert (scale.item(), skipped.item(), last.item()) == (4.0, 1, True)
    assert (scaler.get_scale(), scaler.num_skipped_steps) == (4.0, 1)  # Python values outside


@pytest.mark.parametrize("verb", ["scale", "unscale"])
def test_python_floats_are_named_with_the_array_to_pass(verb):
    scaler = ua.GradScaler(8.0, backend="mlx")
    with pytest.raises(TypeError, match=rf"{verb}\(\) takes mx.array values .*leaf '1' is a "
                                        r"float 2.0: pass mx.array\(2.0\)"):
        getattr(scaler, verb)([mx.array(1.0), 2.0])
    with pytest.raises(TypeError, match=r"the value is a float 1.0"):
        getattr(scaler, verb)(1.0)
