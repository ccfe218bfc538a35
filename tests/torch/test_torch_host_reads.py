"""What the torch backend makes Python wait for: the device values it reads on the host per
step (one per plain optimizer's step, none with a fused optimizer, which skips on the
device), and the fused optimizers' protocol (``grad_scale``/``found_inf``) followed as
torch's own scaler does."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import OPTIMIZERS, CountHostReads, batch, loss_of, mlp  # noqa: E402

import unifiedamp as ua  # noqa: E402

# ---------------------------------------------------------------- host reads


def host_reads_per_step(make_opt, scaler_factory, steps=4):
    def run(use_scaler):
        model = mlp()
        opt = make_opt(model.parameters())
        scaler = scaler_factory() if use_scaler else None
        x, y = batch()
        loss_of(model, x, y).backward()  # warm: optimizer state exists
        opt.step()
        with CountHostReads() as counter:
            for _ in range(steps):
                opt.zero_grad()
                loss = loss_of(model, x, y)
                if scaler:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
        return counter.count

    return (run(True) - run(False)) / steps


@pytest.mark.parametrize("config", [{}, {"hysteresis": 2, "min_scale": 1.0}])
def test_host_reads_added_by_the_scaler_per_step(config):
    def factory():
        return ua.GradScaler(1024.0, backend="torch", **config)

    # Plain optimizers: exactly one read per step, Python deciding whether to step.
    assert host_reads_per_step(OPTIMIZERS["adam"], factory) == 1
    assert host_reads_per_step(OPTIMIZERS["sgd"], factory) == 1
    # Fused optimizers skip on the device: no read at all.
    assert host_reads_per_step(OPTIMIZERS["adamw_fused"], factory) == 0
    assert host_reads_per_step(OPTIMIZERS["sgd_fused"], factory) == 0


def test_collapse_check_reads_the_device_once_per_period():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = ua.GradScaler(1024.0, backend="torch", max_consecutive_skips=10)
    reads = []
    for _ in range(20):
        with CountHostReads() as counter:
            scaler.scale(loss_of(model, *batch())).backward()
            scaler.step(opt)
            scaler.update()
        reads.append(counter.count)
        opt.zero_grad()
    # At the end of a period: the scale and, counted on the device (fused steps), the
    # run of skips; nothing in between.
    assert reads == [0] * 9 + [2] + [0] * 9 + [2]


# ---------------------------------------------------------------- the fused path


def test_fused_optimizer_receives_grad_scale_and_found_inf():
    seen = {}

    class Spy(torch.optim.AdamW):
        def step(self, closure=None):
            seen["grad_scale"] = self.grad_scale.clone()
            seen["found_inf"] = self.found_inf.clone()
            return super().step(closure)

    model = mlp()
    opt = Spy(model.parameters(), fused=True)
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(loss_of(model, *batch(poison=float("inf")))).backward()
    scaler.step(opt)
    scaler.update()
    assert seen["grad_scale"].item() == 1024.0 and seen["found_inf"].item() == 1.0
    assert scaler.last_step_skipped and scaler.num_skipped_steps == 1


class _OldStyleFused(torch.optim.AdamW):
    """A fused optimizer with torch's deprecated ``grad_scaler`` keyword: the scaler passes
    itself instead of ``grad_scale``/``found_inf``."""

    def step(self, closure=None, grad_scaler=None):
        self.got_scaler = grad_scaler
        return super().step(closure)


def _fused_run(make_scaler, case: str):
    """Two iterations (the second with an inf) of ``case`` through a fused AdamW: the
    weights' bits, the state, what was raised or warned, the attributes left behind."""
    model = mlp()
    cls = _OldStyleFused if case == "grad_scaler_kwarg" else torch.optim.AdamW
    opt = cls(model.parameters(), lr=0.1, fused=True)
    scaler = make_scaler()
    raised = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for poison in (None, float("inf")):
            scaler.scale(loss_of(model, *batch(poison=poison))).backward()
            if case == "unscale_first":
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            if case == "own_grad_scale":
                opt.grad_scale = torch.tensor(0.5)
            try:
                scaler.step(opt, closure=lambda: 0.0) if case == "closure" else scaler.step(opt)
                if case == "twice":
                    scaler.step(opt)
            except RuntimeError as exc:
                raised.append(str(exc))
            try:  # nothing checked (closure, grad_scaler keyword): both refuse to update
                scaler.update()
            except AssertionError as exc:
                raised.append(str(exc))
            opt.zero_grad()
    left = [name for name in ("grad_scale", "found_inf") if hasattr(opt, name)]
    return ([p.detach().numpy().tobytes() for p in model.parameters()],
            scaler.get_scale(), raised, sorted({type(w.message).__name__ for w in caught}),
            left, getattr(opt, "got_scaler", scaler) is scaler)


@pytest.mark.parametrize("case", ["plain", "unscale_first", "own_grad_scale", "twice",
                                  "closure", "grad_scaler_kwarg"])
def test_fused_step_follows_torchs_protocol_bit_for_bit(case):
    """The fused path's own step() (two ops and two signature walks fewer than torch's):
    the same weights, scale, errors, warnings and attributes as torch.amp.GradScaler."""
    theirs = _fused_run(lambda: torch.amp.GradScaler("cpu", init_scale=1024.0), case)
    mine = _fused_run(lambda: ua.GradScaler(1024.0, backend="torch"), case)
    names = ("weights", "scale", "errors", "warnings", "attributes left", "scaler passed")
    for name, a, b in zip(names, theirs, mine, strict=True):
        if name == "errors":  # torch's words, then (NoInfChecksError) the fix
            b = [m[:len(t)] if m.startswith(t) else m for t, m in zip(a, b, strict=False)]
        assert a == b, f"{case}: {name} differ: torch {a!r:.300}, unifiedamp {b!r:.300}"
