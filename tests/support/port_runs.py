"""What the ``test_port.py`` files of the sessions share (``unifiedamp.porting``'s native
constructor calls, configs and live scalers): the forced-overflow pattern, the spec's
trajectory as float32 hex, torch's training loop (the ShardedGradScaler test's process
imports it too) and the check of the natives table against the installed signatures.

Imports no framework: each function imports the one it drives.
"""

from __future__ import annotations

import inspect

from unifiedamp import spec
from unifiedamp.porting import NATIVE_SCALERS
from unifiedamp.spec import ScalerConfig, ScalerState

KINDS = "FFFIFFFFIIFFFFFIFF"  # F: finite gradients, I: an inf in them


def reference(config: ScalerConfig, kinds: str, start: ScalerState | None = None) -> list[str]:
    """The spec's scale after each update, as float32 hex."""
    state = start or ScalerState.initial(config)
    out = []
    for kind in kinds:
        state = spec.update(config, state, kind == "I")
        out.append(spec.f32_hex(state.scale))
    return out


def hexes(scales) -> list[str]:
    return [spec.f32_hex(float(s)) for s in scales]


def torch_run(native, kinds: str, model=None, opt=None):
    """Drives a torch-verb scaler (torch's own, FSDP's, ours) over ``kinds`` with a real
    optimizer; returns the scale after each update, the model and the optimizer."""
    import torch

    if model is None:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scales = []
    for kind in kinds:
        x = torch.ones(2, 4)
        if kind == "I":
            x[0, 0] = float("inf")
        native.scale(model(x).sum()).backward()
        native.step(opt)
        native.update()
        opt.zero_grad()
        scales.append(native.get_scale())
    return scales, model, opt


def check_installed_signatures(classes: dict[str, type]) -> int:
    """Checks each installed class's positional order and defaults, as ``inspect`` reads
    them, against its row of ``NATIVE_SCALERS`` (latest version); returns how many."""
    checked = 0
    for name, cls in classes.items():
        ps = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD]
        params = [(p.name, None if p.default is p.empty or not isinstance(
            p.default, (int, float, str, bool)) else p.default) for p in ps]
        row = NATIVE_SCALERS[name]
        latest = row["versions"][max(row["versions"], key=int)]
        assert tuple(p for p, _ in params) == latest.get("params", row["params"]), name
        for param, default in params:
            if default is not None and param != "process_group":
                assert latest["defaults"][param] == default, (name, param)
        checked += 1
    return checked
