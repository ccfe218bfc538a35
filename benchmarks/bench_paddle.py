"""The paddle backend's overhead, against no scaler and against Paddle's own AMP kernels.

Run: python benchmarks/bench_paddle.py [--device cpu|gpu] [--repeats R] [--steps S]

A training step of a ~10M-parameter MLP (float32: Paddle's CPU build has no
float16/bfloat16 matmul kernels), Adam, batch 64, with (a) no scaler, (b) Paddle's
kernels driven by hand as paddle.amp.GradScaler drives them: loss * scale,
_C_ops.check_finite_and_unscale_, optimizer.step() skipped on the host when
found_inf is set, _C_ops.update_loss_scaling_, (c) unifiedamp's paddle scaler
(scale, step, update). Same initial weights and data for all three; scale 1024, a
power of two, so all three end with the same weights (checked). Runs are
interleaved in a rotating order; medians and the ratios c/a, c/b printed. Paddle
runs its CPU kernels on OMP_NUM_THREADS threads (1 unless set).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np
import paddle
from _timing import interleaved_medians  # benchmarks/_timing.py
from paddle import _C_ops

import unifiedamp as ua

INIT_SCALE = 1024.0
GROWTH_INTERVAL = 2000  # the default: the scale stays put unless a run takes 2000 steps
A, B, C = "a no scaler", "b paddle kernels (_C_ops)", "c unifiedamp"


def sync(device: str) -> None:
    if device != "cpu":
        paddle.device.synchronize()


def mlp() -> paddle.nn.Layer:
    paddle.seed(0)
    return paddle.nn.Sequential(
        paddle.nn.Linear(1024, 4096), paddle.nn.ReLU(), paddle.nn.Linear(4096, 1024),
        paddle.nn.ReLU(), paddle.nn.Linear(1024, 1024),
    )


def medians(cases: dict[str, Callable[[], None]], repeats: int, device: str,
            per_call: int = 1) -> dict[str, float]:
    return interleaved_medians(cases, repeats, per_call, sync=lambda: sync(device))


def report(title: str, med: dict[str, float], ratios: dict[str, tuple[str, str]]) -> None:
    print(title)
    for name, t in med.items():
        print(f"  {name:42s} {t * 1e3:8.2f} ms")
    print("  " + "   ".join(f"ratio {label} = {med[num] / med[den]:.3f}"
                            for label, (num, den) in ratios.items()))


class PaddleKernels:
    """What paddle.amp.GradScaler does per step (scale, _unscale, step, _update), on
    any place and with the update on the device by update_loss_scaling_."""

    def __init__(self, device: str):
        self.scale_t = paddle.to_tensor([INIT_SCALE], dtype="float32", place=device)
        self.good = paddle.zeros([1], dtype="int32")
        self.bad = paddle.zeros([1], dtype="int32")
        self.no_inf = paddle.zeros([1], dtype="bool")
        self.skipped = 0

    def scale(self, loss: paddle.Tensor) -> paddle.Tensor:
        return loss * self.scale_t

    def step_and_update(self, opt: paddle.optimizer.Optimizer) -> None:
        grads = [p.grad for p in opt._parameter_list if p.grad is not None]
        # In eager mode the kernel returns a new flag; the one passed in stays False.
        _, found_inf = _C_ops.check_finite_and_unscale_(grads, self.scale_t, self.no_inf)
        if bool(found_inf):  # the host read Paddle's optimizers make
            self.skipped += 1
        else:
            opt.step()
        _C_ops.update_loss_scaling_(grads, found_inf, self.scale_t, self.good, self.bad,
                                    GROWTH_INTERVAL, 1, 2.0, 0.5, False)


def train_step_bench(device: str, repeats: int, steps: int) -> dict[str, float]:
    paddle.seed(1)
    x = paddle.randn([64, 1024])
    y = paddle.randn([64, 1024])
    variants = {
        A: lambda: None,
        B: lambda: PaddleKernels(device),
        C: lambda: ua.GradScaler(INIT_SCALE, backend="paddle", device=device,
                                 growth_interval=GROWTH_INTERVAL),
    }
    setups = {}
    for name, factory in variants.items():
        model = mlp()
        setups[name] = (model, paddle.optimizer.Adam(1e-4, parameters=model.parameters()),
                        factory())
    params = sum(p.numel().item() for p in setups[A][0].parameters())

    def run(model, opt, scaler):
        def go():
            for _ in range(steps):
                opt.clear_grad()
                loss = paddle.nn.functional.mse_loss(model(x), y)
                if scaler is None:
                    loss.backward()
                    opt.step()
                elif isinstance(scaler, PaddleKernels):
                    scaler.scale(loss).backward()
                    scaler.step_and_update(opt)
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
        return go

    med = medians({name: run(*setup) for name, setup in setups.items()}, repeats, device, steps)
    report(f"train step, {params / 1e6:.1f}M-parameter MLP (float32), Adam, batch 64, {device}, "
           f"median of {repeats} x {steps} steps", med,
           {"c/a (unifiedamp/no scaler)": (C, A), "c/b (unifiedamp/paddle kernels)": (C, B)})

    # Both scalers really scaled, never skipped, and all three computed the same thing.
    total = (repeats + 1) * steps
    scale, tracker = INIT_SCALE * 2.0 ** (total // GROWTH_INTERVAL), total % GROWTH_INTERVAL
    kernels, ours = setups[B][2], setups[C][2]
    assert (kernels.scale_t.item(), kernels.good.item(), kernels.skipped) == (scale, tracker, 0)
    assert (ours.get_scale(), ours.state.growth_tracker) == (scale, tracker), ours
    assert (ours.num_steps, ours.num_skipped_steps) == (total, 0), ours
    weights = {name: [p.numpy() for p in setup[0].parameters()] for name, setup in setups.items()}
    base = weights[A]
    diff = max(float(np.max(np.abs(w - b))) for name in (B, C)
               for w, b in zip(weights[name], base, strict=True))
    print(f"  after {total} steps each: scale {ours.get_scale():g}, none skipped; "
          f"max |weight - no-scaler weight| = {diff:g}")
    assert diff <= 1e-6, diff
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="gpu" if paddle.is_compiled_with_cuda() else "cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    paddle.set_device(args.device)
    print(f"paddle {paddle.__version__}, numpy {np.__version__}, "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS')}, {os.cpu_count()} CPUs")
    train_step_bench(args.device, args.repeats, args.steps)


if __name__ == "__main__":
    main()
