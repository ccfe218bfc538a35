"""Every documented JAX recipe (docs/backends/jax.md) trains exactly like an unscaled run
that skips the same steps: loss_scaled alone, with clipping, with MultiSteps, in flax nnx,
and with axis_name in a default (vma-checked) shard_map and under pmap.

The scale stays a power of two, so scaling the loss and unscaling the gradients is exact
in float32: the scaled run must give the reference's parameters bit for bit (up to the
fusion XLA picks, hence a tolerance of float32 rounding). SGD and clipping
are not scale-invariant, so a wrapper that handed the inner transformation the
still-scaled gradients would be off by the scale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from unifiedamp.backends.jax import JaxGradScaler, find_scaler, loss_scaled  # noqa: E402

pytestmark = pytest.mark.framework("jax")

DOC = Path(__file__).resolve().parents[1] / "docs" / "backends" / "jax.md"
POISON = (1, 4)  # the steps whose data holds an inf: skipped by the scaler


def loss(params, x):
    return ((x @ params["w"] + params["b"] - 1.0) ** 2).mean()


def batch(i):
    # Gradients of norm well above 1, so clip_by_global_norm(1.0) acts on every step.
    x = jnp.arange(24, dtype=jnp.float32).reshape(8, 3) / 8.0 + i
    return x.at[0, 0].set(jnp.inf) if i in POISON else x


def init_params():
    return {"w": jnp.full(3, 0.5), "b": jnp.zeros(())}


def train_scaled(tx, steps=7, scaler_loss=loss):
    params = init_params()
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x):
        scaler = find_scaler(opt_state)
        grads = jax.grad(lambda p: scaler.scale(scaler_loss(p, x)))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for i in range(steps):
        params, opt_state = step(params, opt_state, batch(i))
    return params, opt_state


def train_reference(tx, steps=7):
    """The same run without a scaler, leaving out the poisoned steps."""
    params = init_params()
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x):
        grads = jax.grad(loss)(params, x)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for i in range(steps):
        if i not in POISON:
            params, opt_state = step(params, opt_state, batch(i))
    return params


def assert_same_params(got, expected):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.isfinite(a).all()
        # within float32 rounding of the parameters' initial size (~0.5): the scaled and
        # unscaled steps are fused differently by XLA; a missed unscale is off by 1024x
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=6e-8)


def test_loss_scaled_trains_like_the_unscaled_inner_optimizer():
    scaler = JaxGradScaler(1024.0, growth_interval=2)
    params, opt_state = train_scaled(loss_scaled(optax.sgd(0.01), scaler))
    assert_same_params(params, train_reference(optax.sgd(0.01)))
    # F I F F I F F: 1024, 512, 512, 1024, 512, 512, 1024
    assert find_scaler(opt_state).get_scale() == 1024.0


def test_clipping_goes_inside_loss_scaled_and_clips_unscaled_gradients():
    clip_sgd = lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))  # noqa: E731
    expected = train_reference(clip_sgd())
    params, _ = train_scaled(loss_scaled(clip_sgd(), JaxGradScaler(1024.0, growth_interval=2)))
    assert_same_params(params, expected)
    # The order the page used to show clips the *scaled* gradients: a different run.
    wrong = optax.chain(optax.clip_by_global_norm(1.0),
                        loss_scaled(optax.sgd(0.1), JaxGradScaler(1024.0, growth_interval=2)))
    params, _ = train_scaled(wrong)
    assert not np.allclose(np.asarray(params["w"]), np.asarray(expected["w"]), rtol=1e-3)


def test_multisteps_accumulation_equals_unscaled_multisteps_without_bad_micro_batches():
    def multi():
        return optax.MultiSteps(optax.sgd(0.05), every_k_schedule=2)

    expected = train_reference(multi(), steps=9)
    params, _ = train_scaled(loss_scaled(multi(), JaxGradScaler(1024.0, growth_interval=3)),
                             steps=9)
    assert_same_params(params, expected)


def _doc_block(heading: str) -> str:
    text = DOC.read_text()
    section = text.split(f"## {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_optax_recipe_matches_its_unscaled_reference():
    namespace: dict = {}
    exec(compile(_doc_block("optax"), str(DOC), "exec"), namespace)  # runs one step
    tx, step = namespace["tx"], namespace["step"]
    # The same recipe, unscaled: every transformation of the page's optimizer, in order,
    # read off its definition (loss_scaled(<inner>, ...)).
    source = _doc_block("optax")
    inner_src = re.search(r"loss_scaled\((.*),\s*JaxGradScaler", source, re.S).group(1)
    reference_tx = eval(inner_src, {"optax": optax})  # noqa: S307
    x = jnp.ones((4, 3))
    params = {"w": jnp.ones(3)}
    opt_state = tx.init(params)
    ref_params, ref_state = params, reference_tx.init(params)
    for i in range(5):
        xi = x * (i + 1) if i != 2 else x.at[0, 0].set(jnp.nan)
        params, opt_state = step(params, opt_state, xi)
        if i != 2:
            grads = jax.grad(lambda p, xi=xi: ((xi @ p["w"]) ** 2).mean())(ref_params)
            updates, ref_state = reference_tx.update(grads, ref_state, ref_params)
            ref_params = optax.apply_updates(ref_params, updates)
    assert "clip_by_global_norm" in inner_src  # the page shows clipping, inside the wrapper
    np.testing.assert_allclose(np.asarray(params["w"]), np.asarray(ref_params["w"]),
                               rtol=1e-6, atol=0)


def test_flax_nnx_recipe_equals_an_unscaled_nnx_run():
    nnx = pytest.importorskip("flax.nnx")

    class Linear(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(3, 4, rngs=rngs)
            self.l2 = nnx.Linear(4, 1, rngs=rngs)

        def __call__(self, x):
            return self.l2(nnx.relu(self.l1(x)))

    def make_tx():
        # no clipping here: clipping every step to norm 1 would hide a missed unscale
        return optax.sgd(0.01)

    def run(scaled: bool):
        model = Linear(nnx.Rngs(0))
        tx = loss_scaled(make_tx(), JaxGradScaler(2.0**10, growth_interval=2)) if scaled \
            else make_tx()
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

        @nnx.jit
        def scaled_step(model, optimizer, x):
            scaler = find_scaler(optimizer.opt_state)
            grads = nnx.grad(lambda m: scaler.scale(((m(x) - 1.0) ** 2).mean()))(model)
            optimizer.update(model, grads)

        @nnx.jit
        def plain_step(model, optimizer, x):
            optimizer.update(model, nnx.grad(lambda m: ((m(x) - 1.0) ** 2).mean())(model))

        for i in range(7):
            if scaled:
                scaled_step(model, optimizer, batch(i))
            elif i not in POISON:
                plain_step(model, optimizer, batch(i))
        return nnx.state(model, nnx.Param)

    assert_same_params(run(scaled=True), run(scaled=False))


# A default jax.shard_map checks varying manual axes (vma): parameters sharded over the
# axis give gradients, updates and optimizer state that vary over it, the skip branch's
# zeros and the incoming state do not. Run on 4 host devices in a fresh process (the
# device count is fixed when jax starts).
SHARD_MAP_PROGRAM = r'''
import json, sys
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import Mesh, PartitionSpec as P
from unifiedamp.backends.jax import JaxGradScaler, find_scaler, loss_scaled

POISON = {1: 2}  # step -> the device whose batch holds an inf
n = 4
mesh = Mesh(np.array(jax.devices()[:n]), ("d",))
tx = loss_scaled(optax.adam(0.05), JaxGradScaler(1024.0, growth_interval=2), axis_name="d")
w = jnp.arange(n * 3, dtype=jnp.float32).reshape(n, 3) / 10.0  # a row per device

def batches(i):
    x = jnp.ones((n, 2, 3)) * (i + 1)
    return x.at[POISON[i], 0, 0].set(jnp.inf) if i in POISON else x

def local_loss(w, x):  # w: (1, 3) and x: (1, 2, 3), this device's shards
    return ((x[0] @ w[0] - 1.0) ** 2).mean()

def step(w, opt_state, x):
    scaler = find_scaler(opt_state)
    grads = jax.grad(lambda w: scaler.scale(local_loss(w, x)))(w)
    updates, opt_state = tx.update(grads, opt_state, w)
    return optax.apply_updates(w, updates), opt_state

opt_state = tx.init(w)
specs = jax.tree.map(lambda a: P("d") if a.ndim else P(), opt_state)
fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("d"), specs, P("d")),
                           out_specs=(P("d"), specs)))
for i in range(4):
    w, opt_state = fn(w, opt_state, batches(i))

# the reference: plain adam on every row's loss, without the skipped step
ref_tx = optax.adam(0.05)
ref = jnp.arange(n * 3, dtype=jnp.float32).reshape(n, 3) / 10.0
ref_state = ref_tx.init(ref)
for i in range(4):
    if i in POISON:
        continue
    x = batches(i)
    grads = jax.grad(lambda r: sum(local_loss(r[j:j + 1], x[j:j + 1]) for j in range(n)))(ref)
    updates, ref_state = ref_tx.update(grads, ref_state, ref)
    ref = optax.apply_updates(ref, updates)

# The same steps under pmap, which checks no replication: each device holds its own
# scaler, and only axis_name makes them agree.
pmapped = jax.pmap(step, axis_name="d")
w_p = jnp.arange(n * 3, dtype=jnp.float32).reshape(n, 1, 3) / 10.0
state_p = jax.vmap(tx.init)(w_p)
for i in range(4):
    w_p, state_p = pmapped(w_p, state_p, batches(i)[:, None])
s = find_scaler(state_p)
print(json.dumps({"w": np.asarray(w).tolist(), "ref": np.asarray(ref).tolist(),
                  "state": list(find_scaler(opt_state).state),
                  "pmap_w": np.asarray(w_p).reshape(n, 3).tolist(),
                  "pmap_states": np.stack([s.loss_scale, s.growth_tracker,
                                           s.hysteresis_tracker], 1).tolist()}))
'''


def test_loss_scaled_with_axis_name_skips_on_every_device_in_shard_map_and_pmap(run_python):
    proc = run_python(SHARD_MAP_PROGRAM, env={
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # F I F F: every device skips step 1 (an inf on device 2 only) and backs off together
    assert out["state"] == [1024.0, 0, 0]
    assert out["pmap_states"] == [[1024.0, 0, 0]] * 4
    for w in (out["w"], out["pmap_w"]):
        np.testing.assert_allclose(np.asarray(w, np.float32),
                                   np.asarray(out["ref"], np.float32), rtol=4e-7, atol=0)
