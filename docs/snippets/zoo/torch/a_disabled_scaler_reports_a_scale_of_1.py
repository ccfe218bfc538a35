"""A disabled torch scaler reports a scale of 1.0, not the init_scale it was built with.

torch/amp/grad_scaler.py: GradScaler.__init__ keeps init_scale only `if self._enabled`, and
get_scale() returns 1.0 when disabled; scale() returns its argument, step() calls
optimizer.step() and update() returns. ShardedGradScaler inherits get_scale. The spec's
disabled scaler passes every step through and its state stays (1024.0, 0, 0).
"""

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

for make in (torch.amp.GradScaler, ShardedGradScaler):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = make("cpu", init_scale=1024.0, growth_interval=1, enabled=False)
    before = model.bias.item()
    loss = model(torch.ones(1, 2)).sum() / 16
    assert scaler.scale(loss) is loss  # passed through
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert model.bias.item() != before  # the step was taken, as in the spec

    spec = 1024.0  # a disabled scaler's state does not move: (1024.0, 0, 0)
    assert scaler.get_scale() == 1.0 != spec, scaler.get_scale()
print(f"torch.amp.GradScaler and ShardedGradScaler(init_scale=1024.0, enabled=False) after a "
      f"step: get_scale() {scaler.get_scale()!r}, spec {spec!r}")
