"""FSDP's ShardedGradScaler on CPU grows its scale past float32's maximum to inf, for good.

torch/distributed/fsdp/sharded_grad_scaler.py, ShardedGradScaler._amp_update_scale_cpu_ (what
update() runs when the scale is on CPU): `self._scale *= self._growth_factor` with no check that
the product is finite. From 2**127 a growth gives inf; every later scaled loss is inf, every
step is skipped and the backoff keeps inf (inf * 0.5). torch.amp.GradScaler's update kernel
keeps the old scale instead, as the spec does: 2**127 * 2 overflows float32, so no growth.
"""

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


def finite_step(scaler):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler.scale(model(torch.ones(1, 2)).sum() / 16).backward()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale()


# FSDP's scaler all-reduces its inf flag: a one-process group.
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
sharded = ShardedGradScaler("cpu", init_scale=2.0**127, growth_interval=1)
scales = [finite_step(sharded) for _ in range(3)]
plain = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1)
kept = [finite_step(plain) for _ in range(3)]
dist.destroy_process_group()

spec = [2.0**127] * 3  # 2**127 * 2 = 2**128 overflows float32: the spec keeps 2**127
assert scales == [float("inf")] * 3 != spec, scales
assert kept == spec, kept
print(f"ShardedGradScaler from 2**127, three finite steps: {scales}; torch.amp.GradScaler "
      f"{kept}; spec {spec}")
