"""The Paddle backend in training loops: bitwise the plain loop with every optimizer, clipping
and accumulation; a skipped step touches nothing; ``minimize``, parameter groups, sparse and
float64/bfloat16 gradients, the functional ``unscale``, copies, and the misuse messages."""

from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from paddle_helpers import (  # noqa: E402
    INF,
    NAN,
    assert_same,
    batch,
    loss_of,
    make_opt,
    mlp,
    one_step,
    paddle_scalar,
    scaler_of,
    snapshot,
)

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402


def train(opt_name, scaler=None, steps=6, clip=None, manual_clip=None, minimize=False,
          unscale_first=False, accumulate=1):
    model = mlp()
    grad_clip = paddle.nn.ClipGradByGlobalNorm(clip) if clip else None
    opt = make_opt(opt_name, model.parameters(), grad_clip)
    for step in range(steps):
        for micro in range(accumulate - 1):  # all but the last micro-batch: backward only
            loss = loss_of(model, *batch(seed=100 * step + micro)) / accumulate
            (scaler.scale(loss) if scaler else loss).backward()
        loss = loss_of(model, *batch(seed=10 + step)) / accumulate
        if scaler is None:
            loss.backward()
            if manual_clip:
                paddle.nn.utils.clip_grad_norm_(model.parameters(), manual_clip)
            opt.step()
        elif minimize:
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(opt, scaled)
        else:
            scaler.scale(loss).backward()
            if manual_clip or unscale_first:
                scaler.unscale_(opt)
            if manual_clip:
                paddle.nn.utils.clip_grad_norm_(model.parameters(), manual_clip)
            scaler.step(opt)
            scaler.update()
        opt.clear_grad()
    return snapshot(model, opt)


VARIANTS = {"loop": {}, "minimize": {"minimize": True}, "unscale_first": {"unscale_first": True},
            "grad_clip": {"clip": 0.05}, "clip_grad_norm_": {"manual_clip": 0.05},
            "minimize_grad_clip": {"minimize": True, "clip": 0.05},
            "accumulate": {"accumulate": 2}}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_finite_training_with_the_scaler_equals_training_without_it(name, variant):
    # Powers of two scale and unscale exactly: every parameter and optimizer tensor
    # must be bitwise those of the plain loop, the scale growing 1024 -> 8192 meanwhile.
    kwargs = VARIANTS[variant]
    reference = train(name, **{k: v for k, v in kwargs.items()
                               if k in ("clip", "manual_clip", "accumulate")})
    scaler = scaler_of(1024.0, growth_interval=2)
    assert_same(reference, train(name, scaler=scaler, **kwargs), f"{name} {variant}")
    assert scaler.get_scale() == 8192.0
    assert (scaler.num_steps, scaler.num_skipped_steps) == (6, 0)
    assert not np.array_equal(reference[0], train(name, steps=0)[0])  # it trained


def test_clipping_really_clipped():
    # The clip threshold is small enough that clipping changes the result, so the
    # equality above compares clipped runs, not two unclipped ones.
    assert not np.array_equal(train("sgd")[0], train("sgd", clip=0.05)[0])
    assert not np.array_equal(train("sgd")[0], train("sgd", manual_clip=0.05)[0])


def test_a_scale_that_is_not_a_power_of_two_stays_within_float32_rounding():
    # Non-power-of-two scales round, so only closeness holds; growth by 3 on the way.
    reference = train("adam")
    got = train("adam", scaler=scaler_of(1000.0, growth_factor=3.0, growth_interval=2))
    for a, b in zip(reference, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_inf_step_is_skipped_and_leaves_params_and_optimizer_state(name):
    # A skipped step must touch neither the parameters nor any optimizer tensor (moments,
    # beta-pow accumulators, velocity, weight decay), as if the iteration never happened.
    model = mlp()
    opt = make_opt(name, model.parameters())
    scaler = scaler_of(1024.0)
    one_step(scaler, model, opt, seed=1)
    before = snapshot(model, opt)
    assert one_step(scaler, model, opt, seed=2, poison=NAN) is None
    assert scaler.last_step_skipped is True
    assert_same(before, snapshot(model, opt), f"{name}: the skipped step changed state")
    assert scaler.get_scale() == 512.0
    assert (scaler.num_steps, scaler.num_skipped_steps) == (2, 1)
    # and the run goes on as if that iteration had never been there (beta powers too)
    one_step(scaler, model, opt, seed=3)
    ref_model = mlp()
    ref_opt = make_opt(name, ref_model.parameters())
    ref = scaler_of(1024.0)
    one_step(ref, ref_model, ref_opt, seed=1)
    one_step(ref, ref_model, ref_opt, seed=3)
    assert_same(snapshot(ref_model, ref_opt), snapshot(model, opt), name)


def test_minimize_skips_like_paddles_and_reports():
    # Paddle's one-call verb: (None, None) on a skip, optimizer.minimize's result otherwise,
    # and it updates the scale itself.
    model = mlp()
    opt = make_opt("adam", model.parameters())
    scaler = scaler_of(1024.0)
    scaled = scaler.scale(loss_of(model, *batch(poison=INF)))
    scaled.backward()
    before = snapshot(model, opt)
    assert scaler.minimize(opt, scaled) == (None, None)  # Paddle's skipped result
    assert scaler.last_step_skipped and scaler.state == spec.ScalerState(512.0, 0, 0)
    assert_same(before, snapshot(model, opt))
    opt.clear_grad()
    scaled = scaler.scale(loss_of(model, *batch()))
    scaled.backward()
    ops, params_grads = scaler.minimize(opt, scaled)
    assert len(params_grads) == 4 and not scaler.last_step_skipped
    assert scaler.state == spec.ScalerState(512.0, 1, 0)


def test_parameter_groups_are_all_unscaled_and_checked():
    # Paddle's dict parameter groups: every group's gradients are unscaled (bitwise the
    # plain run's), and an inf in either group skips the whole step.
    def run(scaler, poison_group=None):
        a, b = mlp(seed=0), mlp(seed=1)
        opt = paddle.optimizer.Adam(learning_rate=1e-2, parameters=[
            {"params": a.parameters()}, {"params": b.parameters(), "learning_rate": 0.1}])
        for step in range(3):
            poison = (step == 1)
            loss = (loss_of(a, *batch(step, INF if poison and poison_group == 0 else None))
                    + loss_of(b, *batch(step + 5, INF if poison and poison_group == 1 else None)))
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            opt.clear_grad()
        return snapshot(a, opt) + snapshot(b, opt)

    assert_same(run(None), run(scaler_of(1024.0, growth_interval=1)))
    for group in (0, 1):
        scaler = scaler_of(1024.0, growth_interval=1)
        got = run(scaler, poison_group=group)
        assert scaler.num_skipped_steps == 1 and scaler.get_scale() == 2048.0, group
        assert all(np.isfinite(x).all() for x in got), group


def test_update_with_new_scale_float_array_or_tensor():
    # torch's update(new_scale): the scale is set (rounded to float32), trackers kept;
    # anything else is refused without a change.
    scaler = scaler_of(1024.0, growth_interval=5)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    one_step(scaler, model, opt)
    scaler.update(8.0)
    assert scaler.state == spec.ScalerState(8.0, 1, 0)  # trackers kept, as torch
    assert scaler.scale(paddle_scalar(1.0)).item() == 8.0
    scaler.update(new_scale=paddle.to_tensor([0.1], dtype="float64"))
    assert scaler.get_scale() == spec.f32(0.1)
    scaler.update(new_scale=np.array([4.0]))
    assert scaler.get_scale() == 4.0
    for bad, exc in [(0.0, ValueError), (NAN, ValueError), ("8", TypeError),
                     (paddle.ones([2]), TypeError), (paddle.to_tensor([True]), TypeError),
                     (paddle.to_tensor([1], dtype="int32"), TypeError)]:
        with pytest.raises(exc, match="new_scale must be"):
            scaler.update(new_scale=bad)
        if bad is not NAN and not (isinstance(bad, paddle.Tensor) and bad.dtype == paddle.bool):
            with pytest.raises(exc, match="new_scale must be" if isinstance(bad, float)
                               else r"as its flag.*new_scale="):
                scaler.update(bad)  # positional: a number is torch's new_scale, a tensor no
    assert scaler.state == spec.ScalerState(4.0, 1, 0)


def test_optimizer_misuse_gets_clear_errors():
    # A non-Paddle optimizer, or one with no gradients, gets a message, not an AttributeError.
    model = mlp()
    scaler = scaler_of(1024.0)
    scaler.scale(loss_of(model, *batch())).backward()
    with pytest.raises(TypeError, match="optimizer must be a paddle.optimizer.Optimizer, got "
                                        "SimpleNamespace"):
        scaler.step(SimpleNamespace(step=lambda: None))
    # an optimizer none of whose parameters has a gradient: torch's message
    idle = make_opt("sgd", mlp(seed=3).parameters())
    with pytest.raises(ua.NoInfChecksError, match=r"^No inf checks were recorded for this "
                                                  r"optimizer\. None of its parameters has a "
                                                  r"gradient.*scaler\.scale\(loss\)\.backward"):
        scaler.step(idle)


def test_deepcopy_and_pickle_keep_config_and_state_and_are_independent():
    # Checkpoint tools deepcopy/pickle trainers: the copy must not share the scale tensor.
    scaler = scaler_of(1024.0, hysteresis=3)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    one_step(scaler, model, opt, poison=INF)
    for clone in (copy.deepcopy(scaler), pickle.loads(pickle.dumps(scaler))):
        assert clone.state == scaler.state == spec.ScalerState(1024.0, 0, 1)
        assert clone.config == scaler.config and clone.num_skipped_steps == 1
        clone.update(2.0)  # the clone's scale tensor is its own
        assert clone.scale(paddle_scalar(1.0)).item() == 2.0
        assert scaler.scale(paddle_scalar(1.0)).item() == 1024.0


def sparse_embedding_step(who):
    """One SGD step of ``paddle.nn.Embedding(sparse=True)``: "plain" without a scaler,
    "scaled" through one, "inf" through one with an inf in the loss. Returns the weight's
    change and the scale after the step."""
    paddle.seed(0)
    emb = paddle.nn.Embedding(10, 3, sparse=True)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=emb.parameters())
    scaler = scaler_of(1024.0)
    w = np.ones((3, 3), np.float32)
    if who == "inf":
        w[0, 0] = np.inf
    loss = (emb(paddle.to_tensor([1, 2, 2])) * paddle.to_tensor(w)).sum()
    assert emb.weight.grad is None
    before = emb.weight.numpy().copy()
    if who == "plain":
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        assert emb.weight.grad.is_selected_rows()
        scaler.step(opt)
        scaler.update()
    return (before - emb.weight.numpy()).tolist(), scaler.get_scale()


def test_sparse_embedding_gradients_are_unscaled_and_checked():
    # paddle.nn.Embedding(sparse=True) gives SelectedRows gradients (recommendation
    # models). The torch backend handles sparse gradients; here the step must equal the
    # plain one and an inf must skip. (Paddle's dense kernel given a SelectedRows tensor
    # reads garbage dimensions: a backend that did that would fail here, or crash.)
    plain, scaled, inf = (sparse_embedding_step(who) for who in ("plain", "scaled", "inf"))
    assert scaled[0] == plain[0]
    assert scaled[1] == 1024.0
    assert inf[0] == [[0.0] * 3] * 10 and inf[1] == 512.0


def test_skip_counters_and_paddles_cache_found_inf():
    # LR schedulers and loggers read last_step_skipped/num_skipped_steps; PaddleNLP reads
    # _cache_found_inf.
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    scaler = scaler_of(1024.0)
    seen = []
    for i, kind in enumerate("FIFNIF"):
        one_step(scaler, model, opt, seed=i, poison=None if kind == "F" else NAN)
        # PaddleNLP's Trainer reads _cache_found_inf after update() to know whether it stepped
        seen.append((scaler.last_step_skipped, bool(scaler._cache_found_inf)))
    assert seen == [(k != "F", k != "F") for k in "FIFNIF"]
    assert (scaler.num_steps, scaler.num_skipped_steps) == (6, 3)


def test_functional_unscale_counts_towards_the_update():
    # unscale(grads) returns copies and its inf check feeds the next update().
    scaler = scaler_of(1024.0)
    scaler.scale(paddle_scalar(1.0))
    grads = [paddle.to_tensor([2048.0, 512.0]), paddle.to_tensor([1.0, INF])]
    out, finite = scaler.unscale(grads)
    assert out[0].numpy().tolist() == [2.0, 0.5] and not bool(finite)
    assert grads[0].numpy().tolist() == [2048.0, 512.0]  # copies: the inputs stay
    scaler.update()
    assert scaler.state == spec.ScalerState(512.0, 0, 0)


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
def test_functional_unscale_keeps_the_graph_of_gradients_that_have_one(enabled):
    """A gradient penalty (docs/recipes/penalty.md): the gradients of
    paddle.grad(scaler.scale(loss), params, create_graph=True), unscaled by unscale(),
    stay differentiable, as on JAX, MLX and Keras. A detached copy would leave the penalty
    out of the parameters' gradients without an error."""
    model = mlp()
    scaler = scaler_of(1024.0, enabled=enabled)
    params = list(model.parameters())
    x, y = batch()

    def penalty_grads(unscale):
        scaled = paddle.grad(scaler.scale(loss_of(model, x, y)), params, create_graph=True)
        unscaled = unscale(scaled)
        penalty = sum(g.pow(2).sum() for g in unscaled)
        return [g.numpy() for g in unscaled], [g.numpy() for g in paddle.grad(penalty, params)]

    inv_scale = 1.0 / scaler.get_scale()
    by_hand = penalty_grads(lambda scaled: [g * inv_scale for g in scaled])
    via_unscale = penalty_grads(lambda scaled: scaler.unscale(scaled)[0])
    for a, b in zip([*by_hand[0], *by_hand[1]], [*via_unscale[0], *via_unscale[1]],
                    strict=True):
        np.testing.assert_array_equal(a, b)
    scaler.update()
    assert scaler.get_scale() == (1024.0 if enabled else 1.0)


def test_update_clears_the_functional_checks_so_one_inf_skips_one_update():
    model = mlp()
    scaler = scaler_of(1024.0, growth_interval=1)
    scales = []
    for poison in (INF, None, None):
        loss = scaler.scale(loss_of(model, *batch(poison=poison)))
        _, finite = scaler.unscale(paddle.grad(loss, model.parameters()))
        scaler.update()
        scales.append((bool(finite), scaler.get_scale()))
    # backed off once, then grew at each finite update
    assert scales == [(False, 512.0), (True, 1024.0), (True, 2048.0)]


def test_a_float64_gradient_is_checked_in_float64():
    # 1e39 is finite in float64 and inf in float32: a float32 check would skip the step.
    w = paddle.create_parameter([2], "float64",
                                default_initializer=paddle.nn.initializer.Constant(1.0))
    opt = paddle.optimizer.SGD(learning_rate=1.0, parameters=[w])
    scaler = scaler_of(2.0)
    loss = (w * paddle.to_tensor([1e39, -1.0], dtype="float64")).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert not scaler.last_step_skipped and scaler.state.growth_tracker == 1
    assert w.numpy().tolist() == [1.0 - 1e39, 2.0]


def bf16_problem(lr=0.5):
    """A bfloat16 parameter with SGD(multi_precision=True): it runs on Paddle's CPU kernels
    (bf16 elementwise ops exist) and takes the backend's non-float32 unscale path."""
    w = paddle.create_parameter([4], "bfloat16",
                                default_initializer=paddle.nn.initializer.Constant(1.0))
    opt = paddle.optimizer.SGD(learning_rate=lr, parameters=[w], multi_precision=True)
    return w, opt


def bf16_loss(w, poison=None):
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    if poison is not None:
        x[1] = poison
    return (w * paddle.to_tensor(x).astype("bfloat16")).sum()


def bf16_snapshot(w, opt):
    state = opt.state_dict()
    master = [v.numpy().copy() for v in state.get("master_weights", {}).values()]
    return [w.astype("float32").numpy().copy(), *master]


@pytest.mark.filterwarnings("ignore:Loss scaling is unnecessary with bfloat16")
def test_bfloat16_parameters_with_multi_precision_sgd_step_and_skip():
    w, opt = bf16_problem()
    ref_w, ref_opt = bf16_problem()
    scaler = scaler_of(1024.0, growth_interval=2)
    history = []
    for step, poison in enumerate((None, INF, None, NAN, None, None)):
        scaler.scale(bf16_loss(w, poison)).backward()
        assert w.grad.dtype == paddle.bfloat16
        scaler.unscale_(opt)
        if poison is None:
            # unscaled exactly: the gradient of sum(w * x) is x
            assert w.grad.astype("float32").numpy().tolist() == [1.0, 2.0, 3.0, 4.0], step
        before = bf16_snapshot(w, opt)
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        history.append(scaler.last_step_skipped)
        if poison is None:
            bf16_loss(ref_w).backward()
            ref_opt.step()
            ref_opt.clear_grad()
            assert_same(bf16_snapshot(ref_w, ref_opt), bf16_snapshot(w, opt), f"step {step}")
        else:
            assert_same(before, bf16_snapshot(w, opt), f"skipped step {step}")
    assert history == [False, True, False, True, False, False]
    assert scaler.state == spec.ScalerState(512.0, 0, 0)
    assert w.astype("float32").numpy().tolist() == [-1.0, -3.0, -5.0, -7.0]  # 4 steps


def test_unscale_twice_or_after_step_raises_torchs_messages():
    # A second unscale_ would divide the gradients twice; torch's exact messages.
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    scaler = scaler_of(1024.0)
    scaler.scale(loss_of(model, *batch())).backward()
    scaler.unscale_(opt)
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) has already been called on this "
                                           r"optimizer since the last update\(\)\.$"):
        scaler.unscale_(opt)
    assert_same(grads, [p.grad.numpy() for p in model.parameters()], "unscaled twice")
    scaler.step(opt)
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) is being called after step\(\)\.$"):
        scaler.unscale_(opt)
    # torch's sentence, then the fix (a paddle script in static mode may never call update()).
    with pytest.raises(RuntimeError, match=r"^step\(\) has already been called since the last "
                                           r"update\(\)\. Call scaler.update\(\) once per "
                                           r"iteration, after the last step\(\)\.$"):
        scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    one_step(scaler, model, opt)  # a new iteration starts clean
    assert scaler.num_steps == 2


def test_disabled_scaler_is_a_pass_through():
    # enabled=False: every verb passes through, even an inf step (the user turned it off).
    scaler = scaler_of(1024.0, enable=False)
    model = mlp()
    opt = make_opt("sgd", model.parameters())
    loss = loss_of(model, *batch(poison=INF))
    assert scaler.scale(loss) is loss
    loss.backward()
    scaler.unscale_(opt)
    scaler.step(opt)  # steps, inf and all: the scaler is off
    scaler.update()
    assert not np.isfinite(model.parameters()[0].numpy()).all()
    assert scaler.num_steps == 0 and scaler.get_scale() == 1.0
    assert scaler.native_state_dict() == {}  # Paddle's habit
    assert scaler.state_dict()["config"]["enabled"] is False


@pytest.mark.parametrize("wrong", [None, 42, "sgd", [None]])
def test_a_value_that_is_not_an_optimizer_is_named_by_step_unscale_and_minimize(wrong):
    model = paddle.nn.Linear(2, 1)
    scaler = scaler_of(1024.0)
    scaled = scaler.scale(model(paddle.ones([1, 2])).sum())
    scaled.backward()
    for message, call in (
            (r"step\(\) takes the paddle optimizer .*got ", lambda: scaler.step(wrong)),
            (r"optimizer must be a paddle.optimizer.Optimizer, got ",
             lambda: scaler.unscale_(wrong)),
            (r"minimize\(\) takes the paddle optimizer .*got ",
             lambda: scaler.minimize(wrong, scaled))):
        with pytest.raises(TypeError, match=message + type(wrong).__name__):
            call()
    assert scaler.state == spec.ScalerState(1024.0, 0, 0)


