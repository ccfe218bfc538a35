"""``loss_scaled_accumulate``: gradient accumulation with loss scaling, step for step as
torch's recipe (``scaler.scale(loss / k).backward()`` per micro-batch, ``scaler.step`` and
``scaler.update`` once per k), against a real torch loop, the spec's rule applied once per
window, an unscaled reference that skips the same windows, and the ``optax.MultiSteps``
composition, which follows another trajectory (docs/backends/jax.md shows both).
"""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.backends import jax as jax_backend  # noqa: E402
from unifiedamp.backends.jax import (  # noqa: E402
    JaxGradScaler,
    find_scaler,
    loss_scaled,
    loss_scaled_accumulate,
)

pytestmark = pytest.mark.framework("jax")

DOC = Path(__file__).resolve().parents[1] / "docs" / "backends" / "jax.md"
K, MICRO = 4, 16  # 16 micro-batches, an optimizer step every 4
BAD = 5  # the micro-batch (0-based) whose data holds an inf: window 1 is skipped
CONFIGS = {
    "doc": dict(init_scale=1024.0, growth_interval=2),
    # factors that round in float32, so the bits compare more than powers of two
    "rounding": dict(init_scale=1000.0, growth_factor=1.1, backoff_factor=0.7,
                     growth_interval=1),
}


def batch(i, bad=BAD):
    x = np.arange(24, dtype=np.float32).reshape(8, 3) / 24.0 + i / 16.0
    if i == bad:
        x[0, 0] = np.inf
    return x


def loss(params, x):
    return ((x @ params["w"] + params["b"] - 1.0) ** 2).mean()


def init_params():
    return {"w": jnp.full(3, 0.5), "b": jnp.zeros(())}


def train(tx, divide, micro=MICRO, bad=BAD):
    """Runs ``tx`` on the micro-batches, each loss divided by ``divide`` and scaled by the
    scaler in the state; returns the parameters, the state and the scale after each call."""
    params = init_params()
    state = tx.init(params)

    @jax.jit
    def step(params, state, x):
        scaler = find_scaler(state)
        grads = jax.grad(lambda p: scaler.scale(loss(p, x) / divide))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    scales = []
    for i in range(micro):
        params, state = step(params, state, jnp.asarray(batch(i, bad)))
        scales.append(find_scaler(state).get_scale())
    return params, state, scales


def bits(values):
    return [int(np.float32(v).view(np.uint32)) for v in values]


def torch_scales(config, lr=0.05):
    """The scale after each optimizer step of torch's accumulation recipe."""
    torch = pytest.importorskip("torch")
    scaler = ua.GradScaler(**config, backend="torch")
    w = torch.full((3,), 0.5, requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    opt = torch.optim.SGD([w, b], lr=lr)
    scales = []
    for i in range(MICRO):
        x = torch.from_numpy(batch(i))
        scaler.scale(((x @ w + b - 1.0) ** 2).mean() / K).backward()
        if (i + 1) % K == 0:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
    return scales, {"w": w.detach().numpy(), "b": b.detach().numpy()}


def spec_scales(config):
    """spec.update once per window, found_inf = any bad micro-batch in the window."""
    cfg = spec.ScalerConfig(**config)
    state = spec.ScalerState.initial(cfg)
    scales = []
    for start in range(0, MICRO, K):
        state = spec.update(cfg, state, start <= BAD < start + K)
        scales.append(state.scale)
    return scales


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_scale_per_optimizer_step_equals_torch_and_the_spec_bit_for_bit(name):
    config = CONFIGS[name]
    tx = loss_scaled_accumulate(optax.sgd(0.05), JaxGradScaler(**config), every_k=K)
    params, _, scales = train(tx, divide=K)
    per_step = scales[K - 1::K]
    expected_torch, torch_params = torch_scales(config)
    assert bits(per_step) == bits(expected_torch) == bits(spec_scales(config))
    # the scale only moves at the end of a window
    assert all(scales[i] == scales[i - 1] for i in range(1, MICRO) if (i + 1) % K)
    # the same training run as torch's, up to float32 rounding
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(params[key]), torch_params[key], rtol=1e-5)


def reference(inner, skip_windows):
    """Unscaled: the sum of each window's gradients of loss / K, windows left out."""
    params = init_params()
    state = inner.init(params)
    grad = jax.jit(jax.grad(lambda p, x: loss(p, x) / K))
    for start in range(0, MICRO, K):
        if start // K in skip_windows:
            continue
        grads = grad(params, jnp.asarray(batch(start)))
        for i in range(start + 1, start + K):
            grads = jax.tree.map(jnp.add, grads, grad(params, jnp.asarray(batch(i))))
        updates, state = inner.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


INNER = {
    "sgd": lambda: optax.sgd(0.05),
    "clip+adam": lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.adam(0.05)),
}


@pytest.mark.parametrize("name", sorted(INNER))
def test_final_params_equal_an_unscaled_accumulation_that_skips_the_bad_window(name):
    tx = loss_scaled_accumulate(INNER[name](), JaxGradScaler(1024.0, growth_interval=2), K)
    params, state, _ = train(tx, divide=K)
    expected, expected_state = reference(INNER[name](), skip_windows={BAD // K})
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        got, want = np.asarray(got), np.asarray(want)
        assert np.isfinite(got).all()
        # the scale is a power of two, so scaling and unscaling are exact; what is left is
        # the order XLA sums and fuses in (a missed unscale would be off by 1024x)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=6e-8)
    # the skipped window left the inner state (adam's moments and count) untouched
    for got, want in zip(jax.tree.leaves(state.inner_state), jax.tree.leaves(expected_state),
                         strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=6e-8)
    assert int(state.mini_step) == 0
    assert all(not np.asarray(a).any() for a in jax.tree.leaves(state.acc_grads))


def multisteps_run():
    tx = loss_scaled(optax.MultiSteps(optax.sgd(0.05), K), JaxGradScaler(1024.0, growth_interval=2))
    params, state, scales = train(tx, divide=1)  # MultiSteps averages
    return params, state, scales


def doc_line(label, scales):
    return f"{label}" + " ".join(str(int(s)) for s in scales)


def test_multisteps_composition_follows_another_trajectory_as_documented():
    tx = loss_scaled_accumulate(optax.sgd(0.05), JaxGradScaler(1024.0, growth_interval=2), K)
    params, state, scales = train(tx, divide=K)
    ms_params, ms_state, ms_scales = multisteps_run()
    assert scales == [1024.0] * 7 + [512.0] * 8 + [1024.0]
    # per micro-batch: the bad one backs off once, every other pair grows
    assert ms_scales == [1024.0, 2048.0, 2048.0, 4096.0, 4096.0, 2048.0, 2048.0, 4096.0,
                         4096.0, 8192.0, 8192.0, 16384.0, 16384.0, 32768.0, 32768.0, 65536.0]
    assert scales[K - 1::K] != ms_scales[K - 1::K]
    # windows: MultiSteps never sees the dropped micro-batch, so its later windows shift
    # by one and it steps 3 times (after micro-batches 4, 9, 13) on 3 + 12 micro-batches;
    # torch's recipe steps after 8 is skipped: 3 steps on 12 micro-batches.
    assert int(ms_state.inner_state.gradient_step) == 3
    assert int(ms_state.inner_state.mini_step) == 3
    assert not np.allclose(np.asarray(params["w"]), np.asarray(ms_params["w"]), rtol=1e-3)
    text = " ".join(DOC.read_text().split())
    assert doc_line("loss_scaled_accumulate: ", scales) in text
    assert doc_line("loss_scaled(MultiSteps): ", ms_scales) in text


def test_every_k_1_is_loss_scaled():
    a_params, a_state, a_scales = train(
        loss_scaled_accumulate(optax.adam(0.05), JaxGradScaler(1024.0, growth_interval=2), 1),
        divide=1, micro=7, bad=3)
    b_params, b_state, b_scales = train(
        loss_scaled(optax.adam(0.05), JaxGradScaler(1024.0, growth_interval=2)),
        divide=1, micro=7, bad=3)
    assert a_scales == b_scales == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0]
    for a, b in zip(jax.tree.leaves(a_params), jax.tree.leaves(b_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=6e-8)


@pytest.mark.parametrize("every_k, error", [(2.0, TypeError), (True, TypeError),
                                            ("4", TypeError), (0, ValueError)])
def test_every_k_must_be_a_positive_int(every_k, error):
    with pytest.raises(error, match=r"every_k must be an int >= 1.*got"):
        loss_scaled_accumulate(optax.sgd(0.1), JaxGradScaler(8.0), every_k)


def test_a_jitted_scan_over_micro_batches_needs_no_host_transfer():
    tx = loss_scaled_accumulate(optax.sgd(0.05), JaxGradScaler(1024.0, growth_interval=2), K)
    params = init_params()
    xs = jnp.asarray(np.stack([batch(i) for i in range(MICRO)]))

    @jax.jit
    def run(params, state, xs):
        def body(carry, x):
            params, state = carry
            scaler = find_scaler(state)
            grads = jax.grad(lambda p: scaler.scale(loss(p, x) / K))(params)
            updates, state = tx.update(grads, state, params)
            return (optax.apply_updates(params, updates), state), find_scaler(state).loss_scale
        return jax.lax.scan(body, (params, state), xs)

    state = tx.init(params)
    with jax.transfer_guard("disallow"):
        (params, state), scales = run(params, state, xs)
    expected, _, expected_scales = train(tx, divide=K)
    assert np.asarray(scales).tolist() == expected_scales
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=6e-8)


def test_a_scale_whose_reciprocal_overflows_skips_the_window():
    # spec.unscale_overflows: 1 / scale is inf in float32, so every check finds inf
    tiny = spec.f32_from_bits(0x00200000)
    assert spec.unscale_overflows(tiny)
    tx = loss_scaled_accumulate(optax.sgd(0.1), JaxGradScaler(tiny, growth_interval=1), 2)
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update({"w": jnp.zeros(2)}, state, params)
        assert not np.asarray(updates["w"]).any()
    expected = spec.update(spec.ScalerConfig(tiny, growth_interval=1),
                           spec.ScalerState.initial(spec.ScalerConfig(tiny)), True)
    assert bits([find_scaler(state).loss_scale]) == bits([expected.scale])


def test_docstring_example_runs():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(jax_backend.loss_scaled_accumulate, "loss_scaled_accumulate",
                            globs=vars(jax_backend).copy()):
        runner.run(test)
    assert runner.tries >= 5 and runner.failures == 0


SHARD_MAP_PROGRAM = r'''
import json
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import Mesh, PartitionSpec as P
from unifiedamp.backends.jax import JaxGradScaler, find_scaler, loss_scaled_accumulate

n, k = 4, 2
mesh = Mesh(np.array(jax.devices()[:n]), ("d",))
tx = loss_scaled_accumulate(optax.adam(0.05), JaxGradScaler(1024.0, growth_interval=1), k,
                            axis_name="d")
w0 = jnp.arange(n * 3, dtype=jnp.float32).reshape(n, 3) / 10.0  # a row per device

def batches(i):  # micro-batch 3 holds an inf on device 2 only: window 1 is skipped
    x = jnp.ones((n, 2, 3)) * (i + 1) / 4
    return x.at[2, 0, 0].set(jnp.inf) if i == 3 else x

def local_loss(w, x):
    return ((x[0] @ w[0] - 1.0) ** 2).mean() / k

def step(w, opt_state, x):
    scaler = find_scaler(opt_state)
    grads = jax.grad(lambda w: scaler.scale(local_loss(w, x)))(w)
    updates, opt_state = tx.update(grads, opt_state, w)
    return optax.apply_updates(w, updates), opt_state

opt_state = tx.init(w0)
specs = jax.tree.map(lambda a: P("d") if a.ndim else P(), opt_state)
fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("d"), specs, P("d")),
                           out_specs=(P("d"), specs)))
w, scales = w0, []
for i in range(8):
    w, opt_state = fn(w, opt_state, batches(i))
    scales.append(find_scaler(opt_state).get_scale())

ref_tx = optax.adam(0.05)
ref, ref_state = w0, ref_tx.init(w0)
for window in (0, 2, 3):
    grads = 0
    for i in range(window * k, window * k + k):
        x = batches(i)
        grads = grads + jax.grad(lambda r: sum(local_loss(r[j:j + 1], x[j:j + 1])
                                               for j in range(n)))(ref)
    updates, ref_state = ref_tx.update(grads, ref_state, ref)
    ref = optax.apply_updates(ref, updates)
print(json.dumps({"w": np.asarray(w).tolist(), "ref": np.asarray(ref).tolist(),
                  "scales": scales}))
'''


def test_axis_name_in_a_default_shard_map_skips_the_window_on_every_device(run_python):
    proc = run_python(SHARD_MAP_PROGRAM, env={
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # windows F I F F with growth_interval 1: every device backs off and grows together
    assert out["scales"] == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0, 4096.0]
    np.testing.assert_allclose(np.asarray(out["w"], np.float32),
                               np.asarray(out["ref"], np.float32), rtol=2e-6, atol=6e-8)



def test_every_k_takes_numpy_ints_like_the_config():
    tx = loss_scaled_accumulate(optax.sgd(0.1), JaxGradScaler(8.0), np.int64(2))
    assert find_scaler(tx.init({"w": jnp.ones(2)})).get_scale() == 8.0
