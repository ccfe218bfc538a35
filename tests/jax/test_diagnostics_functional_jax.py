"""Diagnostics of the JAX backend: per-leaf overflow counts from a jitted step, the report
that names the leaves by key path, the history ring in the train state, the collapse message.

Real ``jax.grad`` of a real MLP (dict parameters and Flax NNX), real optax optimizers; the
inf is put into one named gradient inside the jitted step, after ``grad``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp._monitor import CollapseMonitor  # noqa: E402
from unifiedamp.backends.jax import (  # noqa: E402
    JaxGradScaler,
    LeafCounts,
    check_collapse,
    collapse_message,
    find_scaler,
    history_init,
    history_record,
    loss_scaled,
    overflow_counts,
    overflow_report,
    scale_history,
    step_if_finite,
    where_finite,
)
from unifiedamp.diagnostics import FIXES, GradientOverflow, count_overflow  # noqa: E402

INF, NAN = float("inf"), float("nan")
LEAF_PATHS = ["dense1.bias", "dense1.kernel", "dense2.bias", "dense2.kernel"]  # tree order


def init_params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"dense1": {"kernel": jax.random.normal(k1, (4, 16)), "bias": jnp.zeros(16)},
            "dense2": {"kernel": jax.random.normal(k2, (16, 3)) * 0.3, "bias": jnp.zeros(3)}}


def mlp(params, x):
    # float16 compute, float32 parameters: mixed precision as it is used
    h = jax.nn.relu(x.astype(jnp.float16) @ params["dense1"]["kernel"].astype(jnp.float16)
                    + params["dense1"]["bias"].astype(jnp.float16))
    out = h @ params["dense2"]["kernel"].astype(jnp.float16)
    return (out + params["dense2"]["bias"].astype(jnp.float16)).astype(jnp.float32)


def batch(poison=None):
    x = jax.random.normal(jax.random.key(1), (32, 4))
    y = jnp.stack([x.sum(1), x[:, 0] - x[:, 1], x[:, 2]], axis=1)
    if poison is not None:
        x = x.at[0, 0].set(poison)
    return x, y


def make_step(tx, inject=()):
    """The README's jitted step plus diagnostics. ``inject``: ((layer, name), index, value)
    written into that gradient after ``jax.grad`` when the ``poison`` argument is true."""

    def step(params, opt_state, scaler, history, x, y, poison):
        def scaled(p):
            loss = jnp.mean((mlp(p, x) - y) ** 2)
            return scaler.scale(loss), loss

        (_, loss), grads = jax.value_and_grad(scaled, has_aux=True)(params)
        for (layer, name), index, value in inject:
            g = grads[layer][name]
            grads[layer][name] = g.at[index].set(jnp.where(poison, value, g[index]))
        unscaled, finite = scaler.unscale(grads)

        def apply(state):
            params, opt_state = state
            updates, opt_state = tx.update(unscaled, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        params, opt_state = step_if_finite(finite, apply, (params, opt_state))
        counts = overflow_counts(unscaled, when=~finite)
        history = history_record(history, scaler, finite)
        return params, opt_state, scaler.update(finite), history, counts, loss, unscaled

    return jax.jit(step)


INJECTIONS = {
    "one inf": [(("dense2", "kernel"), (0, 1), INF)],
    "NaN and -inf in one leaf, NaN in another": [
        (("dense1", "bias"), 3, NAN), (("dense1", "bias"), 5, -INF),
        (("dense2", "kernel"), (2, 0), NAN)],
}


@pytest.mark.parametrize("inject", INJECTIONS.values(), ids=INJECTIONS.keys())
def test_the_report_names_exactly_the_gradients_that_got_an_inf_or_nan(inject):
    tx = optax.adam(1e-2)
    params = init_params()
    scaler, history = JaxGradScaler(2.0**10), history_init(8)
    step = make_step(tx, inject)
    x, y = batch()
    state = (params, tx.init(params), scaler, history)
    *state, counts, loss, grads = step(*state, x, y, False)
    assert overflow_report(counts, history=state[3], loss=loss) is None  # not skipped
    assert jax.tree.leaves(counts) and all(not c.inf and not c.nan for c in jax.tree.leaves(
        counts, is_leaf=lambda c: isinstance(c, LeafCounts)))
    before = state[0]

    *state, counts, loss, grads = step(*state, x, y, True)
    report = overflow_report(counts, history=state[3], loss=loss)
    poisoned = sorted({".".join(path) for path, _, _ in inject})
    assert report.names == poisoned
    # Each entry is NumPy's count of the gradient the step computed (the unscaled one).
    assert list(report.overflows) == [
        count_overflow(name, np.asarray(grads[name.split(".")[0]][name.split(".")[1]]))
        for name in poisoned]
    infs = {".".join(p): 0 for p, _, _ in inject}
    nans = dict(infs)
    for path, _, value in inject:
        (infs if np.isinf(value) else nans)[".".join(path)] += 1
    assert [(o.inf, o.nan) for o in report.overflows] == [(infs[n], nans[n]) for n in poisoned]
    assert all(o.max_finite > 0 for o in report.overflows)
    assert report.overflows[-1].shape == (16, 3)
    assert (report.step, report.scale, report.checked, report.loss_finite) == (2, 1024.0, 4, True)
    assert "the scaler backs off, as designed" in str(report)
    # the skipped step left the parameters alone and backed off
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                    jax.tree.leaves(state[0]), strict=True))
    assert state[2].get_scale() == 512.0


def varied_tree():
    rng = np.random.default_rng(3)
    f32 = rng.normal(size=(5, 7)).astype(np.float32) * 1e3
    f32[1, 2], f32[3, 3], f32[4, 0], f32[0, 6] = np.inf, -np.inf, np.nan, 3.0e38
    f16 = rng.normal(size=(64,)).astype(np.float16)
    f16[[3, 9]] = np.inf
    f16[10] = 65504.0
    bf16 = jnp.asarray(rng.normal(size=(4, 4)), jnp.bfloat16).at[2, 2].set(jnp.nan)
    return {"a": [jnp.asarray(f32), jnp.asarray(f16)],
            "b": {"bf16": bf16, "scalar": jnp.float32(jnp.nan), "empty": jnp.zeros((0, 3)),
                  "ints": jnp.arange(4), "fine": jnp.asarray(rng.normal(size=(3, 3)),
                                                             jnp.float32)}}


def test_counts_under_jit_equal_counts_outside_and_numpy():
    tree = varied_tree()
    outside, inside = overflow_counts(tree), jax.jit(overflow_counts)(tree)
    records = lambda t: jax.tree.leaves(t, is_leaf=lambda c: isinstance(c, LeafCounts))  # noqa: E731
    for a, b in zip(records(outside), records(inside), strict=True):
        assert [str(x.dtype) for x in a] == ["int32", "int32", "float32", "int32"]
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
    expected_names = ["a.0", "a.1", "b.bf16", "b.scalar"]
    leaves = {"a.0": tree["a"][0], "a.1": tree["a"][1], "b.bf16": tree["b"]["bf16"],
              "b.scalar": tree["b"]["scalar"]}
    for counts in (outside, inside, jax.jit(lambda t: overflow_counts(t, when=True))(tree)):
        report = overflow_report(counts)
        assert report.names == expected_names and report.checked == 7
        assert list(report.overflows) == [
            count_overflow(n, np.asarray(leaves[n], np.float32)) for n in expected_names]
    # spot checks against hand counts (the int and empty leaves count nothing)
    a0, a1 = overflow_report(outside).overflows[:2]
    assert (a0.inf, a0.nan, a0.max_finite, a0.shape) == (2, 1, np.float32(3.0e38), (5, 7))
    assert (a1.inf, a1.nan, a1.max_finite) == (2, 0, 65504.0)
    assert overflow_report(outside).overflows[3] == GradientOverflow("b.scalar", (), 0, 1, 0.0)


def test_when_false_gives_zero_counts_that_keep_the_shapes():
    tree = varied_tree()
    for when in (False, jnp.array(False)):
        counts = jax.jit(lambda t, w: overflow_counts(t, when=w))(tree, when)
        for c in jax.tree.leaves(counts, is_leaf=lambda c: isinstance(c, LeafCounts)):
            assert int(c.inf) == int(c.nan) == 0 and float(c.max_finite) == 0.0
        assert counts["a"][0].shape.tolist() == [5, 7]
        assert overflow_report(counts) is None
    with pytest.raises(TypeError, match="when=.*0-d bool"):
        overflow_counts(tree, when=jnp.array([True, False]))


def test_nnx_state_paths_are_dotted_without_value():
    nnx = pytest.importorskip("flax.nnx")

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.dense1 = nnx.Linear(4, 16, dtype=jnp.float16, param_dtype=jnp.float32,
                                     rngs=rngs)
            self.layers = nnx.List([nnx.Linear(16, 16, dtype=jnp.float16,
                                               param_dtype=jnp.float32, rngs=rngs)])
            self.dense2 = nnx.Linear(16, 3, dtype=jnp.float16, param_dtype=jnp.float32,
                                     rngs=rngs)

        def __call__(self, x):
            h = nnx.relu(self.layers[0](nnx.relu(self.dense1(x))))
            return self.dense2(h).astype(jnp.float32)

    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, loss_scaled(optax.adam(1e-2), JaxGradScaler(2.0**10)),
                              wrt=nnx.Param)
    history = history_init(4)

    @nnx.jit
    def train_step(model, optimizer, history, x, y, poison):
        scaler = find_scaler(optimizer.opt_state)

        def scaled(m):
            loss = jnp.mean((m(x) - y) ** 2)
            return scaler.scale(loss), loss

        (_, loss), grads = nnx.value_and_grad(scaled, has_aux=True)(model)
        # the inf, by key path, written without the library's path names
        grads = jax.tree_util.tree_map_with_path(
            lambda p, g: g.at[1, 2].set(jnp.where(poison, jnp.inf, g[1, 2]))
            if jax.tree_util.keystr(p) == "['layers'][0]['kernel'].value" else g, grads)
        unscaled, finite = scaler.unscale(grads)
        history = history_record(history, scaler, finite)
        optimizer.update(model, grads)
        return overflow_counts(unscaled), history, loss, unscaled

    x, y = batch()
    counts, history, loss, grads = train_step(model, optimizer, history, x, y, True)
    report = overflow_report(counts, history=history, loss=loss)
    assert report.names == ["layers.0.kernel"] and report.checked == 6
    expected = count_overflow("layers.0.kernel", np.asarray(grads["layers"][0]["kernel"][...]))
    assert report.overflows == (expected,) and expected.inf == 1
    assert (report.step, report.scale) == (1, 1024.0)
    assert find_scaler(optimizer.opt_state).get_scale() == 512.0
    counts, history, loss, grads = train_step(model, optimizer, history, x, y, False)
    assert overflow_report(counts) is None
    assert scale_history(history).as_list() == [(1, 512.0, True), (2, 512.0, False)]


def test_history_across_a_ring_wrap_around_is_the_spec_s_trajectory_step_by_step():
    config = spec.ScalerConfig(1000.0, growth_factor=1.1, backoff_factor=0.7, growth_interval=2,
                               hysteresis=2)
    tx = optax.sgd(1e-3)
    params = init_params()
    state = (params, tx.init(params), JaxGradScaler(**config.to_dict()), history_init(5))
    step = make_step(tx, [(("dense1", "kernel"), (0, 0), INF)])
    step = jax.jit(step, donate_argnums=(0, 1, 2, 3))  # the history is donatable state
    x, y = batch()
    poison = [False, True, True, False, False, False, True, False, True, True, True, False,
              False, False]
    expected, records = spec.ScalerState.initial(config), []
    for i, bad in enumerate(poison):
        *state, counts, loss, grads = step(*state, x, y, bad)
        expected = spec.update(config, expected, bad)
        records.append((i + 1, expected.scale, bad))  # the scale the update left
        got = scale_history(state[3]).as_list()
        want = records[-5:]
        assert [(it, sk) for it, _, sk in got] == [(it, sk) for it, _, sk in want]
        assert [spec.f32_hex(s) for _, s, _ in got] == [spec.f32_hex(s) for _, s, _ in want]
        assert int(state[3]["count"]) == i + 1
    assert state[2].state == expected
    # the raw ring: record k in slot k % 5
    ring = jax.device_get(state[3])
    assert ring["iteration"].tolist() == [11, 12, 13, 14, 10]
    assert ring["skipped"].tolist() == [True, False, False, False, True]


def test_the_diagnosed_step_is_one_jit_with_no_host_transfer():
    tx = optax.adam(1e-2)
    params = init_params()
    step = make_step(tx, [(("dense2", "bias"), 1, NAN)])
    x, y = jax.device_put(batch())
    good, bad = jax.device_put(False), jax.device_put(True)
    state = (params, tx.init(params), JaxGradScaler(2.0**10), history_init(3))
    *state, _, _, _ = step(*state, x, y, good)  # compile outside the guard
    with jax.transfer_guard("disallow"):
        for poison in (bad, good, bad, bad):
            *state, counts, loss, _ = step(*state, x, y, poison)
    assert scale_history(state[3]).as_list() == [(3, 512.0, False), (4, 256.0, True),
                                                 (5, 128.0, True)]
    assert overflow_report(counts).names == ["dense2.bias"]


def test_a_nan_loss_says_the_model_is_the_problem_in_the_report_and_the_collapse_message():
    tx = optax.adam(1e-2)
    params = init_params()
    step = make_step(tx)
    state = (params, tx.init(params), JaxGradScaler(2.0**10), history_init(4))
    x, y = batch(poison=NAN)
    for _ in range(3):
        *state, counts, loss, grads = step(*state, x, y, False)
    scaler = state[2]
    report = overflow_report(counts, history=state[3], loss=loss)
    flat = {f"{layer}.{name}": np.asarray(g) for layer, leaves in grads.items()
            for name, g in leaves.items()}
    assert list(report.overflows) == [o for n in LEAF_PATHS if (o := count_overflow(n, flat[n]))]
    assert report.loss_finite is False and "dense2.kernel" in report.names
    assert (report.step, report.scale) == (3, 256.0)
    message = collapse_message(scaler, report, max_consecutive_skips=3)
    assert message.startswith("Loss scale collapsed at step 3: scale 128.0 (0x43000000); the "
                              "gradients were inf/NaN at each of the last 3 steps")
    assert message.endswith(f" Last overflow: {report.summary()}. {report.cause()}")
    assert report.cause().startswith("The loss itself was inf/NaN before scaling")
    assert report.cause().startswith("The loss itself was inf/NaN before scaling: the model, "
                                     "not the scale, is the problem")
    assert message.endswith(FIXES + ".")
    # the same words as the imperative backends' monitor
    try:
        CollapseMonitor(3, "raise").report(
            3, 128.0, 3, lambda: f"Last overflow: {report.summary()}. {report.cause()}")
    except ua.ScaleCollapseError as exc:
        assert message == str(exc)
    assert collapse_message(scaler, report, max_consecutive_skips=4) is None
    assert collapse_message(scaler, report, max_consecutive_skips=None) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_collapse(scaler, report, max_consecutive_skips=3) == message
    assert [w.category for w in caught] == [ua.ScaleCollapseWarning]
    assert str(caught[0].message) == message and caught[0].filename == __file__
    with pytest.raises(ua.ScaleCollapseError, match="The loss itself was inf/NaN"):
        check_collapse(scaler, report, max_consecutive_skips=3, on_collapse="raise")
    # a good step ends the run of skips
    *state, counts, loss, _ = step(*state, *batch(), False)
    assert collapse_message(state[2], report, max_consecutive_skips=3) is None


def test_collapse_message_without_a_step_and_for_a_subnormal_scale():
    skipped = JaxGradScaler(8.0).update(False).update(False)
    assert collapse_message(skipped, max_consecutive_skips=2).startswith(
        "Loss scale collapsed: scale 2.0 (0x40000000); the gradients were inf/NaN at each of "
        "the last 2 steps")
    assert collapse_message(skipped, step=jnp.int32(7), max_consecutive_skips=2).startswith(
        "Loss scale collapsed at step 7: ")
    tiny = JaxGradScaler(2.0**-130)
    assert "below float32's smallest normal" in collapse_message(tiny, step=1)
    assert collapse_message(JaxGradScaler(8.0)) is None
    assert collapse_message(JaxGradScaler(8.0, enabled=False).update(False)) is None


def test_report_inputs_and_defaults():
    grads = {"w": jnp.array([1.0, INF, -2.0])}
    counts = overflow_counts(grads)
    report = overflow_report(counts)
    assert report.step == 0 and np.isnan(report.scale) and report.loss_finite is None
    report = overflow_report(counts, step=jnp.int32(5), scale=jnp.float32(64.0),
                             loss=jnp.float16(NAN))
    assert (report.step, report.scale, report.loss_finite) == (5, 64.0, False)
    assert overflow_report(counts, loss=jnp.array(True)).loss_finite is True
    assert overflow_report(counts, loss=jnp.array(False)).loss_finite is False
    assert overflow_report(counts, loss=False).loss_finite is False
    assert overflow_report(counts, loss=jnp.array([1.0, NAN])).loss_finite is False
    assert overflow_report(counts, loss=2.0).loss_finite is True
    assert overflow_report(counts, history=history_init(2)).step == 0  # nothing recorded
    assert overflow_report(overflow_counts(jnp.array([NAN]))).names == ["grads"]
    with pytest.raises(TypeError, match="overflow_counts\\(grads\\)"):
        overflow_report(grads)
    with pytest.raises(TypeError, match="step=...\\) must be an int"):
        overflow_report(counts, step=1.5)


def test_history_and_collapse_refuse_what_they_cannot_use():
    for bad, error in ((0, ValueError), (-3, ValueError), (True, TypeError), (2.0, TypeError),
                       ("8", TypeError)):
        with pytest.raises(error, match=r"history_init\(size\).*e\.g\. history_init\(1000\)"):
            history_init(bad)
    scaler = JaxGradScaler(8.0)
    with pytest.raises(TypeError, match="history_record takes a history"):
        history_record({"scale": jnp.zeros(3)}, scaler, True)
    with pytest.raises(TypeError, match="takes a JaxGradScaler"):
        history_record(history_init(2), 8.0, True)
    with pytest.raises(TypeError, match="update\\(finite\\) got"):
        history_record(history_init(2), scaler, "yes")
    bad = dict(history_init(2), skipped=jnp.zeros(3, bool))
    with pytest.raises(ValueError, match="one length"):
        scale_history(bad)
    with pytest.raises(TypeError, match="outside jax.jit"):
        jax.jit(lambda s: collapse_message(s) or 0)(scaler)
    with pytest.raises(ValueError, match="on_collapse"):
        check_collapse(scaler, on_collapse="log")
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        collapse_message(scaler, max_consecutive_skips=0)
    with pytest.raises(TypeError, match="OverflowReport"):
        collapse_message(scaler, "report")


def test_history_records_the_scale_after_the_update_and_one_when_disabled():
    history = history_init(3)
    scaler = JaxGradScaler(8.0, growth_interval=1)
    history = history_record(history, scaler, jnp.array(True))
    scaler = scaler.update(jnp.array(True))
    assert scale_history(history).as_list() == [(1, scaler.get_scale(), False)] == [
        (1, 16.0, False)]
    history = history_record(history, scaler, False)
    scaler = scaler.update(False)
    assert scale_history(history).as_list() == [(1, 16.0, False), (2, 8.0, True)]
    # The report of the skipped update: the scale it started from, kept beside the ring.
    report = overflow_report(overflow_counts({"w": jnp.array([INF])}), history=history)
    assert (report.step, report.scale) == (2, 16.0)
    off = history_record(history_init(2), JaxGradScaler(8.0, enabled=False), False)
    assert scale_history(off).as_list() == [(1, 1.0, True)]
    ring = history_init(4)
    assert len({id(v) for v in ring.values()}) == 5  # five buffers: all donatable
    # A ring of an earlier release held the scale each update started from: refused.
    old = {k: v for k, v in ring.items() if k != "scale_used"}
    with pytest.raises(TypeError, match=r"made by an earlier unifiedamp.*history_init\(size\)"):
        history_record(old, scaler, True)


def test_the_last_skip_can_be_carried_in_the_train_state_until_the_next_one():
    # The documented pattern: zero counts of the parameters' tree as the initial value, a
    # where_finite select per step keeps the last skipped step's counts, loss, step, scale.
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    last = {"counts": overflow_counts(params, when=False), "loss": jnp.float32(0),
            "step": jnp.int32(0), "scale": jnp.float32(0)}

    @jax.jit
    def step(params, scaler, history, last, x):
        def scaled(p):
            loss = jnp.sum(p["w"] * x) + p["b"]
            return scaler.scale(loss), loss

        (_, loss), grads = jax.value_and_grad(scaled, has_aux=True)(params)
        grads, finite = scaler.unscale(grads)
        history = history_record(history, scaler, finite)
        new = {"counts": overflow_counts(grads, when=~finite), "loss": loss,
               "step": history["count"], "scale": scaler.loss_scale}
        last = where_finite(finite, last, new)
        params = where_finite(finite, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads),
                              params)
        return params, scaler.update(finite), history, last

    state = (params, JaxGradScaler(8.0), history_init(2), last)
    for i in range(5):
        x = jnp.array([1.0, INF if i == 1 else 2.0, 3.0])
        state = step(*state, x)
    last = state[3]
    report = overflow_report(last["counts"], step=last["step"], scale=last["scale"],
                             loss=last["loss"])
    assert report.names == ["w"] and (report.step, report.scale) == (2, 8.0)
    assert report.overflows[0] == GradientOverflow("w", (3,), 1, 0, 3.0)
    assert report.loss_finite is False
