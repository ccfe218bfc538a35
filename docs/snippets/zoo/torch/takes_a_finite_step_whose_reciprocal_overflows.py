"""Torch's scalers take a finite step whose 1/scale overflows float32, with inf gradients.

torch/amp/grad_scaler.py, GradScaler.unscale_ (ShardedGradScaler.unscale_ alike): inv_scale =
self._scale.double().reciprocal().float(), then torch._amp_foreach_non_finite_check_and_unscale_
checks the scaled gradients for inf/NaN before it multiplies them by inv_scale. At a scale of
2**-130, 1/scale = 2**130 is inf in float32: the scaled gradients (2**-130, finite) pass the
check, become inf, and the optimizer steps with them; the scale grows. The spec counts a step
whose 1/scale overflows as an overflow: it skips it and backs off.
"""

import math

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

# FSDP's scaler all-reduces its inf flag: a one-process group.
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
seen = {}
for make in (torch.amp.GradScaler, ShardedGradScaler):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = make("cpu", init_scale=2.0**-130, growth_interval=1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()  # gradients 2**-130 * 1: finite
    scaler.step(optimizer)
    scaler.update()
    weights = [v for p in model.parameters() for v in p.flatten().tolist()]
    seen[make.__name__] = scaler.get_scale()
    # spec: 1 / 2**-130 overflows float32, so the step is skipped (weights unchanged) and the
    # scale backs off to 2**-130 * 0.5 = 2**-131
    assert not any(math.isfinite(w) for w in weights), weights  # w - 0.01 * inf = -inf
    assert seen[make.__name__] == 2.0**-129 != 2.0**-131  # grew: 2**-130 * 2
dist.destroy_process_group()
print(f"at scale 2**-130 a finite step wrote -inf into the weights and grew the scale: {seen} "
      f"(spec: skipped, {2.0**-131!r})")
