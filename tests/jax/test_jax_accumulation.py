"""``loss_scaled_accumulate``: gradient accumulation with loss scaling, against an unscaled
reference that skips the same windows, and the ``optax.MultiSteps`` composition, which
follows another trajectory (docs/backends/jax.md shows both). Step for step as torch's
recipe run by a real torch loop, and as the spec's rule applied once per window:
tests/cross/test_jax_accumulation.py; with ``axis_name`` on four devices: test_jax_devices.py.
"""

from __future__ import annotations

import doctest
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
from jax_accumulation import BAD, MICRO, K, batch, bits, init_params, loss, train  # noqa: E402

from unifiedamp import spec  # noqa: E402
from unifiedamp.backends import jax as jax_backend  # noqa: E402
from unifiedamp.backends.jax import (  # noqa: E402
    JaxGradScaler,
    find_scaler,
    loss_scaled,
    loss_scaled_accumulate,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends" / "jax.md"


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


def test_every_k_takes_numpy_ints_like_the_config():
    tx = loss_scaled_accumulate(optax.sgd(0.1), JaxGradScaler(8.0), np.int64(2))
    assert find_scaler(tx.init({"w": jnp.ones(2)})).get_scale() == 8.0
