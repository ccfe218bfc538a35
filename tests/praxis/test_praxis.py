"""Praxis and PaxML (unifiedamp.backends.jax.praxis / .paxml), in their own environment.

Praxis 1.4.0 needs jax 0.4.26: these tests run in the environment ``tools/praxis_env.sh``
builds (``.ci/run`` runs them there); elsewhere they are skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

if importlib.util.find_spec("paxml") is None or importlib.util.find_spec("praxis") is None:
    pytest.skip("Praxis and PaxML run in their own environment: build it with "
                "tools/praxis_env.sh, then .venv-praxis/bin/python -m pytest "
                "tests/praxis (docs/backends/praxis.md)", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402
from paxml import learners, tasks_lib, trainer_lib  # noqa: E402
from praxis import base_layer, optimizers, pax_fiddle, schedules  # noqa: E402
from praxis.layers import linears, normalizations, repeats  # noqa: E402

from unifiedamp.backends.jax import JaxGradScaler  # noqa: E402
from unifiedamp.backends.jax.paxml import LossScaledLearner  # noqa: E402
from unifiedamp.backends.jax.praxis import loss_scaled  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "praxis_stacked.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("praxis_stacked", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if len(jax.devices()) < 2:
        pytest.fail("the Praxis tests need 2 CPU devices: start them with "
                    "XLA_FLAGS=--xla_force_host_platform_device_count=2 (.ci/run does)")
    return module


@pytest.fixture(scope="module")
def runs(example):
    return example.train(scaled=True), example.train(scaled=False)


# ------------------------------------------------------------------ the example


def test_the_example_follows_the_spec_and_the_unscaled_run_bit_for_bit(example, runs):
    scaled, unscaled = runs
    assert example.problems(scaled, unscaled) == []
    # The run holds what it tests: two skipped steps, a backoff each, a growth after.
    assert [float(r["scale"]) for r in scaled] == [1024.0, 512.0, 512.0, 256.0, 256.0, 512.0]
    for i in (1, 3):  # an inf in the batch; an inf in the first stacked layer only
        for a, b in zip(jax.tree.leaves(scaled[i]["params"]),
                        jax.tree.leaves(scaled[i - 1]["params"]), strict=True):
            np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(scaled[2]["params"]), jax.tree.leaves(scaled[1]["params"]), strict=True))


def test_the_skip_does_not_depend_on_paxmls_own_skip(example, runs):
    """enable_skip_step_on_gradient_anomalies=False: the Learner would apply an inf step;
    LossScaledLearner skips it all the same."""
    assert example.problems(example.train(scaled=True, skip_on_anomalies=False), runs[1]) == []


def test_one_scaler_outside_the_vectorized_stack_and_the_state_sharded(runs):
    state = runs[0][-1]["opt_state"]
    assert sorted(state.scaler) == sorted(JaxGradScaler().tree())
    for array in state.scaler.values():
        assert array.shape == () and array.sharding.spec == PartitionSpec()
    # The inner state is vectorized over the stack (a group whose moments have the
    # stack's dimension in front), and Adam's moments are sharded like their weights.
    stacked = [k for k in state.inner_state if k != "no_prefix"]
    assert stacked, f"no vectorized group in {list(state.inner_state)}"
    moment = state.inner_state[stacked[0]][2].m["params"]["stack"]["sub"]["linear"]["w"]
    assert moment.shape[0] == 2 and moment.sharding.spec == PartitionSpec(None, None, "mdl")


# ------------------------------------------------------------------ PaxML's machinery


def test_paxml_turns_the_state_descriptions_into_partition_specs():
    learner = _learner(True)
    hparams = {"params": {"w": base_layer.WeightHParams(shape=[4, 2],
                                                        tensor_split_dims_mapping=[None, 1])}}
    tx = learner.get_grad_tx(hparams)
    assert isinstance(tx, optimizers.ShardedGradientTransformation)
    described = tx.init_partition_spec(hparams).scaler
    assert sorted(described) == sorted(JaxGradScaler().tree())
    assert all(h.shape == [] and h.tensor_split_dims_mapping == [] for h in described.values())
    assert {str(h.dtype) for h in described.values()} == {"float32", "int32"}
    specs = tasks_lib.create_state_partition_specs(hparams, [1, 2], ["data", "mdl"], False,
                                                   [learner])
    assert all(p == PartitionSpec() for p in specs.opt_states[0].scaler.values())


@pytest.mark.parametrize("kind", ["GDA", "FLAX"])
def test_paxmls_checkpointer_saves_and_restores_the_state(kind, tmp_path):
    """PaxML names every array of the train state from its dicts and NamedTuples; GDA is
    what it uses for a model on a mesh."""
    from paxml import checkpoints, train_states
    from paxml.checkpoints import CheckpointType

    tx = loss_scaled(_adam().get_grad_transformation(), JaxGradScaler(1024.0, growth_interval=3))
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    for grads in ([1.0, jnp.inf], [1.0, 2.0]):  # a backoff, then one good step
        _, state = tx.update({"w": jnp.array(grads)}, state, params)

    def train_state(opt_state, step):
        return train_states.TrainState(step=jnp.array(step), mdl_vars=params,
                                       opt_states=[opt_state], extra_state=())

    checkpoint_type = getattr(CheckpointType, kind)
    checkpoints.save_checkpoint(train_state(state, 5), str(tmp_path),
                                checkpoint_type=checkpoint_type)
    template = train_state(tx.init(params), 0)
    gda = checkpoint_type == CheckpointType.GDA
    restored = checkpoints.restore_checkpoint(
        template, str(tmp_path), checkpoint_type=checkpoint_type,
        state_specs=jax.tree.map(lambda _: PartitionSpec(), template) if gda else None,
        global_mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)) if gda else None)
    scaler = tx.scaler(restored.opt_states[0])
    assert (scaler.get_scale(), int(scaler.growth_tracker), int(scaler.skipped_steps)) == (
        512.0, 1, 1)
    for a, b in zip(jax.tree.leaves(restored.opt_states), jax.tree.leaves([state]), strict=True):
        np.testing.assert_array_equal(a, b)


class _Stacked(base_layer.BaseLayer):
    """A feed-forward layer, a Repeat of two, and BatchNorm (non-trainable statistics);
    ``__call__`` returns the loss."""

    def setup(self):
        def feed_forward():
            return pax_fiddle.Config(linears.FeedForward, input_dims=4, output_dims=4)

        self.create_child("inp", feed_forward())
        self.create_child("stack", pax_fiddle.Config(repeats.Repeat, x_times=2,
                                                     sub_tpl=feed_forward()))
        self.create_child("bn", pax_fiddle.Config(normalizations.BatchNorm, dim=4))

    def __call__(self, x):
        return (self.bn(self.stack(self.inp(x))) ** 2).mean()


def _trainer_steps(learner, batches, scaled, layer=_Stacked):
    """What paxml.trainer_lib.train_step_single_learner does around the Learner (its
    variable masks, its default gradient function, update_states, apply_gradient), on
    the loss scaled by ``learner.scaler`` when ``scaled``; the variables after each step."""
    model = pax_fiddle.build(pax_fiddle.Config(layer, name="model"))
    with base_layer.JaxContext.new_context():
        hparams = model.abstract_init_with_metadata(batches[0])
        variables = model.init(jax.random.PRNGKey(0), batches[0])
    excluded_grad, excluded_opt = trainer_lib.get_excluded_var_masks(hparams, learner)
    opt_state = tasks_lib._create_opt_states(variables, hparams, [learner])[0]
    grad_fn = trainer_lib._get_default_grad_fn(excluded_grad, excluded_opt)

    @jax.jit
    def step(variables, opt_state, x):
        scale = learner.scaler(opt_state).scale if scaled else (lambda loss: loss)

        def loss_fn(v, inputs, key):
            with base_layer.JaxContext.new_context():
                loss, updated = model.apply(v, inputs, mutable=[base_layer.NON_TRAINABLE])
            return scale(loss), updated

        (_, forward), grads = grad_fn(loss_fn, learner, variables, x, jax.random.PRNGKey(1))
        with base_layer.JaxContext.new_context():
            variables = {**variables, **forward}
            excluded = jax.tree.map(lambda o, g: o and g, excluded_opt, excluded_grad)
            with_opt = tasks_lib.filter_vars_for_grad_or_opt(variables, excluded)
            hparams_opt = tasks_lib.filter_vars_for_grad_or_opt(hparams, excluded)
            updates, opt_state = learner.update_states(grads, opt_state, with_opt, hparams_opt)
            with_opt = learner.apply_gradient(with_opt, updates, hparams_opt)
            variables = jax.tree.map(lambda e, old, new: old if e else new, excluded_grad,
                                     variables, with_opt)
        return variables, opt_state

    out = []
    for x in batches:
        variables, opt_state = step(variables, opt_state, x)
        out.append(jax.tree.map(np.asarray, variables))
    return out


def _batches(inf_at=1, n=4, spread=1.0):
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.normal(size=(8, 4)) * (spread if i % 2 else 1.0), jnp.float32)
          for i in range(n)]
    if inf_at is not None:
        xs[inf_at] = xs[inf_at].at[0, 0].set(jnp.inf)
    return xs


def _assert_same_weights(scaled, unscaled, but=None):
    """Every variable of ``params`` equal at every step, bit for bit, but those whose path
    contains ``but``."""
    for i, (a, b) in enumerate(zip(scaled, unscaled, strict=True)):
        for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a["params"])[0],
                                jax.tree.leaves(b["params"]), strict=True):
            name = jax.tree_util.keystr(path)
            if but is None or but not in name:
                assert np.array_equal(x, y), f"step {i}: {name} differs"


@pytest.mark.parametrize("settings", [
    {},
    {"bprop_variable_exclusion": ".*inp.*"},
    {"bprop_variable_exclusion": ".*inp.*", "keep_optimizer_state_for_excluded_vars": True},
    {"vectorize_on_repeat_prefix": False},
    {"optimizer": {"clip_gradient_single_norm_to_value": 0.05}},
], ids=["defaults", "bprop-exclusion", "bprop-exclusion-keep-state", "no-vectorization",
        "clip-single-norm"])
def test_the_learners_settings_keep_their_meaning(settings):
    """LossScaledLearner on the scaled loss trains as PaxML's Learner with the same settings
    on the unscaled loss, skipping the inf step: masked variables, BatchNorm statistics and
    the repeated layers included."""
    batches = _batches()
    scaled = _trainer_steps(_learner(True, **settings), batches, True)
    finite = [x for i, x in enumerate(batches) if i != 1]
    unscaled = _trainer_steps(_learner(False, **settings), finite, False)
    _assert_same_weights(scaled, [unscaled[0], *unscaled])


@pytest.mark.parametrize("threshold", [0.05, 1e9])
def test_skip_step_gradient_norm_value_reads_the_unscaled_norm(threshold):
    """The Learner skips a step whose gradient norm exceeds the threshold: it must read
    the true norm (some steps' exceed 0.05, none 1e9), not the scaled one."""
    batches = _batches(inf_at=None, spread=3.0)
    settings = {"skip_step_gradient_norm_value": threshold}
    _assert_same_weights(_trainer_steps(_learner(True, **settings), batches, True),
                         _trainer_steps(_learner(False, **settings), batches, False))


class _Fp8(base_layer.BaseLayer):
    """An fp8 einsum: its scaling statistics are overwrite-with-gradient variables."""

    def setup(self):
        from praxis.layers.injection import fp8_nvidia_gpu

        self.create_variable("w", base_layer.WeightHParams(
            shape=[2, 2], init=base_layer.WeightInit.Constant(0.5)))
        self.create_child("op", pax_fiddle.Config(fp8_nvidia_gpu.Fp8EinsumOp,
                                                  amax_history_length=4))

    def __call__(self, x):
        return (self.op("ij,jk->ik", x, self.theta.w) ** 2).mean()


def test_overwrite_with_gradient_variables_are_neither_unscaled_nor_checked():
    """fp8 layers keep their scaling statistics as variables whose "gradient" is their new
    value (overwrite_with_gradient): they are taken as they come, not divided by the scale.
    The forward statistics and the weights are then PaxML's Learner's on the unscaled
    loss; the output gradients' statistics measure the gradients the backward pass
    quantizes, the scaled ones (x1024), as they must for the next step. (The scale stays
    put here: when it changes, that history holds the old scale's amax for a while and
    the gradients' fp8 quantization departs from an unscaled run's: docs/backends/praxis.md.)"""
    batches = [jnp.array([[1.0, 2.0], [3.0, -4.0]]) * (i + 1) for i in range(3)]
    steady = JaxGradScaler(1024.0, growth_interval=1000)
    scaled = _trainer_steps(_learner(True, loss_scaler=steady), batches, True, _Fp8)
    unscaled = _trainer_steps(_learner(False), batches, False, _Fp8)
    _assert_same_weights(scaled, unscaled, but="output_grad")
    assert np.max(scaled[-1]["params"]["op"]["input_amax_history"]) == 12.0  # not / 1024
    grad_history = [r["params"]["op"]["output_grad_amax_history"][0] for r in (scaled[0],
                                                                                unscaled[0])]
    assert grad_history[0] == 1024 * grad_history[1] != 0


def test_loss_scaler_axis_name_agrees_the_skip_across_pmap_devices():
    """Under pmap with per-device gradients, loss_scaler_axis_name makes an inf on one
    device skip and back off on both."""
    learner = _learner(True, loss_scaler_axis_name="d")
    hparams = {"w": base_layer.WeightHParams(shape=[2])}
    params = {"w": jnp.ones(2)}
    state = learner.get_grad_tx(hparams).init(params)

    def step(grads, state):
        with base_layer.JaxContext.new_context():
            updates, state = learner.update_states({"w": grads}, state, params, hparams)
        return updates["w"], state.scaler["loss_scale"]

    updates, scales = jax.pmap(step, axis_name="d", in_axes=(0, None))(
        jnp.array([[1.0, 1.0], [1.0, jnp.inf]]), state)
    np.testing.assert_array_equal(scales, [512.0, 512.0])
    np.testing.assert_array_equal(updates, np.zeros((2, 2)))


def test_the_scale_is_a_paxml_summary():
    learner = _learner(True)
    hparams = {"w": base_layer.WeightHParams(shape=[2])}
    params = {"w": jnp.ones(2)}
    state = learner.get_grad_tx(hparams).init(params)
    with base_layer.JaxContext.new_context():
        learner.update_states({"w": jnp.array([1.0, jnp.inf])}, state, params, hparams)
        summaries = base_layer.all_global_summaries()
    (key,) = [k for k in summaries if k.startswith("learning/loss_scale")]
    assert float(summaries[key]) == 512.0


def test_paxml_learner_alone_would_undo_the_backoff():
    """Why LossScaledLearner overrides update_states: with the scaler inside the plain
    Learner's transformation, its skip on anomalies (the default) restores the whole
    optimizer state on an inf, the scale included, so the scale never backs off."""

    class ScalerInside(learners.Learner):
        def get_grad_tx(self, var_weight_hparams):
            return loss_scaled(super().get_grad_tx(var_weight_hparams), JaxGradScaler(1024.0))

    learner = pax_fiddle.build(pax_fiddle.Config(ScalerInside, name="learner", loss_name="loss",
                                                 optimizer=_adam_config()))
    hparams = {"w": base_layer.WeightHParams(shape=[2])}
    params = {"w": jnp.ones(2)}
    tx = learner.get_grad_tx(hparams)
    state = tx.init(params)
    with base_layer.JaxContext.new_context():
        _, state = jax.jit(lambda g, s, p: learner.update_states(g, s, p, hparams))(
            {"w": jnp.array([1.0, jnp.inf])}, state, params)
    assert tx.scaler(state).get_scale() == 1024.0  # not 512: the backoff was undone


# ------------------------------------------------------------------ loss_scaled


def test_a_scaler_inside_the_repeat_prefix_vectorization_is_refused(example):
    from praxis import optimizer_prefix_vectorization as vectorization

    model = pax_fiddle.build(pax_fiddle.Config(example.Net, name="net"))
    batch = example.batches()[0]
    with base_layer.JaxContext.new_context():
        hparams = model.abstract_init_with_metadata(batch)
        params = model.init(jax.random.PRNGKey(0), batch)
    adam = _adam().get_grad_transformation()
    inside = vectorization.get_transformations_with_vectorized_repeat_prefix(
        loss_scaled(adam, JaxGradScaler()), hparams)
    with pytest.raises(ValueError, match="one scaler per layer"):
        inside.init(params)
    outside = loss_scaled(vectorization.get_transformations_with_vectorized_repeat_prefix(
        adam, hparams), JaxGradScaler())
    assert outside.init(params).scaler["loss_scale"].shape == ()


def test_loss_scaled_refuses_what_praxis_cannot_take():
    import optax

    with pytest.raises(TypeError, match="unifiedamp.backends.jax.loss_scaled"):
        loss_scaled(optax.sgd(0.1), JaxGradScaler())
    with pytest.raises(TypeError, match="JaxGradScaler"):
        loss_scaled(_adam().get_grad_transformation(), 1024.0)
    tx = loss_scaled(_adam().get_grad_transformation(), JaxGradScaler())
    with pytest.raises(TypeError, match="LossScaledState this transformation's init"):
        tx.scaler(optax.sgd(0.1).init({"w": jnp.ones(2)}))
    from unifiedamp.backends.jax import find_scaler

    with pytest.raises(ValueError, match=r"tx.scaler\(opt_state\)"):
        find_scaler(tx.init({"w": jnp.ones(2)}))
    from unifiedamp.backends.jax import loss_scaled as optax_loss_scaled

    with pytest.raises(TypeError, match="a Praxis state"):
        optax_loss_scaled(optax.sgd(0.1), JaxGradScaler()).update(
            {"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))


def test_loss_scaled_learner_checks_its_settings():
    with pytest.raises(TypeError, match="loss_scaler must be a"):
        _learner(True, loss_scaler=1024.0)
    learner = pax_fiddle.build(pax_fiddle.Config(LossScaledLearner, name="learner",
                                                 loss_name="loss", optimizer=_adam_config()))
    assert learner.loss_scaler.get_scale() == 65536.0  # the spec's default
    with pytest.raises(TypeError, match="LossScaledState"):
        learner.update_states({}, {}, {}, {})


def test_on_jax_0_4_26_shard_map_needs_check_rep_false(example):
    """The JAX backend on Praxis's jax: under its shard_map, lax.cond has no replication
    rule (check_rep=True fails in JAX); with check_rep=False and axis_name, an inf on one
    device skips and backs off on both."""
    import optax
    from jax.experimental.shard_map import shard_map
    from jax.sharding import Mesh

    from unifiedamp.backends.jax import find_scaler
    from unifiedamp.backends.jax import loss_scaled as optax_loss_scaled

    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    params = {"w": jnp.ones(2)}

    def body(params, grads):
        tx = optax_loss_scaled(optax.sgd(0.1), JaxGradScaler(8.0), axis_name="d")
        updates, state = tx.update({"w": grads}, tx.init(params), params)
        return updates["w"], find_scaler(state).loss_scale[None]

    def run(check_rep):
        return jax.jit(shard_map(body, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec("d")),
                                 out_specs=(PartitionSpec(), PartitionSpec("d")),
                                 check_rep=check_rep))(params, jnp.array([1.0, 1.0, 1.0, jnp.inf]))

    with pytest.raises(NotImplementedError, match="cond"):
        run(True)
    updates, scales = run(False)
    np.testing.assert_array_equal(scales, [4.0, 4.0])
    np.testing.assert_array_equal(updates, [0.0, 0.0])


def test_the_facade_gives_the_jax_scaler_for_praxis_names_and_objects():
    import unifiedamp as ua

    assert isinstance(ua.GradScaler(1024.0, backend="praxis"), JaxGradScaler)
    assert isinstance(ua.GradScaler(1024.0, backend="PaxML"), JaxGradScaler)
    assert isinstance(ua.GradScaler(1024.0, backend=_adam()), JaxGradScaler)  # detected


# ------------------------------------------------------------------ helpers


def _adam_config(**settings):
    return pax_fiddle.Config(optimizers.Adam, learning_rate=0.01,
                             lr_schedule=pax_fiddle.Config(schedules.Constant), **settings)


def _adam():
    return pax_fiddle.build(_adam_config())


def _learner(scaled, optimizer=None, **settings):
    if scaled:
        settings.setdefault("loss_scaler", JaxGradScaler(1024.0, growth_interval=2))
    return pax_fiddle.build(pax_fiddle.Config(
        LossScaledLearner if scaled else learners.Learner, name="learner", loss_name="loss",
        optimizer=_adam_config(**(optimizer or {})), **settings))
