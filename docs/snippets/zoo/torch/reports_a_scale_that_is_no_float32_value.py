"""Before its first scale() call a torch scaler reports init_scale as given, not as float32.

torch/amp/grad_scaler.py: GradScaler.get_scale returns self._init_scale (the Python float
given) while self._scale is None, and state_dict() saves get_scale(); the first scale() call
makes the float32 tensor torch.full((), self._init_scale, dtype=torch.float32) it runs with.
ShardedGradScaler inherits both. 16777217 = 2**24 + 1 needs 25 significant bits: its float32
is 16777216, the spec's scale.
"""

import numpy as np
import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

for make in (torch.amp.GradScaler, ShardedGradScaler):
    scaler = make("cpu", init_scale=16777217.0)
    reported = scaler.get_scale(), scaler.state_dict()["scale"]
    scaler.scale(torch.ones(()))  # the first scale() makes the float32 scale tensor
    runs_with = scaler.get_scale()

    spec = float(np.float32(16777217.0))  # 2**24: the float32 nearest 2**24 + 1 (a tie, even)
    assert spec == 16777216.0
    assert reported == (16777217.0, 16777217.0) and runs_with == spec, (reported, runs_with)
print(f"torch.amp.GradScaler and ShardedGradScaler(init_scale=16777217.0) report {reported} "
      f"before the first scale(), then run with {runs_with!r} (spec {spec!r})")
