"""Torch's scalers never grow while the growth tracker is past growth_interval.

The update (torch._amp_update_scale_'s CPU kernel for torch.amp.GradScaler,
ShardedGradScaler._amp_update_scale_cpu_ for FSDP's on CPU) computes successful =
growth_tracker + 1 and grows only `if successful == growth_interval`. Lowering
growth_interval from 5 to 2 after 3 finite steps (set_growth_interval) leaves the tracker at 3:
it counts 4, 5, 6... and never equals 2. The spec grows when tracker + 1 >= growth_interval.
"""

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


def finite_step(scaler, model, optimizer):
    optimizer.zero_grad()
    scaler.scale(model(torch.ones(1, 2)).sum() / 16).backward()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale()


# FSDP's scaler all-reduces its inf flag: a one-process group.
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
for make in (torch.amp.GradScaler, ShardedGradScaler):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = make("cpu", init_scale=1024.0, growth_interval=5)
    for _ in range(3):
        finite_step(scaler, model, optimizer)
    scaler.set_growth_interval(2)
    scales = [finite_step(scaler, model, optimizer) for _ in range(3)]
    # spec: tracker 3 + 1 >= 2 grows to 2048 (tracker 0); then 1 < 2; then 2 >= 2: 4096
    spec = [2048.0, 2048.0, 4096.0]
    assert scales == [1024.0, 1024.0, 1024.0] != spec, (make.__name__, scales)
    assert scaler.state_dict()["_growth_tracker"] == 6
dist.destroy_process_group()
print(f"torch.amp.GradScaler and ShardedGradScaler, growth_interval 5 -> 2 after 3 finite "
      f"steps, 3 more: scales {scales}, spec {spec}")
