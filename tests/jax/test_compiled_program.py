"""The compiled train step: the kernels the loss scaler adds to a plain step.

Each documented scaled form (the recipe with ``step_if_finite``, ``where_finite`` over
parameters and moments, ``loss_scaled(optax.adamw)``, the Flax NNX optimizer) and its plain
step are compiled on the CPU for a small MLP with AdamW, and XLA's optimized program is read
(:mod:`unifiedamp.backends.jax._hlo`): the kernels and copies a finite step runs, the copies
of parameter-sized buffers, and ``cost_analysis()``'s bytes accessed. No timing here (that is
``benchmarks/bench_jax.py``, which prints the same numbers for its larger model).

The targets (scaled ops <= plain + 6, no parameter-sized copy beyond the plain step's,
bytes <= 1.10x plain) are held where XLA's CPU pipeline meets them; elsewhere :data:`HELD`
holds the smallest count reached, so that a change that adds a kernel fails. What each
remaining op is: ``docs/backends/jax.md``, Performance.
"""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
import jax_train_steps as steps  # noqa: E402  # tests/support

import unifiedamp as ua  # noqa: E402
from unifiedamp.backends.jax import loss_scaled  # noqa: E402
from unifiedamp.backends.jax._hlo import program_counts  # noqa: E402

SIZES = (32, 64, 32, 16)  # no parameter shares a shape with an activation (batch 8)
BATCH = 8

#: The targets: extra ops over the plain step, bytes accessed over the plain step's.
TARGET_OPS, TARGET_BYTES = 6, 1.10

#: Per form, what is held where the targets are not met (jax 0.10.2, XLA's CPU):
#: (extra ops over its plain step, bytes accessed / plain's). What the extra ops are (per leaf
#: of this six-leaf model: a finiteness reduction, split by XLA into up to three kernels
#: for a weight; the lax.cond's operands laid out and copied back; one kernel per scaler
#: leaf) is in docs/backends/jax.md, "The compiled program", kernel by kernel.
HELD: dict[str, tuple[int, float]] = {
    "step_if_finite": (21, 1.32),
    "where_finite": (26, 1.38),
    "loss_scaled": (27, 1.49),
    "nnx loss_scaled": (30, 1.50),
}
#: Parameter-sized copies held where a form makes more than its plain step: the select
#: over AdamW's moments (XLA's CPU reads the old moments after the select overwrote them
#: in place, so it copies all twelve first).
HELD_PARAM_COPIES: dict[str, int] = {"where_finite": 12}


def optax_forms():
    """name -> (step, args): the plain step and the scaled forms docs/backends/jax.md teaches."""
    tx = optax.adamw(1e-3)
    params = steps.init_mlp(jax.random.key(0), SIZES)
    x = jax.random.normal(jax.random.key(1), (BATCH, SIZES[0]))
    y = jax.random.normal(jax.random.key(2), (BATCH, SIZES[-1]))
    scaler = ua.GradScaler(2.0**15, backend="jax")
    scaled_tx = loss_scaled(tx, scaler)
    return params, {
        "plain": (steps.plain(tx), (params, tx.init(params), x, y)),
        "step_if_finite": (steps.recipe(tx), (params, tx.init(params), scaler, x, y)),
        "where_finite": (steps.selected(tx), (params, tx.init(params), scaler, x, y)),
        "loss_scaled": (steps.wrapped(scaled_tx), (params, scaled_tx.init(params), x, y)),
    }


def nnx_forms():
    """The Flax NNX optimizer (docs/backends/jax.md, Flax NNX), plain and with loss_scaled."""
    pytest.importorskip("flax.nnx")
    x = jax.random.normal(jax.random.key(1), (BATCH, SIZES[0]))
    y = jax.random.normal(jax.random.key(2), (BATCH, SIZES[-1]))
    forms, params = {}, None
    for name, tx in (("nnx plain", optax.adamw(1e-3)),
                     ("nnx loss_scaled", loss_scaled(optax.adamw(1e-3),
                                                     ua.GradScaler(2.0**15, backend="jax")))):
        step, state, params = steps.nnx_step(SIZES, tx)
        forms[name] = (step, (state, x, y))
    return params, forms


def compile_counts(forms, params):
    # Everything but the batch donated, as a training loop does: state updated in place.
    return {name: program_counts(jax.jit(step, donate_argnums=tuple(range(len(args) - 2)))
                                 .lower(*args).compile(), params)
            for name, (step, args) in forms.items()}


@pytest.fixture(scope="module")
def counts():
    params, forms = optax_forms()
    found = compile_counts(forms, params)
    nnx_params, nnx = nnx_forms()
    found.update(compile_counts(nnx, nnx_params))
    for name, c in found.items():
        print(f"{name:16s} {c.row(found['nnx plain' if name.startswith('nnx') else 'plain'])}")
    return found


SCALED = ["step_if_finite", "where_finite", "loss_scaled", "nnx loss_scaled"]


def plain_of(name):
    return "nnx plain" if name.startswith("nnx") else "plain"


@pytest.mark.parametrize("form", SCALED)
def test_scaled_step_adds_at_most_the_held_kernels(counts, form):
    scaled, plain = counts[form], counts[plain_of(form)]
    bound = HELD.get(form, (TARGET_OPS, TARGET_BYTES))[0]
    assert scaled.total - plain.total <= bound, (form, scaled.row(plain), plain.row())


@pytest.mark.parametrize("form", SCALED)
def test_scaled_step_copies_no_parameter_sized_buffer(counts, form):
    scaled, plain = counts[form], counts[plain_of(form)]
    bound = HELD_PARAM_COPIES.get(form, plain.param_copies)
    assert scaled.param_copies <= bound, (form, scaled.row(plain), plain.row())


@pytest.mark.parametrize("form", SCALED)
def test_scaled_step_accesses_at_most_the_held_bytes(counts, form):
    scaled, plain = counts[form], counts[plain_of(form)]
    bound = HELD.get(form, (TARGET_OPS, TARGET_BYTES))[1]
    assert scaled.bytes_accessed <= bound * plain.bytes_accessed, (form, scaled.row(plain))


def test_the_scalar_rule_is_a_kernel_per_scaler_leaf():
    # update(): one kernel per array of the scaler (six), no copy of the old state (8
    # before: two copies); unscale(): three kernels.
    scaler = ua.GradScaler(2.0**15, backend="jax")
    update = program_counts(jax.jit(lambda s, f: s.update(f), donate_argnums=0)
                            .lower(scaler, jnp.array(True)).compile())
    assert dict(update.ops) == {"fusion": 6}, update.row()
    unscale = program_counts(jax.jit(lambda s, g: s.unscale(g)).lower(
        scaler, jnp.ones((4, 4))).compile())
    # the factors of 1/scale (one kernel), the product, the finiteness check (7 before)
    assert unscale.total <= 3, unscale.row()


def test_step_if_finite_selects_on_a_gpu_and_steps_as_on_the_cpu(monkeypatch):
    """On a GPU ``step_if_finite`` is a select of every leaf (the faster form there,
    docs/backends/jax.md, Performance), on the CPU a ``lax.cond``: the recipe compiled
    both ways (the platform forced here) has a conditional only in the CPU form, and over
    finite, inf and NaN steps both skip the same steps, hold the same scaler bit for bit,
    and the same parameters and AdamW state to an ulp (XLA may sum a bias's gradient in
    another order in another program)."""
    import numpy as np

    from unifiedamp.backends.jax import _scaler

    def run():
        params, forms = optax_forms()
        recipe, (params, opt_state, scaler, x, y) = forms["step_if_finite"]
        step = jax.jit(recipe)
        ops = program_counts(step.lower(params, opt_state, scaler, x, y).compile()).ops
        kept = []
        for bad in (None, jnp.inf, None, jnp.nan, None, None):
            batch = x if bad is None else x.at[0, 0].set(bad)
            before = jax.tree.leaves(params)
            params, opt_state, scaler = step(params, opt_state, scaler, batch, y)
            kept.append(all(np.array_equal(a, b) for a, b in zip(
                before, jax.tree.leaves(params), strict=True)))
        return ops, kept, jax.tree.leaves((params, opt_state)), jax.tree.leaves(scaler)

    cond_ops, cond_kept, cond_state, cond_scaler = run()
    monkeypatch.setattr(_scaler, "_skips_by_select", lambda: True)
    select_ops, select_kept, select_state, select_scaler = run()
    assert cond_ops["conditional"] == 1 and select_ops["conditional"] == 0
    assert cond_kept == select_kept == [False, True, False, True, False, False]
    for a, b in zip(cond_scaler, select_scaler, strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    for a, b in zip(cond_state, select_state, strict=True):
        if np.issubdtype(np.asarray(a).dtype, np.floating):
            np.testing.assert_array_max_ulp(np.asarray(a), np.asarray(b), maxulp=1)
        else:
            assert np.array_equal(a, b)
