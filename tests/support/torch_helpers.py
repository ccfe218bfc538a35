"""What the ``tests/torch/test_torch_*.py`` files share: a small MLP and its batches, the
optimizers the workflow tests train with, the CUDA skip, and two dispatch modes that count
what a step runs (every aten op by name, and every host read of a device value).

Imported only by the torch session (it imports torch).
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
}


def mlp(device="cpu", seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4)).to(device)


def batch(device="cpu", seed=1, poison=None):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    if poison is not None:
        x[0, 0] = poison
    return x.to(device), y.to(device)


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


class CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched while active, by name."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class CountHostReads(TorchDispatchMode):
    """Counts aten._local_scalar_dense: what .item(), bool() and float() of a tensor run,
    i.e. every point where Python waits for the device's value."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def lightning_fit(scaler, steps, ckpt_in=None, ckpt_out=None):
    """Fits a tiny model with Lightning's MixedPrecision plugin; returns the scale and
    tracker the scaler held when training started (after any checkpoint was restored)."""
    L = pytest.importorskip("lightning")
    from lightning.pytorch.plugins import MixedPrecision

    seen = {}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def on_train_start(self):
            plugin_scaler = self.trainer.precision_plugin.scaler
            seen["start"] = (plugin_scaler.get_scale(), plugin_scaler._get_growth_tracker())

        def training_step(self, batch, index):
            x = batch[0].clone()
            if self.global_step == 1:
                x[0, 0] = float("inf")  # one skipped step: the scale backs off
            return torch.nn.functional.mse_loss(self.net(x), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    plugin = (MixedPrecision("16-mixed", "cpu") if scaler is None
              else MixedPrecision("16-mixed", "cpu", scaler=scaler))
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                        plugins=[plugin], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module(), data, ckpt_path=ckpt_in)
    if ckpt_out is not None:
        trainer.save_checkpoint(ckpt_out)
    return seen["start"], trainer.precision_plugin.scaler
