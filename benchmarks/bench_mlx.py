"""The MLX backend's cost in a compiled train step, against the same step without a scaler.

Run: pip install -e '.[mlx]'; python benchmarks/bench_mlx.py [--repeats R] [--steps S]

A ~10M-parameter MLP (Linear 1024-4096-1024-1024, ReLU), Adam, batch 64, float32
(MLX's CPU float16 matmul is ~20x slower than its float32 one; on Apple silicon pass
--float16 for float16 compute), the whole step under one mx.compile: (a) no scaler, (b)
unifiedamp as docs/backends/mlx.md writes it (scale, unscale, apply, update). MLX has no
loss scaler of its own. Interleaved runs in a rotating order; medians and the ratio
b/a printed; afterwards the scaler must hold its scale with no step skipped.
"""

from __future__ import annotations

import argparse
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from _timing import interleaved_medians  # benchmarks/_timing.py

import unifiedamp as ua

SIZES = (1024, 4096, 1024, 1024)
BATCH = 64
INIT_SCALE = 2.0**15


class MLP(nn.Module):
    def __init__(self, dtype: mx.Dtype = mx.float32) -> None:
        super().__init__()
        self.layers = [nn.Linear(a, b) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
        self.dtype = dtype

    def __call__(self, x: mx.array) -> mx.array:
        for i, layer in enumerate(self.layers):
            # float32 parameters, computed in self.dtype
            x = x.astype(self.dtype) @ layer.weight.astype(self.dtype).T + layer.bias
            if i < len(self.layers) - 1:
                x = nn.relu(x)
        return x.astype(mx.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--float16", action="store_true", help="float16 compute")
    args = parser.parse_args()
    dtype = mx.float16 if args.float16 else mx.float32
    mx.random.seed(0)
    x = mx.random.normal((BATCH, SIZES[0]))
    y = mx.random.normal((BATCH, SIZES[-1]))

    def loss_of(model: MLP) -> mx.array:
        return mx.mean((model(x) - y) ** 2)

    def make_plain():
        model, opt = MLP(dtype), optim.Adam(learning_rate=1e-4)
        opt.init(model.trainable_parameters())
        state = [model.state, opt.state]

        @partial(mx.compile, inputs=state, outputs=state)
        def step(tree):
            _, grads = nn.value_and_grad(model, loss_of)(model)
            opt.update(model, grads)
            return tree

        return step, mx.zeros(()), state

    def make_scaled():
        model, opt = MLP(dtype), optim.Adam(learning_rate=1e-4)
        opt.init(model.trainable_parameters())
        state = [model.state, opt.state]
        scaler = ua.GradScaler(INIT_SCALE, backend="mlx")

        @partial(mx.compile, inputs=state, outputs=state)
        def step(tree):
            s = scaler.with_tree(tree)  # as docs/backends/mlx.md
            _, grads = nn.value_and_grad(model, lambda m: s.scale(loss_of(m)))(model)
            grads, finite = s.unscale(grads)
            s.apply(opt, model, grads, finite)
            return s.update(finite).tree()

        return step, scaler.tree(), state

    cases = {"a no scaler": make_plain(), "b unifiedamp": make_scaled()}
    carries = {name: case[1] for name, case in cases.items()}
    n_params = sum(v.size for _, v in nn.utils.tree_flatten(MLP().trainable_parameters()))

    def run(name: str) -> None:
        step, _, state = cases[name]
        carry = carries[name]
        for _ in range(args.steps):
            carry = step(carry)
            mx.eval(carry, state)
        carries[name] = carry

    med = interleaved_medians({name: partial(run, name) for name in cases}, args.repeats,
                              per_call=args.steps)
    print(f"MLX {mx.__version__}, device {mx.default_device()}, {n_params / 1e6:.1f}M parameters, "
          f"{dtype}, Adam, batch {BATCH}, {args.steps} steps x {args.repeats} interleaved runs")
    for name, t in med.items():
        print(f"  {name:16s} {t * 1e3:8.2f} ms/step")
    print(f"ratio b/a (unifiedamp / no scaler) = {med['b unifiedamp'] / med['a no scaler']:.3f}")
    scaler = ua.GradScaler(INIT_SCALE, backend="mlx").with_tree(carries["b unifiedamp"])
    assert scaler.get_scale() == INIT_SCALE and scaler.num_skipped_steps == 0, scaler


if __name__ == "__main__":
    main()
