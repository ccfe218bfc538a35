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
                "tests/test_praxis.py (docs/backends/praxis.md)", allow_module_level=True)

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "praxis_stacked.py"


def _example():
    spec = importlib.util.spec_from_file_location("praxis_stacked", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    module = _example()
    import jax

    if len(jax.devices()) < 2:
        pytest.fail("the Praxis tests need 2 CPU devices: start them with "
                    "XLA_FLAGS=--xla_force_host_platform_device_count=2 (.ci/run does)")
    return module


@pytest.fixture(scope="module")
def runs(example):
    return example.train(scaled=True), example.train(scaled=False)


def test_the_example_follows_the_spec_and_the_unscaled_run_bit_for_bit(example, runs):
    scaled, unscaled = runs
    assert example.problems(scaled, unscaled) == []
    # The run holds what it tests: two skipped steps, a backoff each, a growth after.
    assert [float(r["scale"]) for r in scaled] == [1024.0, 512.0, 512.0, 256.0, 256.0, 512.0]
    import numpy as np

    for i in (1, 3):  # an inf in the batch; an inf in the first stacked layer only
        for a, b in zip(_leaves(scaled[i]["params"]), _leaves(scaled[i - 1]["params"]),
                        strict=True):
            np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(
        _leaves(scaled[2]["params"]), _leaves(scaled[1]["params"]), strict=True))


def test_the_skip_does_not_depend_on_paxmls_own_skip(example, runs):
    """enable_skip_step_on_gradient_anomalies=False: the Learner would apply an inf step;
    LossScaledLearner skips it all the same."""
    assert example.problems(example.train(scaled=True, skip_on_anomalies=False), runs[1]) == []


def test_one_scaler_outside_the_vectorized_stack_and_the_state_sharded(runs):
    import jax
    from jax.sharding import PartitionSpec

    from unifiedamp.backends.jax import JaxGradScaler

    state = runs[0][-1]["opt_state"]
    scalers = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, JaxGradScaler))
               if isinstance(x, JaxGradScaler)]
    assert len(scalers) == 1 and scalers[0].loss_scale.shape == ()
    assert scalers[0].loss_scale.sharding.spec == PartitionSpec()
    # The inner state is vectorized over the stack (a group whose moments have the
    # stack's dimension in front), and Adam's moments are sharded like their weights.
    groups = state.inner_state
    stacked = [k for k in groups if k != "no_prefix"]
    assert stacked, f"no vectorized group in {list(groups)}"
    adam = groups[stacked[0]][2]
    moment = adam.m["params"]["stack"]["sub"]["linear"]["w"]
    assert moment.shape[0] == 2 and moment.sharding.spec == PartitionSpec(None, None, "mdl")


def test_paxml_accepts_the_state_descriptions():
    from paxml import tasks_lib
    from praxis import base_layer, optimizers

    from unifiedamp.backends.jax import JaxGradScaler
    from unifiedamp.backends.jax.praxis import loss_scaled

    tx = loss_scaled(_adam().get_grad_transformation(), JaxGradScaler(8.0))
    assert isinstance(tx, optimizers.ShardedGradientTransformation)
    hparams = {"w": base_layer.WeightHParams(shape=[4, 2], tensor_split_dims_mapping=[None, 1])}
    specs = tx.init_partition_spec(hparams)
    import jax

    described = jax.tree.leaves(specs.scaler)
    assert len(described) == len(jax.tree.leaves(JaxGradScaler()))
    assert all(isinstance(h, base_layer.WeightHParams) and h.shape == []
               and h.tensor_split_dims_mapping == [] for h in described)
    assert {str(h.dtype) for h in described} >= {"float32", "int32"}
    partition = base_layer.var_partition_specs(specs, [1, 2], ["data", "mdl"])
    assert all(p == jax.sharding.PartitionSpec()
               for p in jax.tree.leaves(partition.scaler)), partition.scaler
    del tasks_lib  # imported: the module whose isinstance check the trial failed


def test_the_state_goes_through_orbax_as_paxml_checkpoints_it(tmp_path):
    """PaxML saves and restores the optimizer state with orbax, against a freshly
    initialized state as the template: the scaler's scale and trackers come back."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp

    from unifiedamp.backends.jax import JaxGradScaler, find_scaler
    from unifiedamp.backends.jax.praxis import loss_scaled

    tx = loss_scaled(_adam().get_grad_transformation(), JaxGradScaler(1024.0, growth_interval=3))
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    for grads in ([1.0, jnp.inf], [1.0, 2.0]):  # a backoff, then one good step
        _, state = tx.update({"w": jnp.array(grads)}, state, params)
    ocp.PyTreeCheckpointer().save(tmp_path / "opt_state", state)
    restored = ocp.PyTreeCheckpointer().restore(tmp_path / "opt_state", item=tx.init(params))
    assert find_scaler(restored).get_scale() == 512.0
    assert int(find_scaler(restored).growth_tracker) == 1
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_on_jax_0_4_26_shard_map_needs_check_rep_false(example):
    """The JAX backend on Praxis's jax: under its shard_map, lax.cond has no replication
    rule (check_rep=True fails in JAX); with check_rep=False and axis_name, an inf on one
    device skips and backs off on both."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental.shard_map import shard_map
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from unifiedamp.backends.jax import JaxGradScaler, find_scaler, loss_scaled

    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    params = {"w": jnp.ones(2)}

    def body(params, grads):
        tx = loss_scaled(optax.sgd(0.1), JaxGradScaler(8.0), axis_name="d")
        updates, state = tx.update({"w": grads}, tx.init(params), params)
        return updates["w"], find_scaler(state).loss_scale[None]

    def run(check_rep):
        return jax.jit(shard_map(body, mesh=mesh, in_specs=(P(), P("d")),
                                 out_specs=(P(), P("d")), check_rep=check_rep))(
            params, jnp.array([1.0, 1.0, 1.0, jnp.inf]))

    with pytest.raises(NotImplementedError, match="cond"):
        run(True)
    updates, scales = run(False)
    np.testing.assert_array_equal(scales, [4.0, 4.0])
    np.testing.assert_array_equal(updates, [0.0, 0.0])


def test_the_facade_gives_the_jax_scaler_for_praxis_names_and_objects():
    import unifiedamp as ua
    from unifiedamp.backends.jax import JaxGradScaler

    assert isinstance(ua.GradScaler(1024.0, backend="praxis"), JaxGradScaler)
    assert isinstance(ua.GradScaler(1024.0, backend="PaxML"), JaxGradScaler)
    assert isinstance(ua.GradScaler(1024.0, backend=_adam()), JaxGradScaler)  # detected


def test_loss_scaled_refuses_what_praxis_cannot_take():
    import optax

    from unifiedamp.backends.jax import JaxGradScaler
    from unifiedamp.backends.jax.praxis import loss_scaled

    with pytest.raises(TypeError, match="unifiedamp.backends.jax.loss_scaled"):
        loss_scaled(optax.sgd(0.1), JaxGradScaler())
    with pytest.raises(TypeError, match="JaxGradScaler"):
        loss_scaled(_adam().get_grad_transformation(), 1024.0)


def test_a_scaler_inside_the_repeat_prefix_vectorization_is_refused(example):
    import jax
    from praxis import base_layer, optimizer_prefix_vectorization, pax_fiddle

    from unifiedamp.backends.jax import JaxGradScaler
    from unifiedamp.backends.jax.praxis import loss_scaled

    model = pax_fiddle.build(pax_fiddle.Config(example.Net, name="net"))
    batch = example.batches()[0]
    with base_layer.JaxContext.new_context():
        hparams = model.abstract_init_with_metadata(batch)
        params = model.init(jax.random.PRNGKey(0), batch)
    inside = optimizer_prefix_vectorization.get_transformations_with_vectorized_repeat_prefix(
        loss_scaled(_adam().get_grad_transformation(), JaxGradScaler()), hparams)
    with pytest.raises(ValueError, match="one scaler per layer"):
        inside.init(params)
    outside = loss_scaled(optimizer_prefix_vectorization
                          .get_transformations_with_vectorized_repeat_prefix(
                              _adam().get_grad_transformation(), hparams), JaxGradScaler())
    assert outside.init(params).scaler.loss_scale.shape == ()


def test_paxml_learner_alone_would_undo_the_backoff(example):
    """Why LossScaledLearner overrides update_states: with the scaler inside the plain
    Learner's transformation, its skip on anomalies (the default) restores the whole
    optimizer state on an inf, the scale included, so the scale never backs off."""
    import jax
    import jax.numpy as jnp
    from paxml import learners
    from praxis import base_layer, pax_fiddle

    from unifiedamp.backends.jax import JaxGradScaler, find_scaler
    from unifiedamp.backends.jax.praxis import loss_scaled

    class ScalerInside(learners.Learner):
        def get_grad_tx(self, var_weight_hparams):
            return loss_scaled(super().get_grad_tx(var_weight_hparams), JaxGradScaler(1024.0))

    learner = pax_fiddle.build(pax_fiddle.Config(ScalerInside, name="learner", loss_name="loss",
                                                 optimizer=example.optimizer()))
    hparams = {"w": base_layer.WeightHParams(shape=[2])}
    params = {"w": jnp.ones(2)}
    state = learner.get_grad_tx(hparams).init(params)
    with base_layer.JaxContext.new_context():
        _, state = jax.jit(lambda g, s, p: learner.update_states(g, s, p, hparams))(
            {"w": jnp.array([1.0, jnp.inf])}, state, params)
    assert find_scaler(state).get_scale() == 1024.0  # not 512: the backoff was undone


def test_loss_scaled_learner_checks_its_settings():
    from praxis import pax_fiddle

    from unifiedamp.backends.jax.paxml import LossScaledLearner

    with pytest.raises(TypeError, match="loss_scaler must be a"):
        pax_fiddle.build(pax_fiddle.Config(LossScaledLearner, name="learner", loss_name="loss",
                                           loss_scaler=1024.0, optimizer=_adam_config()))
    learner = pax_fiddle.build(pax_fiddle.Config(LossScaledLearner, name="learner",
                                                 loss_name="loss", optimizer=_adam_config()))
    assert learner.loss_scaler.get_scale() == 65536.0  # the spec's default
    with pytest.raises(TypeError, match="LossScaledState"):
        learner.update_states({}, {}, {}, {})


def _adam_config():
    from praxis import optimizers, pax_fiddle, schedules

    return pax_fiddle.Config(optimizers.Adam, learning_rate=0.01,
                             lr_schedule=pax_fiddle.Config(schedules.Constant))


def _adam():
    from praxis import pax_fiddle

    return pax_fiddle.build(_adam_config())


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)
