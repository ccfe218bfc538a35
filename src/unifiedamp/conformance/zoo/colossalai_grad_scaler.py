"""The zoo's adapter of Colossal-AI's ``DynamicGradScaler``, driven by its fp16 optimizer.

Colossal-AI's fp16 training wraps the optimizer in ``MixedPrecisionOptimizer``
(``colossalai/amp/naive_amp/mixed_precision_optimizer.py``; the hybrid-parallel
plugin's ``HybridParallelAMPOptimizer`` subclasses it), which owns one
``DynamicGradScaler`` through ``NaiveFP16MixedPrecisionMixin``. Each iteration here
is that loop, on a real ``torch.nn.Linear`` and Adam: ``optimizer.zero_grad()``,
``optimizer.backward(loss)`` (the loss times ``scale.item()``), ``optimizer.step()``,
which checks every gradient for inf/NaN, all-reduces the answer (MAX), calls
``grad_scaler.update(found_inf)`` and then skips the step or divides the gradients
by the scale and steps Adam.

What the scaler cannot run is skipped: ``enabled=False`` and static mode (another
class), ``growth_factor=1`` and ``backoff_factor=1`` (its constructor asserts
``growth_factor > 1`` and ``0 < backoff_factor < 1``), and an ``init_scale`` outside
``[min_scale, max_scale]`` (asserted too). It has no setters, one scaler per
optimizer, and no unscale of its own. Across ranks, ``step`` all-reduces the overflow
flag (MAX) before the update, so one rank's inf backs off every rank
(:meth:`~ColossalAIDynamicGradScaler.distributed_iterate` runs CPU gloo ranks).

Its hysteresis counter is no canonical tracker: it counts the overflows since the
last growth (a backoff and a finite step leave it as it is), so :meth:`read` returns
``None`` for it and the suite compares the scale, the growth tracker (which is the
canonical one) and the skips. ``save``/``load`` go through the scaler's
``state_dict``/``load_state_dict``, as Colossal-AI's legacy fp16 optimizer
checkpoints it (``colossalai/legacy/amp/naive_amp/_fp16_optimizer.py``): they carry
the scale, both factors and ``hysteresis``, no counter. (``MixedPrecisionOptimizer``'s
own ``state_dict`` is Adam's alone: a resume there starts again at ``init_scale``.)
``load`` builds the optimizer from the saved config, as a resumed run is built from its
arguments, before the scaler loads its dict.

``test_the_growth_step_is_unscaled_with_the_old_scale`` sees this: ``should_skip_step`` updates
the scale before ``get_grad_div_scale`` reads it, so the step that triggers a growth
divides gradients scaled by the old scale by the new one: it steps with gradients
``growth_factor`` times too small, where the spec unscales it with the old scale.

Two things that are no part of the scale's rule: ``DynamicGradScaler.__init__``
calls ``get_accelerator().device_count()`` and drops the answer, and Colossal-AI's
CPU accelerator raises there, so on a machine without an accelerator the adapter
sets a CPU accelerator that answers 1 (nothing else reads it); and ``step`` all-reduces
``found_inf``, so the adapter opens a one-rank gloo process group where none is open.

Example:
    >>> from unifiedamp.spec import ScalerConfig
    >>> ColossalAIDynamicGradScaler().expresses(ScalerConfig(growth_factor=1.0))
    'Colossal-AI asserts growth_factor > 1, got 1.0'
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

from unifiedamp.conformance.interface import STEP_KINDS, Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import ScalerConfig, ScalerState, f32, parse_state_dict, to_state_dict

__all__ = ["DIFFERENCES", "ColossalAIDynamicGradScaler"]


def _prepare_runtime(rank: int = 0, world: int = 1, port: int | None = None) -> None:
    """The CPU accelerator and the process group Colossal-AI's fp16 step needs (one rank,
    unless ``port`` names the rendezvous of ``world`` ranks)."""
    import torch.distributed as dist
    from colossalai.accelerator import CpuAccelerator, get_accelerator, set_accelerator

    if type(get_accelerator()) is CpuAccelerator:
        class _CountingCpuAccelerator(CpuAccelerator):
            # The only call of it is DynamicGradScaler.__init__'s, which drops the answer.
            # (The base's raises: pyright infers it returns Never.)
            def device_count(self) -> int:  # pyright: ignore[reportIncompatibleMethodOverride]
                return 1

        set_accelerator(_CountingCpuAccelerator())
    if not dist.is_initialized():
        if port is None:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world)


def _rank_main(rank: int, world: int, port: int, config: dict[str, Any],
               kinds: list[str]) -> list[Any]:
    from unifiedamp.conformance.adapters.torch import PINNING_MODULES
    from unifiedamp.conformance.zoo.torch_grad_scaler import rank_state

    # Imported after the group starts, these would hold it past its end (rank_state
    # checks that it ends).
    for module in PINNING_MODULES:
        importlib.import_module(module)
    _prepare_runtime(rank, world, port)
    return rank_state(ColossalAIDynamicGradScaler(), config, kinds, rank)


class ColossalAIDynamicGradScaler(Adapter):
    """``colossalai.amp.naive_amp.grad_scaler.DynamicGradScaler`` inside Colossal-AI's
    ``MixedPrecisionOptimizer(precision="fp16")`` around ``torch.optim.Adam``.

    Handles are ``(optimizer, model, config)``; the scaler is
    ``optimizer.mixed_precision.grad_scaler``. The device is ``UNIFIEDAMP_DEVICE``
    (default ``cpu``), where Colossal-AI's accelerator puts the scaler's tensors.
    """

    name = "colossalai"
    capabilities = frozenset({"state_dict", "distributed"})
    dtypes = ("float32",)
    fixed = {"enabled": True, "dynamic": True}
    compare = "scale_and_skip"

    def __init__(self) -> None:
        self.device = os.environ.get("UNIFIEDAMP_DEVICE", "cpu")

    def expresses(self, config: ScalerConfig) -> str | None:
        reason = super().expresses(config)
        if reason is not None:
            return reason
        if not config.growth_factor > 1:
            return f"Colossal-AI asserts growth_factor > 1, got {config.growth_factor!r}"
        if not config.backoff_factor < 1:
            return f"Colossal-AI asserts backoff_factor < 1, got {config.backoff_factor!r}"
        # Its constructor compares the float32 bounds with the float32 initial scale.
        scale = f32(config.init_scale)
        if config.min_scale is not None and f32(config.min_scale) > scale:
            return (f"Colossal-AI asserts min_scale <= init_scale, got min_scale="
                    f"{config.min_scale!r} > {config.init_scale!r}")
        if config.max_scale is not None and f32(config.max_scale) < scale:
            return (f"Colossal-AI asserts max_scale >= init_scale, got max_scale="
                    f"{config.max_scale!r} < {config.init_scale!r}")
        return None

    def info(self) -> dict[str, Any]:
        import colossalai
        import torch

        return {"framework": "colossalai",
                "version": f"{colossalai.__version__} (torch {torch.__version__})",
                "device": self.device}

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"Colossal-AI's DynamicGradScaler cannot run {config.to_dict()}: "
                             f"{reason}")
        if optimizers != 1:
            raise ValueError(f"Colossal-AI has one scaler per optimizer, got optimizers="
                             f"{optimizers}; this adapter does not declare multi_optimizer")
        import torch
        from colossalai.amp.naive_amp.mixed_precision_optimizer import MixedPrecisionOptimizer

        _prepare_runtime()
        model = torch.nn.Linear(4, 1).to(self.device)
        with torch.no_grad():
            model.weight.fill_(0.1)
            model.bias.fill_(0.1)
        # min_scale/max_scale None: the scaler's ``if min_scale:`` leaves that side open
        # (Colossal-AI annotates them float).
        optimizer = MixedPrecisionOptimizer(
            torch.optim.Adam(model.parameters(), lr=1e-3), precision="fp16",
            initial_scale=config.init_scale,
            min_scale=config.min_scale,  # pyright: ignore[reportArgumentType]
            growth_factor=config.growth_factor, backoff_factor=config.backoff_factor,
            growth_interval=config.growth_interval, hysteresis=config.hysteresis,
            max_scale=config.max_scale)  # pyright: ignore[reportArgumentType]
        return optimizer, model, config

    def iterate(self, handle: Any, kinds: str) -> Any:
        import torch

        optimizer, model, _ = handle
        if len(kinds) != 1:
            raise ValueError(f"{len(kinds)} kinds for 1 optimizer")
        optimizer.zero_grad()
        x = torch.full((2, 4), 0.5, device=self.device)
        x[0, 1] = STEP_KINDS[kinds]
        # |loss| < 1 and d(loss)/d(weight) = x.sum(0) / 16 do not depend on the
        # parameters, so a finite step stays finite at every float32 scale.
        loss = model(x).sum() * 2.0**-4
        optimizer.backward(loss)
        optimizer.step()
        return handle

    def read(self, handle: Any) -> ScalerState:
        scaler = handle[0].mixed_precision.grad_scaler
        return ScalerState(float(scaler.scale.item()), int(scaler._growth_step), None)

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        optimizer, model, _ = handle
        out = [p.detach().cpu().numpy().copy() for p in model.parameters()]
        for state in optimizer.optim.state.values():
            out += [v.detach().cpu().numpy().copy() for _, v in sorted(state.items())
                    if hasattr(v, "detach")]
        return out

    def distributed_iterate(self, handle: Any, kinds_per_rank: list[str]) -> list[ScalerState]:
        """One iteration on ``len(kinds_per_rank)`` CPU gloo ranks, each with its own
        gradients; ``step`` all-reduces the overflow flag (MAX) across them."""
        from unifiedamp.conformance.zoo.torch_grad_scaler import spawn_rank_states

        return spawn_rank_states(_rank_main, len(kinds_per_rank), handle[2].to_dict(),
                                 kinds_per_rank)

    def save(self, handle: Any) -> dict[str, Any]:
        optimizer, _, config = handle
        native = optimizer.mixed_precision.grad_scaler.state_dict()
        config = config.replace(growth_factor=float(native["growth_factor"]),
                                backoff_factor=float(native["backoff_factor"]),
                                hysteresis=int(native["hysteresis"]))
        # The native dict carries no counter: a scaler that loads it starts from 0, so 0 is
        # what this checkpoint holds (the load check names the growth tracker it loses).
        state = ScalerState(float(native["scale"].item()), 0, 0)
        # Validates as a loader would: an inf scale (a growth past float32's maximum) is no
        # state a canonical dict holds, and saving it raises.
        return to_state_dict(*parse_state_dict(to_state_dict(config, state, "colossalai")),
                             "colossalai")

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        import torch

        config, state = parse_state_dict(state_dict)
        # The optimizer is built from the run's arguments (the saved config), then the
        # scaler loads what its native dict holds; the canonical counters have no place there.
        optimizer, model, config = self.new(config)
        optimizer.mixed_precision.grad_scaler.load_state_dict({
            "scale": torch.tensor([state.scale], dtype=torch.float32),
            "growth_factor": config.growth_factor, "backoff_factor": config.backoff_factor,
            "hysteresis": config.hysteresis})
        return optimizer, model, config


_SOURCE = ("colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py (colossalai 0.3.6), "
           "DynamicGradScaler")
_OPTIMIZER = "colossalai/amp/naive_amp/mixed_precision_optimizer.py, MixedPrecisionOptimizer"
_SNIPPETS = "docs/snippets/zoo/colossalai"

#: Each cause of Colossal-AI's departures from the spec, checked by hand.
DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="hysteresis not refilled by finite steps",
        sentence="Its hysteresis counter counts the overflows since the last growth: a finite "
                 "step does not reset it, so overflows separated by finite steps add up until "
                 "the scale grows, where the spec counts consecutive overflows.",
        matters="Yes with hysteresis > 1, MixedPrecisionOptimizer's default of 2: two isolated "
                "overflows within one growth interval back off, where the spec waits for two "
                "in a row; with hysteresis=1 the rules agree.",
        checked=f"{_SOURCE}.update: on overflow `_hysteresis_step += 1` and a backoff once it "
                "is >= hysteresis; `_hysteresis_step = 0` only in the growth branch. "
                "hysteresis_two (1024, interval 3, hysteresis 2, IIFIFII): counter 1 (1024), 2 "
                "-> 512, F leaves 2, I: 3 -> 256 at step 4, where the spec's count restarted "
                "(512). Random (1.0, interval 2, hysteresis 2, IFI): counter 1, F leaves it, I: "
                "2 -> 0.5 where the spec's F reset it (1.0).",
        snippet=f"{_SNIPPETS}/hysteresis_not_refilled_by_finite_steps.py"),
    Difference(
        cause="hysteresis not re-armed at a backoff",
        sentence="A backoff leaves its hysteresis counter at or past hysteresis, so every "
                 "further overflow backs off again until the scale grows, where the spec "
                 "re-arms the hysteresis at each backoff and waits for hysteresis more "
                 "overflows in a row.",
        matters="Yes with hysteresis > 1 (MixedPrecisionOptimizer's default is 2): at hysteresis h "
                "a burst of k overflows in a row backs off k - h + 1 times, the spec k // h times.",
        checked=f"{_SOURCE}.update and _backoff_scale: neither resets _hysteresis_step. "
                "hysteresis_rearmed_after_backoff (1024, hysteresis 2, IIII): counter 1, 2, 3, "
                "4, scales 1024, 512, 256, 128 (the spec 1024, 512, 512, 256).",
        snippet=f"{_SNIPPETS}/hysteresis_not_re_armed_at_a_backoff.py"),
    Difference(
        cause="growth overflows to inf",
        sentence="Without max_scale, a growth past float32's largest value makes the scale inf: "
                 "every later loss times inf overflows, every later step is skipped, and inf * "
                 "backoff_factor stays inf. An inf scale is no state of the spec: the canonical "
                 "state dict refuses it, so such a run cannot be saved.",
        matters="Not in real fp16 training: it needs max_scale=None (MixedPrecisionOptimizer's "
                "default ceiling is 2**32) and a scale of 2**127.",
        checked=f"{_SOURCE}._grow_scale: `self._scale = self._scale * self._growth_factor`, "
                "clamped by torch.min only `if self._max_scale`, with no finiteness check. "
                "growth_overflow_keeps_scale (2**127, interval 1, FFIF): float32 2**127 * 2 = "
                "inf at step 1 where the spec keeps 2**127, then every step skipped at inf. "
                "test_every_reachable_state_reloads draws such runs (init just below 2**126, "
                "interval 1, FF: inf), whose state no canonical dict holds: saving it meets "
                "'scale must be finite'.",
        snippet=f"{_SNIPPETS}/growth_overflows_to_inf.py"),
    Difference(
        cause="takes a finite step whose 1/scale overflows",
        sentence="A finite step at a scale whose float32 reciprocal is inf is not skipped: the "
                 "scaled gradients pass the check, the scale grows, and unscaling them (times "
                 "1.0 / scale, inf as a float32 multiplier) writes inf and NaN into the "
                 "optimizer state and the parameters, where the spec counts the step as an "
                 "overflow, backs off and skips it.",
        matters="Only once backoffs take the scale below about 3e-39, which "
                "MixedPrecisionOptimizer's default min_scale=1 prevents.",
        checked=f"{_OPTIMIZER}.step: should_skip_step() tests the scaled gradients with "
                "torch.isfinite and updates the scaler, then _unscale_and_clip_grads does "
                "`p.grad.data.mul_(1.0 / div_scale)`. reciprocal_overflow_skips_finite_steps "
                "(2**-130, interval 1, FFF): the gradients are finite, the scale grows to "
                "2**-129 (the spec backs off to 2**-131 and skips), 2**130 is inf as a float32 "
                "multiplier, and the parameters hold inf and NaN after that step.",
        snippet=f"{_SNIPPETS}/takes_a_finite_step_whose_reciprocal_overflows.py"),
    Difference(
        cause="raises ZeroDivisionError",
        sentence="Once backoffs take the scale to 0, a finite step raises ZeroDivisionError in "
                 "MixedPrecisionOptimizer.step, where the spec skips it (1/0 is inf) and stays "
                 "at 0.",
        matters="Only with min_scale=None (MixedPrecisionOptimizer's default floor is 1): "
                "training stops with an error.",
        checked=f"{_SOURCE}._backoff_scale floors the scale only `if self._min_scale`. "
                "backoff_reaches_zero_and_stays (2**-148, interval 1, IIFF): 2**-149, then "
                "2**-150 rounds to 0 in float32; the F step's gradients are 0 (finite), 0 * 2 "
                f"= 0, and {_OPTIMIZER}._unscale_and_clip_grads computes `1.0 / div_scale` "
                "with div_scale = 0.0 (get_grad_div_scale returns scale.item()).",
        snippet=f"{_SNIPPETS}/raises_zerodivisionerror.py"),
    Difference(
        cause="unscales the growth step with the new scale",
        sentence="The fp16 step updates the scale before it unscales, so the step whose update "
                 "grows the scale divides gradients scaled by the old scale by the new one: it "
                 "steps with gradients growth_factor (2) times too small.",
        matters="Slightly: one step in every growth_interval (1000 by default) is taken with "
                "half its gradient; Adam's normalisation absorbs most of it.",
        checked=f"{_OPTIMIZER}.step: self.mixed_precision.should_skip_step() calls "
                "grad_scaler.update(found_inf) first, then get_grad_div_scale() reads the "
                "updated scale. Interval 2, FF: step 2 grows 1024 -> 2048 and divides gradients "
                "scaled by 1024 by 2048 (Adam's first moment 0.1/32 instead of 0.1/16); the "
                "parameters after step 2 differ from a run at a steady 1024.",
        snippet=f"{_SNIPPETS}/unscales_the_growth_step_with_the_new_scale.py"),
    Difference(
        cause="load does not restore the growth_tracker",
        sentence="Its state_dict holds the scale, both factors and hysteresis, but neither "
                 "counter: a scaler that loads it counts its growth interval (and its "
                 "overflows) from 0 again.",
        matters="Yes on a resume: the first growth comes up to growth_interval steps (1000 by "
                "default) later than in the uninterrupted run. MixedPrecisionOptimizer's own "
                "state_dict is the wrapped optimizer's alone, so a resume through it starts "
                "again at initial_scale; the legacy fp16 optimizer saves this dict.",
        checked=f"{_SOURCE}.state_dict / load_state_dict: keys scale, growth_factor, "
                "backoff_factor, hysteresis; load_state_dict leaves _growth_step and "
                "_hysteresis_step as built (0). Init 1024, interval 4, FF: growth tracker 2 "
                "read, 0 after the reload. A loaded growth tracker 7 (interval 5) is dropped: "
                "the next F leaves 1024 (tracker 1) where the spec grows to 2048. "
                f"{_OPTIMIZER} inherits state_dict from OptimizerWrapper (the wrapped "
                "optimizer's).",
        snippet=f"{_SNIPPETS}/load_does_not_restore_the_growth_tracker.py"),
)
