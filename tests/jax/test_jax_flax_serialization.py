"""Flax's msgpack checkpoints (``flax.serialization``) of the JAX scaler: alone, in an optax
state, in a Linen ``TrainState``, with Flax NNX; in any import order, without importing Flax."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from unifiedamp import spec  # noqa: E402
from unifiedamp.backends.jax import JaxGradScaler, find_scaler, loss_scaled  # noqa: E402


@pytest.fixture
def serialization():
    # Imported in the test, as the other tests import Flax: collecting this file imports
    # no Flax.
    return pytest.importorskip("flax.serialization")

EXTRAS = {"init_scale": 1024.0, "growth_factor": 3.0, "backoff_factor": 0.25,
          "growth_interval": 3, "hysteresis": 2, "min_scale": 4.0, "max_scale": 1e6}


def make_tx(scaler):
    return loss_scaled(optax.adam(0.01), scaler)


#: Updates with the scaler the state holds (its config included): loss_scaled's scaler
#: argument is only the initial one.
TX = make_tx(JaxGradScaler())


def init(tx, seed):
    params = {"w": 0.1 * jax.random.normal(jax.random.key(seed), (4,)), "b": jnp.zeros(())}
    return params, tx.init(params)


@jax.jit
def train_step(params, opt_state, x, y):
    scaler = find_scaler(opt_state)

    def scaled_loss(p):
        pred = (x @ p["w"] + p["b"]).astype(jnp.float16)
        return scaler.scale(jnp.mean((pred - y).astype(jnp.float32) ** 2))

    updates, opt_state = TX.update(jax.grad(scaled_loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def batches(n=8, bad=(2, 3)):
    keys = jax.random.split(jax.random.key(100), n)
    out = [(jax.random.normal(k, (8, 4)), jax.random.normal(k, (8,)) / 4) for k in keys]
    for i in bad:  # two overflows in a row: with hysteresis=2 the second one backs off
        out[i] = (out[i][0].at[0, 0].set(jnp.inf), out[i][1])
    return out


def run(params, opt_state, data):
    for x, y in data:
        params, opt_state = train_step(params, opt_state, x, y)
    return params, opt_state


def assert_same_bits(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def test_to_bytes_of_a_loss_scaled_adam_state_resumes_bit_for_bit(serialization):
    data = batches()
    params, opt_state = init(make_tx(JaxGradScaler(**EXTRAS)), seed=0)
    params, opt_state = run(params, opt_state, data[:5])
    saved = serialization.to_bytes({"params": params, "opt_state": opt_state})
    scaler = find_scaler(opt_state)
    # Mid-interval, after two skipped steps: a checkpoint that loses a tracker, a counter or
    # an option resumes on another trajectory.
    assert scaler.state.growth_tracker == 1 and scaler.num_skipped_steps == 2
    assert scaler.get_scale() == 256.0
    params, opt_state = run(params, opt_state, data[5:])

    # A new process's template: other weights, the same config.
    template = dict(zip(("params", "opt_state"), init(make_tx(JaxGradScaler(**EXTRAS)), 1),
                        strict=True))
    restored = serialization.from_bytes(template, saved)
    resumed, resumed_state = run(restored["params"], restored["opt_state"], data[5:])

    assert_same_bits((resumed, resumed_state), (params, opt_state))
    scaler, resumed_scaler = find_scaler(opt_state), find_scaler(resumed_state)
    assert resumed_scaler.config == scaler.config == spec.ScalerConfig(**EXTRAS)
    assert resumed_scaler.state == scaler.state == spec.ScalerState(768.0, 1, 0)
    assert (resumed_scaler.num_skipped_steps, resumed_scaler.num_steps) == (2, 8)


def test_to_state_dict_gives_the_canonical_state_dict_and_the_counters(serialization):
    params, opt_state = init(make_tx(JaxGradScaler(**EXTRAS)), seed=0)
    params, opt_state = run(params, opt_state, batches()[:3])
    entry = serialization.to_state_dict(opt_state)["scaler"]
    assert entry == {"format": "unifiedamp.GradScaler", "version": 1, "backend": "jax",
                     "config": spec.ScalerConfig(**EXTRAS).to_dict(), "scale": 1024.0,
                     "growth_tracker": 0, "hysteresis_tracker": 1, "skipped_steps": 1,
                     "consecutive_skips": 1, "updates": 3}
    assert json.loads(json.dumps(entry)) == entry  # plain Python values
    assert all(type(entry[k]) is int for k in ("growth_tracker", "skipped_steps", "updates"))
    # A canonical state dict: restore reads it (and leaves the counters).
    assert JaxGradScaler().restore(entry).state == find_scaler(opt_state).state
    # from_state_dict gives the state back, leaf for leaf.
    template = init(make_tx(JaxGradScaler()), seed=1)[1]
    assert_same_bits(serialization.from_state_dict(template, serialization.to_state_dict(
        opt_state)), opt_state)


def test_a_template_of_another_config_gives_the_checkpoints_config_keeps_enabled(serialization):
    data = batches()
    params, opt_state = init(make_tx(JaxGradScaler(**EXTRAS)), seed=0)
    params, opt_state = run(params, opt_state, data[:5])
    saved = serialization.to_bytes((params, opt_state))
    params, opt_state = run(params, opt_state, data[5:])

    # The default config: the checkpoint's comes back, as restore() gives it.
    template = init(make_tx(JaxGradScaler()), seed=1)
    resumed = run(*serialization.from_bytes(template, saved), data[5:])
    assert_same_bits(resumed, (params, opt_state))

    # enabled stays the template's (as in restore): a run resumed without loss scaling.
    template = init(make_tx(JaxGradScaler(enabled=False)), seed=1)
    off = find_scaler(serialization.from_bytes(template, saved)[1])
    assert not off.is_enabled() and off.get_scale() == 1.0
    assert off.config == spec.ScalerConfig(**EXTRAS, enabled=False)
    assert off.state == spec.ScalerState(256.0, 1, 0)


@pytest.mark.parametrize("field, value, message", [
    ("scale", -1.0, "scale must be finite and >= 0"),
    ("format", "other", "format must be 'unifiedamp.GradScaler'"),
    ("skipped_steps", -1, "skipped_steps must be an int from 0 to 2147483647"),
    ("updates", 2**31, "updates must be an int from 0 to 2147483647"),
    ("consecutive_skips", 1.5, "consecutive_skips must be an int"),
])
def test_a_bad_entry_raises_and_names_the_field(field, value, message, serialization):
    opt_state = init(make_tx(JaxGradScaler(**EXTRAS)), seed=0)[1]
    state = serialization.to_state_dict(opt_state)
    state["scaler"][field] = value
    with pytest.raises(ValueError, match=f"Invalid scaler state_dict: {message}.*nothing was "
                                         "loaded"):
        serialization.from_bytes(opt_state, serialization.msgpack_serialize(state))


def test_an_entry_without_counters_keeps_the_templates(serialization):
    # A canonical dict alone (as state_dict() or unifiedamp.porting writes it) loads too.
    template = JaxGradScaler(8.0).update(False)
    restored = serialization.from_state_dict(template, JaxGradScaler(64.0).state_dict())
    assert restored.get_scale() == 64.0 and restored.config.init_scale == 64.0
    assert (restored.num_skipped_steps, restored.num_steps) == (1, 1)


def test_porting_reads_the_scaler_of_a_msgpack_file(tmp_path, serialization):
    from unifiedamp.porting import load_file, port_state_file

    params, opt_state = init(make_tx(JaxGradScaler(**EXTRAS)), seed=0)
    params, opt_state = run(params, opt_state, batches()[:5])
    (tmp_path / "opt.msgpack").write_bytes(serialization.to_bytes(opt_state))
    assert load_file(tmp_path / "opt.msgpack")["scaler"]["scale"] == 256.0
    report = port_state_file(tmp_path / "opt.msgpack", to="canonical")
    assert report["key"] == "scaler" and report["state"] == find_scaler(opt_state).state._asdict()


def test_a_bare_scaler_and_a_linen_train_state(serialization):
    from flax.training import train_state

    scaler = JaxGradScaler(**EXTRAS).update(False)
    restored = serialization.from_bytes({"scaler": JaxGradScaler()},
                                        serialization.to_bytes({"scaler": scaler}))["scaler"]
    assert_same_bits(restored, scaler)
    assert restored.config == scaler.config

    params = {"w": jnp.ones(3)}
    state = train_state.TrainState.create(apply_fn=None, params=params,
                                          tx=make_tx(JaxGradScaler(**EXTRAS)))
    grads = {"w": jnp.array([1.0, jnp.inf, 0.0])}
    state = state.apply_gradients(grads=grads).apply_gradients(grads=grads)
    template = train_state.TrainState.create(apply_fn=None, params=params,
                                             tx=make_tx(JaxGradScaler(**EXTRAS)))
    restored = serialization.from_bytes(template, serialization.to_bytes(state))
    assert_same_bits(restored.opt_state, state.opt_state)
    assert find_scaler(restored.opt_state).get_scale() == 256.0


def test_flax_nnx_optimizer_round_trips_through_a_pure_dict(serialization):
    # NNX flattens the scaler into its arrays (the config stays the optimizer's, as with
    # Orbax): the documented msgpack route for an nnx.Optimizer.
    from flax import nnx

    def make(seed):
        model = nnx.Linear(4, 1, rngs=nnx.Rngs(seed))
        return model, nnx.Optimizer(model, make_tx(JaxGradScaler(**EXTRAS)), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, y):
        scaler = find_scaler(optimizer.opt_state)
        loss = lambda m: scaler.scale(((m(x).astype(jnp.float16)[:, 0] - y)  # noqa: E731
                                       .astype(jnp.float32) ** 2).mean())
        optimizer.update(model, nnx.grad(loss)(model))

    data = batches()
    model, optimizer = make(0)
    for x, y in data[:5]:
        step(model, optimizer, x, y)

    def pure(model, optimizer):
        return {"model": nnx.to_pure_dict(nnx.state(model)),
                "optimizer": nnx.to_pure_dict(nnx.state(optimizer))}

    saved = serialization.to_bytes(pure(model, optimizer))
    for x, y in data[5:]:
        step(model, optimizer, x, y)

    resumed = make(1)
    restored = serialization.from_bytes(pure(*resumed), saved)
    for node, name in zip(resumed, ("model", "optimizer"), strict=True):
        state = nnx.state(node)
        nnx.replace_by_pure_dict(state, restored[name])
        nnx.update(node, state)
    for x, y in data[5:]:
        step(*resumed, x, y)
    assert_same_bits(pure(*resumed), pure(model, optimizer))
    assert find_scaler(resumed[1].opt_state).state == spec.ScalerState(768.0, 1, 0)


# ------------------------------------------------------------ when the scaler is registered


def check_in_a_new_interpreter(run_python, code):
    # This session's process imported Flax and the backend already: what imports do, and in
    # which order, shows only in an interpreter that has imported neither.
    proc = run_python(textwrap.dedent(code))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ok", proc.stdout


def test_the_backend_does_not_import_flax_and_registers_when_flax_is_imported(run_python):
    check_in_a_new_interpreter(run_python, """
        import sys
        from unifiedamp.backends.jax import JaxGradScaler
        assert not [m for m in sys.modules if m == "flax" or m.startswith("flax.")]

        def save(tree):                          # Flax imported where it is first needed
            from flax import serialization
            return serialization.to_bytes(tree)

        data = save({"scaler": JaxGradScaler(8.0).update(False)})
        from flax.serialization import from_bytes
        assert from_bytes({"scaler": JaxGradScaler()}, data)["scaler"].get_scale() == 4.0
        import flax.serialization                # its loader is its own (get_source...)
        loader = flax.serialization.__loader__
        assert flax.serialization.__spec__.loader is loader
        assert "def to_bytes" in loader.get_source("flax.serialization")
        print("ok")
    """)


def test_flax_imported_first_or_reloaded_and_a_users_own_handler(run_python):
    check_in_a_new_interpreter(run_python, """
        import importlib
        from flax import serialization
        from unifiedamp.backends.jax import JaxGradScaler
        import unifiedamp.backends.jax._flax as flax_support

        assert serialization.to_state_dict(JaxGradScaler(8.0))["scale"] == 8.0
        importlib.reload(serialization)          # a new registry: registered again
        assert serialization.to_state_dict(JaxGradScaler(8.0))["scale"] == 8.0

        serialization.register_serialization_state(
            JaxGradScaler, lambda s: {"mine": 1}, lambda t, d: t, override=True)
        flax_support.register_with_flax()        # a second call changes nothing
        assert serialization.to_state_dict(JaxGradScaler()) == {"mine": 1}
        print("ok")
    """)
