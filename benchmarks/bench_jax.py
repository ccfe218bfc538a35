"""The JAX backend's cost in a jitted train step, against no scaler and against jmp.

Run: pip install -e '.[bench]'; python benchmarks/bench_jax.py [--repeats R] [--steps S]

A ~10M-parameter MLP, AdamW, batch 64, the whole step under one jax.jit:
(a) no scaler, written three ways (as is; its update inside a lax.cond like
(c)'s; its loss times a scale of 1.0), the fastest kept as the baseline,
(b) jmp.DynamicLossScale (scale, unscale, all_finite, adjust, select_tree),
(c) unifiedamp by hand as the README does it (the flag from unscale, the
product unscaled inside step_if_finite's branch, update),
(d) unifiedamp's optax wrapper loss_scaled(adamw),
(f) and (g): the same model and AdamW as Flax NNX modules and nnx.Optimizer, with no
scaler (a fourth plain step) and with loss_scaled (docs/backends/jax.md, Flax NNX).
On a GPU, (c)'s step_if_finite is a select of every leaf (the where_finite form); on
a CPU a lax.cond. (A where_finite select over parameters and optimizer state on a CPU
is left out of the timings: there it takes ~2x the step, and its large temporaries
change the allocator's behaviour, and so the timings, of every case run in the same
process.)
The steps (c), (d), (f), (g), the where_finite form and the plain step as written are
tests/support/jax_train_steps.py's, which tests/jax/test_compiled_program.py compiles
for a small MLP. Interleaved runs in a rotating order; medians and the ratios to jmp and
to no scaler printed. Beside the times, each step's compiled program on this device
(unifiedamp.backends.jax._hlo, as tests/jax/test_compiled_program.py reads it for a
small model): the kernels and copies a finite step runs (fusion / copy / dot), the
copies of parameter-sized buffers, and XLA's cost_analysis() bytes accessed and flops,
against the plain step as written; the where_finite form is compiled for these numbers,
not timed. --counts-only prints them without timing.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from _timing import interleaved_medians  # benchmarks/_timing.py

import unifiedamp as ua
from unifiedamp.backends.jax import loss_scaled
from unifiedamp.backends.jax._hlo import program_counts

# The steps docs/backends/jax.md teaches, as tests/jax/test_compiled_program.py compiles them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
import jax_train_steps as steps  # noqa: E402

SIZES = (1024, 4096, 1024, 1024)


def nnx_steps(x: jax.Array, y: jax.Array) -> dict[str, tuple]:
    """The same MLP and AdamW as Flax NNX modules and ``nnx.Optimizer``, with no scaler and
    with ``loss_scaled`` (docs/backends/jax.md, Flax NNX): name -> (jitted step, its state,
    the parameters), the step on ``nnx.split``'s state, donated as the others' carries."""
    made = {}
    for name, tx in (("f Flax NNX, no scaler", optax.adamw(1e-4)),
                     ("g Flax NNX, loss_scaled(adamw)",
                      loss_scaled(optax.adamw(1e-4), ua.GradScaler(2.0**15, backend="jax")))):
        step, state, params = steps.nnx_step(SIZES, tx)

        @partial(jax.jit, donate_argnums=(0, 1))
        def carried(state, _, extra, step=step):
            return step(state, x, y), _, extra

        made[name] = (carried, state, params)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--counts-only", action="store_true",
                        help="print the compiled programs' counts, without timing")
    args = parser.parse_args()
    import jmp

    tx = optax.adamw(1e-4)
    params = steps.init_mlp(jax.random.key(0), SIZES)
    n_params = sum(p.size for p in jax.tree.leaves(params))
    x = jax.random.normal(jax.random.key(1), (64, 1024))
    y = jax.random.normal(jax.random.key(2), (64, 1024))

    jit = partial(jax.jit, donate_argnums=(0, 1))  # donated, as a training loop would

    loss_fn = steps.loss_fn

    @jit
    def plain(params, opt_state, _):
        return (*steps.plain(tx)(params, opt_state, x, y), _)

    # The same plain step written the ways the scaled steps are (the update inside a
    # lax.cond on a runtime flag that is always true; the gradients taken through a scale
    # of 1), so that the baseline is the fastest step doing the same work, not one that
    # XLA happens to lay out worse: the report keeps the fastest of them.
    @jit
    def plain_in_cond(params, opt_state, _):
        grads = jax.grad(loss_fn)(params, x, y)

        def apply(state):
            params, opt_state = state
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        always = jnp.isfinite(jnp.float32(0.0) * _)
        return (*jax.lax.cond(always, apply, lambda state: state, (params, opt_state)), _)

    @jit
    def plain_scaled_by_one(params, opt_state, one):
        grads = jax.grad(lambda p: loss_fn(p, x, y) * one)(params)
        updates, opt_state = tx.update(jax.tree.map(lambda g: g / one, grads), opt_state,
                                       params)
        return optax.apply_updates(params, updates), opt_state, one

    @jit
    def with_jmp(params, opt_state, ls):
        grads = jax.grad(lambda p: ls.scale(loss_fn(p, x, y)))(params)
        grads = ls.unscale(grads)
        finite = jmp.all_finite(grads)
        ls = ls.adjust(finite)
        updates, new_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        return (jmp.select_tree(finite, new_params, params),
                jmp.select_tree(finite, new_state, opt_state), ls)

    @jit
    def with_unifiedamp(params, opt_state, scaler):  # the README's recipe
        return steps.recipe(tx)(params, opt_state, scaler, x, y)

    @jit
    def with_where_finite(params, opt_state, scaler):  # select over params and moments
        return steps.selected(tx)(params, opt_state, scaler, x, y)

    scaled_tx = loss_scaled(tx, ua.GradScaler(2.0**15, backend="jax"))

    @jit
    def with_loss_scaled(params, opt_state, _):
        return (*steps.wrapped(scaled_tx)(params, opt_state, x, y), _)

    def optax_case(fn: Any, opt: Any, extra: Any) -> tuple[Any, tuple, Any]:
        # (jitted step, its carry, the parameters that name a copy parameter-sized)
        return fn, (jax.tree.map(jnp.copy, params), opt.init(params), extra), params

    def nnx_case(step: Any, state: Any, nnx_params: Any) -> tuple[Any, tuple, Any]:
        return step, (state, jnp.zeros(()), jnp.zeros(())), nnx_params

    nnx = {name: nnx_case(*case) for name, case in nnx_steps(x, y).items()}
    plains = {
        "a no scaler": optax_case(plain, tx, jnp.zeros(())),
        "a no scaler, update in lax.cond": optax_case(plain_in_cond, tx, jnp.zeros(())),
        "a no scaler, loss times 1.0": optax_case(plain_scaled_by_one, tx, jnp.ones(())),
        "f Flax NNX, no scaler": nnx["f Flax NNX, no scaler"],
    }
    cases = {
        **plains,
        "b jmp.DynamicLossScale": optax_case(with_jmp, tx,
                                             jmp.DynamicLossScale(jnp.float32(2.0**15))),
        "c unifiedamp": optax_case(with_unifiedamp, tx, ua.GradScaler(2.0**15, backend="jax")),
        "d unifiedamp loss_scaled(adamw)": optax_case(with_loss_scaled, scaled_tx,
                                                      jnp.zeros(())),
        "g Flax NNX, loss_scaled(adamw)": nnx["g Flax NNX, loss_scaled(adamw)"],
    }
    carries = {name: carry for name, (_, carry, _) in cases.items()}

    # The compiled programs, before any run donates the carries.
    # (jmp's pytree cannot be lowered: its unflatten checks the dtype of a leaf, which
    # jax.jit(...).lower hands it as an ArgInfo.)
    compiled = {**{name: case for name, case in cases.items() if "jmp" not in name},
                "e unifiedamp where_finite (not timed)": optax_case(
                    with_where_finite, tx, ua.GradScaler(2.0**15, backend="jax"))}
    counts = {name: program_counts(fn.lower(*carry).compile(), sized)
              for name, (fn, carry, sized) in compiled.items()}
    plain_counts = counts["a no scaler"]

    def print_counts() -> None:
        print(f"compiled programs on {jax.devices()[0].platform} (a finite step's kernels; "
              f"plain: {plain_counts.flops / 1e9:.2f} GFLOP)")
        for name, c in counts.items():
            print(f"  {name:38s} {c.row(plain_counts)}, "
                  f"{c.flops / plain_counts.flops:.3f}x flops, {c.lines} HLO lines")

    if args.counts_only:
        print(f"jax {jax.__version__}; {n_params / 1e6:.1f}M-parameter MLP (float16 compute), "
              f"AdamW, batch 64")
        print_counts()
        return

    def run(name: str) -> None:
        fn = cases[name][0]
        carry = carries[name]
        for _ in range(args.steps):
            carry = fn(*carry)
        jax.block_until_ready(carry)
        carries[name] = carry

    med = interleaved_medians({name: partial(run, name) for name in cases}, args.repeats,
                              per_call=args.steps)
    print(f"jax {jax.__version__} on {jax.devices()[0]}; jitted train step, "
          f"{n_params / 1e6:.1f}M-parameter MLP (float16 compute), AdamW, batch 64, "
          f"median of {args.repeats} x {args.steps} steps")
    for name, t in med.items():
        print(f"  {name:32s} {t * 1e3:8.2f} ms")
    fastest = min(plains, key=med.__getitem__)
    a, b = med[fastest], med["b jmp.DynamicLossScale"]
    print(f"  baseline: the fastest plain step, {fastest!r}")
    for name in [n for n in med if n not in plains][1:]:
        print(f"  {name}: ratio to jmp = {med[name] / b:.3f}, to no scaler = {med[name] / a:.3f}")
    nnx_ratio = med["g Flax NNX, loss_scaled(adamw)"] / med["f Flax NNX, no scaler"]
    print(f"  g Flax NNX, loss_scaled(adamw): ratio to f, NNX without a scaler = {nnx_ratio:.3f}")
    print_counts()


if __name__ == "__main__":
    main()
