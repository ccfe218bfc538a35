"""A Praxis model with a stacked layer, trained by PaxML's Learner with one loss scaler.

Runs in the Praxis environment (``tools/praxis_env.sh``; docs/backends/praxis.md):

    .venv-praxis/bin/python examples/praxis_stacked.py

The model: a feed-forward layer, a ``Repeat`` of two feed-forward layers (their variables
stacked, so PaxML's Learner vectorizes the optimizer over the two) and an output layer,
weights sharded over a 1x2 CPU mesh. Adam with gradient clipping, under ``jax.jit``.
Step 1 feeds an inf into the batch; step 3 puts an inf into the gradient of the first
stacked layer only. The run is checked step by step against the spec (the scale as
float32, the trackers as ints) and against an unscaled run that skips the same two steps:
the weights must be the same, bit for bit.
"""

from __future__ import annotations

import os
import sys

if "jax" not in sys.modules:  # two CPU devices, before JAX starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from paxml import learners, tasks_lib
from praxis import base_layer, base_model, optimizers, pax_fiddle, schedules
from praxis.layers import activations, linears, repeats
from praxis.py_utils import NestedMap

from unifiedamp import spec
from unifiedamp.backends.jax import JaxGradScaler
from unifiedamp.backends.jax.paxml import LossScaledLearner

MESH_SHAPE, MESH_AXES = [1, 2], ["data", "mdl"]
DIMS, STEPS = 8, 6
#: Per step: F finite, I an inf in the batch, L an inf in the first stacked layer's gradient.
KINDS = "FIFLFF"
CONFIG = spec.ScalerConfig(1024.0, growth_interval=2)


class Net(base_model.BaseModel):
    """input layer -> Repeat(2 x feed-forward) -> output layer; mean squared error."""

    dims: int = DIMS

    def setup(self) -> None:
        def feed_forward(output_dims: int, **kwargs: object) -> pax_fiddle.Config:
            layer = pax_fiddle.Config(linears.FeedForward, input_dims=self.dims,
                                      output_dims=output_dims, **kwargs)
            layer.weight_split_dims_mapping.wt = [None, "mdl"]  # columns over 2 devices
            return layer

        self.create_child("inp", feed_forward(self.dims))
        self.create_child("stack", pax_fiddle.Config(repeats.Repeat, x_times=2,
                                                     sub_tpl=feed_forward(self.dims)))
        self.create_child("out", feed_forward(
            2, activation_tpl=pax_fiddle.Config(activations.Identity)))

    def compute_predictions(self, batch: NestedMap) -> jax.Array:
        return self.out(self.stack(self.inp(batch.x)))

    def compute_loss(self, predictions: jax.Array, batch: NestedMap) -> tuple:
        loss = jnp.mean((predictions - batch.y) ** 2)
        return NestedMap(loss=(loss, jnp.array(1.0))), NestedMap()


def optimizer() -> pax_fiddle.Config:
    """Adam, clipping the gradients' global norm to 2: the true gradients' norms are 1 to 2.7,
    so some steps clip and some do not; scaled gradients would clip on every step."""
    return pax_fiddle.Config(optimizers.Adam, learning_rate=0.01, clip_gradient_norm_to_value=2.0,
                             lr_schedule=pax_fiddle.Config(schedules.Constant))


def batches() -> list[NestedMap]:
    rng = np.random.default_rng(0)
    out = []
    for kind in KINDS:
        x = rng.normal(size=(4, DIMS)).astype(np.float32)
        if kind == "I":
            x[0, 0] = np.inf
        out.append(NestedMap(x=jnp.asarray(x), y=jnp.asarray(rng.normal(size=(4, 2)),
                                                              jnp.float32)))
    return out


def train(scaled: bool = True, skip_on_anomalies: bool = True) -> list[dict]:
    """Trains for ``STEPS`` steps; returns each step's scaler state and weights.

    ``scaled=False``: PaxML's plain Learner on the unscaled loss, skipping the steps
    whose kind is not ``F`` (the run a loss-scaled one must match).
    ``skip_on_anomalies``: the Learner's ``enable_skip_step_on_gradient_anomalies``."""
    model = pax_fiddle.build(pax_fiddle.Config(Net, name="net", ici_mesh_shape=MESH_SHAPE,
                                               mesh_axis_names=MESH_AXES))
    learner_cls = LossScaledLearner if scaled else learners.Learner
    extra = {"loss_scaler": pax_fiddle.Config(JaxGradScaler, CONFIG.init_scale,
                                              growth_interval=CONFIG.growth_interval)}
    learner = pax_fiddle.build(pax_fiddle.Config(
        learner_cls, name="learner", loss_name="loss", optimizer=optimizer(),
        enable_skip_step_on_gradient_anomalies=skip_on_anomalies, **(extra if scaled else {})))
    data = batches()
    with base_layer.JaxContext.new_context():
        var_hparams = model.abstract_init_with_metadata(data[0])
        params = model.init(jax.random.PRNGKey(0), data[0])  # {"params": ...}, as PaxML holds them

    # Shard the weights and the optimizer state as PaxML would, from their WeightHParams.
    mesh = Mesh(np.array(jax.devices()[:2]).reshape(MESH_SHAPE), MESH_AXES)
    specs = tasks_lib.create_state_partition_specs(var_hparams, MESH_SHAPE, MESH_AXES,
                                                   False, [learner])
    shard = lambda tree: jax.tree.map(lambda s: NamedSharding(mesh, s), tree)  # noqa: E731
    param_shardings, opt_shardings = shard(specs.mdl_vars), shard(specs.opt_states[0])
    params = jax.device_put(params, param_shardings)
    opt_state = jax.device_put(learner.get_grad_tx(var_hparams).init(params), opt_shardings)

    def step(params: dict, opt_state: object, batch: NestedMap, poison: jax.Array) -> tuple:
        scale = learner.scaler(opt_state).scale if scaled else lambda loss: loss

        def loss(p: dict) -> jax.Array:
            (metrics, _), _ = model.apply(p, batch, method=model.__call__, mutable=True)
            return scale(metrics["loss"][0])

        with base_layer.JaxContext.new_context():
            grads = jax.grad(loss)(params)
            stacked = grads["params"]["stack"]["sub"]["linear"]
            stacked["w"] = stacked["w"].at[0].add(poison)  # the first stacked layer only
            updates, opt_state = learner.update_states(grads, opt_state, params, var_hparams)
            params = learner.apply_gradient(params, updates, var_hparams)
        return params, opt_state

    step = jax.jit(step, in_shardings=(param_shardings, opt_shardings, None, None),
                   out_shardings=(param_shardings, opt_shardings))
    records = []
    for kind, batch in zip(KINDS, data, strict=True):
        if scaled or kind == "F":
            poison = jnp.float32(np.inf if kind == "L" else 0.0)
            params, opt_state = step(params, opt_state, batch, poison)
        record = {"kind": kind, "params": jax.tree.map(np.asarray, params)}
        if scaled:
            scaler = learner.scaler(opt_state)
            record.update(scale=np.float32(scaler.loss_scale),
                          growth_tracker=int(scaler.growth_tracker),
                          hysteresis_tracker=int(scaler.hysteresis_tracker))
        records.append(record)
    records[-1]["opt_state"] = opt_state
    return records


def problems(scaled: list[dict], unscaled: list[dict]) -> list[str]:
    """What departs from the spec or from the unscaled run, naming the step; [] if nothing."""
    out = []
    state = spec.ScalerState.initial(CONFIG)
    for i, (got, want) in enumerate(zip(scaled, unscaled, strict=True)):
        state = spec.update(CONFIG, state, got["kind"] != "F")
        if (got["scale"] != np.float32(state.scale)
                or (got["growth_tracker"], got["hysteresis_tracker"])
                != (state.growth_tracker, state.hysteresis_tracker)):
            out.append(f"step {i} ({got['kind']}): scaler {got['scale']!r}, "
                       f"{got['growth_tracker']}, {got['hysteresis_tracker']}; the spec says "
                       f"{np.float32(state.scale)!r}, {state.growth_tracker}, "
                       f"{state.hysteresis_tracker}")
        for path, a, b in zip(_paths(got["params"]), jax.tree.leaves(got["params"]),
                              jax.tree.leaves(want["params"]), strict=True):
            if not np.array_equal(a, b):
                out.append(f"step {i} ({got['kind']}): weight {path} differs from the "
                           f"unscaled run by up to {np.max(np.abs(a - b))}")
    return out


def _paths(tree: object) -> list[str]:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def main() -> int:
    scaled, unscaled = train(scaled=True), train(scaled=False)
    for i, r in enumerate(scaled):
        print(f"step {i} {r['kind']}: scale {r['scale']}, growth_tracker {r['growth_tracker']}")
    found = problems(scaled, unscaled)
    print("\n".join(found) if found else
          "follows the spec; weights equal the unscaled run's, bit for bit")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
