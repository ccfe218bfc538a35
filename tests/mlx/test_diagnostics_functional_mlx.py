"""Diagnostics of the MLX backend: per-leaf overflow counts from a compiled step, the report
that names the leaves by ``tree_flatten``'s dotted paths, the history ring, the collapse
message.

A real ``mlx.nn`` MLP, ``nn.value_and_grad`` and ``mlx.optimizers.Adam`` under ``mx.compile``;
the inf is put into one named gradient inside the compiled step, after the gradient.
"""

from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp._monitor import CollapseMonitor  # noqa: E402
from unifiedamp.backends.mlx import (  # noqa: E402
    LeafCounts,
    MlxGradScaler,
    check_collapse,
    collapse_message,
    history_init,
    history_record,
    overflow_counts,
    overflow_report,
    scale_history,
)
from unifiedamp.diagnostics import GradientOverflow, count_overflow  # noqa: E402

INF, NAN = float("inf"), float("nan")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 16), nn.Linear(16, 16)]
        self.out = nn.Linear(16, 3)

    def __call__(self, x):
        for layer in self.layers:
            x = nn.relu(layer(x))
        return self.out(x)


def batch(poison=None):
    mx.random.seed(1)
    x = mx.random.normal((32, 4))
    y = mx.stack([x.sum(axis=1), x[:, 0] - x[:, 1], x[:, 2]], axis=1)
    if poison is not None:
        x = mx.where(mask(x.shape, (0, 0)), poison, x)
    return x, y


def mask(shape, index):
    m = np.zeros(shape, bool)
    m[index] = True
    return mx.array(m)


def setup(config, inject=()):
    """A compiled train step with diagnostics. ``inject``: (path, index, value) written into
    that gradient (a ``tree_flatten`` path) when the step's ``poison`` is true."""
    mx.random.seed(0)
    model, optimizer = MLP(), optim.Adam(learning_rate=1e-2)
    optimizer.init(model.trainable_parameters())
    scaler = MlxGradScaler(**config.to_dict())
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(tree, history, x, y, poison):
        s = scaler.with_tree(tree)

        def scaled(m):
            loss = mx.mean((m(x).astype(mx.float16).astype(mx.float32) - y) ** 2)
            return s.scale(loss), loss

        (_, loss), grads = nn.value_and_grad(model, scaled)(model)
        flat = dict(tree_flatten(grads))
        for path, index, value in inject:
            flat[path] = mx.where(poison & mask(flat[path].shape, index), value, flat[path])
        grads = _unflatten_like(grads, flat)
        unscaled, finite = s.unscale(grads)
        s.apply(optimizer, model, unscaled, finite)
        history = history_record(history, s, finite)
        return s.update(finite).tree(), history, overflow_counts(unscaled), loss, unscaled

    return model, optimizer, scaler, state, step


def _unflatten_like(template, flat, prefix=""):
    if isinstance(template, dict):
        return {k: _unflatten_like(v, flat, f"{prefix}{k}.") for k, v in template.items()}
    if isinstance(template, list):
        return [_unflatten_like(v, flat, f"{prefix}{i}.") for i, v in enumerate(template)]
    return flat[prefix[:-1]]


LEAF_PATHS = ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
              "out.weight", "out.bias"]
INJECTIONS = {
    "one inf": [("layers.1.weight", (0, 1), INF)],
    "NaN and -inf in one leaf, NaN in another": [
        ("layers.0.bias", 3, NAN), ("layers.0.bias", 5, -INF), ("out.weight", (2, 0), NAN)],
}


@pytest.mark.parametrize("inject", INJECTIONS.values(), ids=INJECTIONS.keys())
def test_the_report_names_exactly_the_gradients_that_got_an_inf_or_nan(inject):
    config = spec.ScalerConfig(2.0**10)
    model, optimizer, scaler, state, step = setup(config, inject)
    tree, history = scaler.tree(), history_init(8)
    x, y = batch()
    tree, history, counts, loss, grads = step(tree, history, x, y, mx.array(False))
    mx.eval(tree, state)
    assert overflow_report(counts, history=history, loss=loss) is None
    before = [np.array(p) for _, p in tree_flatten(model.trainable_parameters())]

    tree, history, counts, loss, grads = step(tree, history, x, y, mx.array(True))
    mx.eval(tree, state)
    report = overflow_report(counts, history=history, loss=loss)
    poisoned = [p for p in LEAF_PATHS if p in {path for path, _, _ in inject}]
    assert report.names == poisoned
    flat = dict(tree_flatten(grads))
    assert list(report.overflows) == [count_overflow(n, np.array(flat[n])) for n in poisoned]
    infs = {p: 0 for p in poisoned}
    nans = dict(infs)
    for path, _, value in inject:
        (infs if np.isinf(value) else nans)[path] += 1
    assert [(o.inf, o.nan) for o in report.overflows] == [(infs[n], nans[n]) for n in poisoned]
    assert all(o.max_finite > 0 for o in report.overflows)
    assert (report.step, report.scale, report.checked, report.loss_finite) == (2, 1024.0, 6, True)
    after = [np.array(p) for _, p in tree_flatten(model.trainable_parameters())]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert scaler.with_tree(tree).get_scale() == 512.0


def varied_tree():
    rng = np.random.default_rng(3)
    f32 = rng.normal(size=(5, 7)).astype(np.float32) * 1e3
    f32[1, 2], f32[3, 3], f32[4, 0], f32[0, 6] = np.inf, -np.inf, np.nan, 3.0e38
    f16 = rng.normal(size=(64,)).astype(np.float16)
    f16[[3, 9]] = np.inf
    f16[10] = 65504.0
    bf16 = mx.where(mask((4, 4), (2, 2)), NAN, mx.array(rng.normal(size=(4, 4))).astype(
        mx.bfloat16))
    return {"a": [mx.array(f32), mx.array(f16)],
            "b": {"bf16": bf16, "scalar": mx.array(NAN), "empty": mx.zeros((0, 3)),
                  "ints": mx.arange(4), "fine": mx.array(rng.normal(size=(3, 3)),
                                                         dtype=mx.float32)}}


def test_counts_compiled_equal_counts_eager_and_numpy():
    tree = varied_tree()
    eager, compiled = overflow_counts(tree), mx.compile(overflow_counts)(tree)
    is_record = lambda c: isinstance(c, LeafCounts)  # noqa: E731
    for (pa, a), (pb, b) in zip(tree_flatten(eager, is_leaf=is_record),
                                tree_flatten(compiled, is_leaf=is_record), strict=True):
        assert pa == pb and isinstance(b, LeafCounts)
        assert [x.dtype for x in a] == [mx.int32, mx.int32, mx.float32, mx.int32]
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and np.array_equal(np.array(x), np.array(y))
    names = ["a.0", "a.1", "b.bf16", "b.scalar"]
    leaves = dict(tree_flatten(tree))
    for counts in (eager, compiled):
        report = overflow_report(counts)
        assert report.names == names and report.checked == 7
        assert list(report.overflows) == [
            count_overflow(n, np.array(leaves[n].astype(mx.float32))) for n in names]
    a0, a1 = overflow_report(eager).overflows[:2]
    assert (a0.inf, a0.nan, a0.max_finite, a0.shape) == (2, 1, np.float32(3.0e38), (5, 7))
    assert (a1.inf, a1.nan, a1.max_finite) == (2, 0, 65504.0)
    assert overflow_report(eager).overflows[3] == GradientOverflow("b.scalar", (), 0, 1, 0.0)


def test_history_across_a_ring_wrap_around_is_the_spec_s_trajectory_step_by_step():
    config = spec.ScalerConfig(1000.0, growth_factor=1.1, backoff_factor=0.7, growth_interval=2,
                               hysteresis=2)
    model, optimizer, scaler, state, step = setup(config, [("layers.0.weight", (0, 0), INF)])
    tree, history = scaler.tree(), history_init(5)
    x, y = batch()
    poison = [False, True, True, False, False, False, True, False, True, True, True, False,
              False, False]
    expected, records = spec.ScalerState.initial(config), []
    for i, bad in enumerate(poison):
        tree, history, counts, loss, _ = step(tree, history, x, y, mx.array(bad))
        mx.eval(tree, history, state)
        expected = spec.update(config, expected, bad)
        records.append((i + 1, expected.scale, bad))  # the scale the update left
        got, want = scale_history(history).as_list(), records[-5:]
        assert [(it, sk) for it, _, sk in got] == [(it, sk) for it, _, sk in want]
        assert [spec.f32_hex(s) for _, s, _ in got] == [spec.f32_hex(s) for _, s, _ in want]
        assert history["count"].item() == i + 1
    assert scaler.with_tree(tree).state == expected
    assert np.array(history["iteration"]).tolist() == [11, 12, 13, 14, 10]
    assert np.array(history["skipped"]).tolist() == [True, False, False, False, True]


def test_a_nan_loss_says_the_model_is_the_problem_in_the_report_and_the_collapse_message():
    config = spec.ScalerConfig(2.0**10)
    model, optimizer, scaler, state, step = setup(config)
    tree, history = scaler.tree(), history_init(4)
    x, y = batch(poison=NAN)
    for _ in range(3):
        tree, history, counts, loss, grads = step(tree, history, x, y, mx.array(False))
        mx.eval(tree, history, state)
    scaler = scaler.with_tree(tree)
    report = overflow_report(counts, history=history, loss=loss)
    flat = dict(tree_flatten(grads))
    assert list(report.overflows) == [o for n in LEAF_PATHS
                                      if (o := count_overflow(n, np.array(flat[n])))]
    assert report.loss_finite is False and (report.step, report.scale) == (3, 256.0)
    message = collapse_message(scaler, report, max_consecutive_skips=3)
    assert message.startswith("Loss scale collapsed at step 3: scale 128.0 (0x43000000); the "
                              "gradients were inf/NaN at each of the last 3 steps")
    assert message.endswith(f" Last overflow: {report.summary()}. {report.cause()}")
    assert report.cause().startswith("The loss itself was inf/NaN before scaling")
    assert "the model, not the scale, is the problem" in message
    try:
        CollapseMonitor(3, "raise").report(
            3, 128.0, 3, lambda: f"Last overflow: {report.summary()}. {report.cause()}")
    except ua.ScaleCollapseError as exc:
        assert message == str(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_collapse(scaler, report, max_consecutive_skips=3) == message
    assert [w.category for w in caught] == [ua.ScaleCollapseWarning]
    assert caught[0].filename == __file__
    assert collapse_message(scaler, report, max_consecutive_skips=4) is None
    tree, history, counts, loss, grads = step(tree, history, *batch(), mx.array(False))
    mx.eval(tree, history, state)
    assert collapse_message(scaler.with_tree(tree), report, max_consecutive_skips=3) is None
    assert overflow_report(counts) is None


def test_inputs_defaults_and_refusals():
    counts = overflow_counts({"w": mx.array([1.0, INF, -2.0])})
    report = overflow_report(counts)
    assert report.step == 0 and np.isnan(report.scale) and report.loss_finite is None
    report = overflow_report(counts, step=mx.array(5), scale=mx.array(64.0), loss=NAN)
    assert (report.step, report.scale, report.loss_finite) == (5, 64.0, False)
    assert overflow_report(counts, loss=mx.array(True)).loss_finite is True
    assert overflow_report(counts, loss=mx.array(False)).loss_finite is False
    assert overflow_report(overflow_counts(mx.array([NAN]))).names == ["grads"]
    with pytest.raises(TypeError, match="overflow_counts\\(grads\\)"):
        overflow_report({"w": mx.ones(2)})
    for bad, error in ((0, ValueError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(error, match=r"history_init\(size\)"):
            history_init(bad)
    scaler = MlxGradScaler(8.0, growth_interval=1)
    with pytest.raises(TypeError, match="takes a MlxGradScaler"):
        history_record(history_init(2), 8.0, True)
    history = history_record(history_init(3), scaler, mx.array(True))
    history = history_record(history, scaler.update(mx.array(True)), False)
    assert scale_history(history).as_list() == [(1, 16.0, False), (2, 8.0, True)]
    skipped = MlxGradScaler(8.0).update(False).update(False)
    assert collapse_message(skipped, max_consecutive_skips=2).startswith(
        "Loss scale collapsed: scale 2.0 (0x40000000)")
    assert "below float32's smallest normal" in collapse_message(MlxGradScaler(2.0**-130))
    with pytest.raises(TypeError, match="outside jax.jit / mx.compile"):
        mx.compile(lambda t: mx.array(collapse_message(scaler.with_tree(t)) is None))(
            scaler.tree())
