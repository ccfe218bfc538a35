"""A disabled torch scaler saves {}: no scale, no enabled flag, nothing an enabled one loads.

torch/amp/grad_scaler.py: GradScaler.state_dict returns {} unless self._enabled, and
load_state_dict returns at once when disabled (and raises RuntimeError on {} when enabled).
ShardedGradScaler inherits both. The spec's disabled scaler saves its config (enabled=False)
and its scale, here 64.0, and a scaler built enabled loads that and keeps enabled=True.
"""

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

for make in (torch.amp.GradScaler, ShardedGradScaler):
    disabled = make("cpu", init_scale=64.0, enabled=False)
    disabled.load_state_dict(make("cpu", init_scale=8.0).state_dict())  # a no-op
    saved = disabled.state_dict()
    # spec: {"config": {..., "enabled": False}, "state": {"scale": 64.0, ...}}
    assert saved == {}, saved
    try:
        make("cpu", init_scale=8.0).load_state_dict(saved)
    except RuntimeError as exc:
        refused = str(exc).split(",")[0]
    else:
        raise AssertionError("an enabled scaler loaded {}")
print(f"torch.amp.GradScaler and ShardedGradScaler(enabled=False).state_dict(): {saved}; an "
      f"enabled scaler loading it: RuntimeError {refused!r} (spec: scale 64.0, enabled False)")
