"""An MLX scaler that an eager update, restore or setter replaced refuses the verbs, so torch's
line ``scaler.update(finite)`` (result dropped) fails loudly instead of never backing off.
MLX has no tracer to tell: inside ``mx.compile`` the same rule holds at trace time. JAX:
tests/jax."""

from __future__ import annotations

from functools import partial

import pytest
from superseded_checks import FIX, SupersededContract

mx = pytest.importorskip("mlx.core")

import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp.backends.mlx import compile as ua_compile  # noqa: E402


def overflow():
    return [mx.array([1.0, float("inf")])]


class TestMlxSuperseded(SupersededContract):
    backend, class_name = "mlx", "MlxGradScaler"

    def loss(self):
        return mx.array(1.0)

    def overflow(self):
        return overflow()


def test_compile_passes_trees_so_the_scaler_given_to_a_step_stays_usable():
    @ua_compile
    def step(s, g):
        g, f = s.unscale(g)
        return s.update(f)

    s = ua.GradScaler(8.0, backend="mlx")
    first, again = step(s, overflow()), step(s, overflow())
    assert first.get_scale() == again.get_scale() == 4.0
    assert s.update(True).get_scale() == 8.0


def test_inside_compile_a_dropped_update_is_refused_when_traced():
    @ua_compile
    def step(s, g):
        g, f = s.unscale(g)
        s.update(f)  # dropped
        return s.update(f)

    with pytest.raises(RuntimeError, match=FIX):
        step(ua.GradScaler(8.0, backend="mlx"), overflow())


def test_the_documented_compiled_recipe_still_trains_and_backs_off():
    model = nn.Linear(2, 1)
    optimizer = optim.Adam(learning_rate=1e-2)
    optimizer.init(model.trainable_parameters())
    scaler = ua.GradScaler(1024.0, backend="mlx")
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(tree, x):
        s = scaler.with_tree(tree)
        _, grads = nn.value_and_grad(model, lambda m: s.scale(m(x).sum()))(model)
        grads, finite = s.unscale(grads)
        s.apply(optimizer, model, grads, finite)
        return s.update(finite).tree()

    tree = scaler.tree()
    for x in ([[float("inf"), 1.0]], [[1.0, 1.0]], [[float("nan"), 1.0]]):
        tree = step(tree, mx.array(x))
        mx.eval(tree, state)
    done = scaler.with_tree(tree)
    assert (done.get_scale(), done.num_skipped_steps, done.num_steps) == (256.0, 2, 3)
