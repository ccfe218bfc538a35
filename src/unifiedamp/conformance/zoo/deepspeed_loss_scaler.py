"""The zoo's adapters of DeepSpeed's ``DynamicLossScaler``
(``deepspeed.runtime.fp16.loss_scaler``), with and without ``consecutive_hysteresis``.

The scaler has no step logic of its own: its ``update_scale(overflow)`` is called by
DeepSpeed's ZeRO optimizer, and the adapters run the loop of
``deepspeed/runtime/zero/stage_1_and_2.py`` (``DeepSpeedZeroOptimizer.step``), the
optimizer that builds this scaler (``CreateLossScaler``; the non-ZeRO
``FP16_Optimizer`` of ``fp16/fused_optimizer.py`` keeps its own rule instead):

1. ``backward``: ``loss_scaler.scale_loss(loss).backward()`` (``loss * cur_scale``);
2. ``has_overflow``: ``has_inf_or_nan`` of every gradient, OR-ed
   (``has_overflow_partitioned_grads_serial``);
3. ``_update_scale(overflow)``: ``loss_scaler.update_scale(overflow)``, before the step;
4. on overflow: ``zero_grad(set_to_none=True)`` and return (the step is skipped);
5. otherwise ``unscale_and_clip_grads``: every gradient ``mul_(1. / self.loss_scale)``,
   the scale *after* the update, then ``optimizer.step()``. So the step that triggers a
   growth divides gradients scaled by the old scale by the new one and steps with
   gradients half as large, where the spec unscales it with the old scale
   (``test_the_growth_step_is_unscaled_with_the_old_scale``).

Its config, as DeepSpeed's ``fp16`` section passes it: ``init_scale``,
``scale_window`` (= ``growth_interval``), ``min_scale``, ``delayed_shift``
(= ``hysteresis``) and ``consecutive_hysteresis``. ``scale_factor`` is set to 2.0 in
its constructor and no config reaches it: ``growth_factor`` is 2 and
``backoff_factor`` 1/2. There is no ``max_scale`` and no static mode (that is the
other class, ``LossScaler``). A config without ``min_scale`` runs with
``min_scale=0`` (``max(scale / 2, 0)`` is no floor; DeepSpeed's JSON config asks for
an integer >= 1, the class takes any number). Its counters (``cur_iter``,
``last_overflow_iter``, ``cur_hysteresis``) are not the spec's trackers, so the suite
compares the scale and which steps are skipped. The scale is a Python float.

Example (``unifiedamp conformance --zoo`` runs them; building one imports nothing):
    >>> from unifiedamp.conformance.zoo.deepspeed_loss_scaler import DeepSpeedLossScaler
    >>> from unifiedamp.spec import ScalerConfig
    >>> adapter = DeepSpeedLossScaler()
    >>> adapter.compare, adapter.expresses(ScalerConfig(growth_factor=4.0))
    ('scale_and_skip', 'deepspeed DynamicLossScaler has no growth_factor=4.0 (it behaves as \
growth_factor=2.0)')
"""

from __future__ import annotations

import datetime
import importlib
from importlib.metadata import version
from typing import Any

import numpy as np

from unifiedamp.conformance.interface import Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.conformance.zoo.torch_grad_scaler import (
    Run,
    backward_one,
    device,
    ensure_process_group,
    snapshot,
    torch_problems,
)
from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["DIFFERENCES", "DeepSpeedConsecutiveLossScaler", "DeepSpeedLossScaler"]


def _deepspeed(module: str) -> Any:
    # DeepSpeed ships no type information: its modules are read as Any.
    return importlib.import_module(module)


def _ensure_deepspeed_comm() -> None:
    # update_scale logs through deepspeed.comm.get_rank(), which needs DeepSpeed's
    # communication backend: over an existing torch.distributed group, a TorchBackend, as
    # deepspeed.comm.init_distributed makes when the user started the group. Its
    # constructor would also load the CPU shared-memory all-reduce op, a C++ extension
    # compiled on first use (minutes); the scaler only asks for the rank, so the backend
    # is built as on a machine where that op is not compatible (build_shm_op -> None).
    ds_comm = _deepspeed("deepspeed.comm.comm")
    # (`import deepspeed.comm.torch as m` gives torch: deepspeed.comm has a `torch` name)
    ds_torch = _deepspeed("deepspeed.comm.torch")

    ensure_process_group()
    if ds_comm.cdb is None or not ds_comm.cdb.is_initialized():
        build_shm_op = ds_torch.build_shm_op
        ds_torch.build_shm_op = lambda: None
        try:
            ds_comm.cdb = ds_torch.TorchBackend("gloo", datetime.timedelta(minutes=5), None)
        finally:
            ds_torch.build_shm_op = build_shm_op


class DeepSpeedLossScaler(Adapter):
    """``DynamicLossScaler(..., consecutive_hysteresis=False)`` (DeepSpeed's default)
    driven by ZeRO stage 1/2's ``step`` (see the module's docstring): after
    ``delayed_shift`` overflows the hysteresis is refilled only by a growth."""

    name = "deepspeed DynamicLossScaler"
    consecutive_hysteresis = False
    capabilities: frozenset[str] = frozenset()
    fixed: dict[str, Any] = {"growth_factor": 2.0, "backoff_factor": 0.5, "max_scale": None,
                             "dynamic": True}
    compare = "scale_and_skip"

    def __init__(self) -> None:
        self.device = device()

    def info(self) -> dict[str, Any]:
        return {"framework": "deepspeed", "version": version("deepspeed"),
                "device": self.device}

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Run:
        dynamic_loss_scaler = _deepspeed("deepspeed.runtime.fp16.loss_scaler").DynamicLossScaler
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"cannot build {self.name} for {config}: {reason}")
        if optimizers != 1:
            raise ValueError(f"{self.name} runs one optimizer (DeepSpeed's engine has one)")
        _ensure_deepspeed_comm()
        scaler = dynamic_loss_scaler(
            init_scale=config.init_scale, scale_window=config.growth_interval,
            min_scale=0.0 if config.min_scale is None else config.min_scale,
            delayed_shift=config.hysteresis,
            consecutive_hysteresis=self.consecutive_hysteresis)
        return Run(scaler, torch_problems(1, self.device), config)

    def iterate(self, handle: Run, kinds: str) -> Run:
        has_inf_or_nan = _deepspeed("deepspeed.runtime.utils").has_inf_or_nan
        scaler = handle.scaler
        # DeepSpeed's backward scales with loss_scaler.scale_loss (BaseOptimizer.scale_if_loss).
        opt, grads = backward_one(self.name, handle, kinds, scaler.scale_loss)
        overflow = bool(sum(has_inf_or_nan(g) for g in grads))
        scaler.update_scale(overflow)
        if overflow:
            opt.zero_grad(set_to_none=True)
            return handle
        for g in grads:
            g.data.mul_(1.0 / scaler.loss_scale)
        opt.step()
        return handle

    def read(self, handle: Run) -> ScalerState:
        return ScalerState(handle.scaler.cur_scale, None, None)

    def snapshot(self, handle: Run) -> list[np.ndarray]:
        return snapshot(handle)


class DeepSpeedConsecutiveLossScaler(DeepSpeedLossScaler):
    """``DynamicLossScaler(..., consecutive_hysteresis=True)``: every step without an
    overflow refills the hysteresis, so it counts consecutive overflows, as the spec
    does, until it runs out (then every overflow backs off until a finite step)."""

    name = "deepspeed DynamicLossScaler(consecutive_hysteresis=True)"
    consecutive_hysteresis = True


_SOURCE = "deepspeed/runtime/fp16/loss_scaler.py (deepspeed 0.19.8), DynamicLossScaler.update_scale"
_ZERO = "deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.step"
_SNIPPETS = "docs/snippets/zoo/deepspeed"

_NOT_REARMED = ("A backoff leaves cur_hysteresis at 1, so every further overflow backs off "
                "again until {refill} sets it back to delayed_shift, where the spec re-arms the "
                "hysteresis at each backoff and waits for delayed_shift more overflows in a row.")
_NOT_REARMED_MATTERS = ("Yes with hysteresis > 1 (DeepSpeed's default is 2): at hysteresis "
                        "h a burst of k overflows in a row backs off k - h + 1 times, the spec "
                        "k // h times.")
_NOT_REARMED_CHECKED = (f"{_SOURCE}: back off `if self.delayed_shift == 1 or "
                        "self.cur_hysteresis == 1`, a branch that leaves cur_hysteresis at 1. "
                        "hysteresis_rearmed_after_backoff (1024, delayed_shift 2, IIII): "
                        "cur_hysteresis 2 -> 1 (1024), then three backoffs: 512, 256, 128; the "
                        "spec gives 1024, 512, 512, 256.")

#: Each cause of DeepSpeed's departures from the spec, checked by hand (both columns, unless
#: an entry names one).
DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="grows one step late",
        sentence="DeepSpeed grows when stable_interval = cur_iter - last_overflow_iter - 1 is a "
                 "positive multiple of scale_window, and the first finite step after the start "
                 "or after an overflow has stable_interval 0: the first growth after either "
                 "comes on the (scale_window + 1)-th finite step, one step after the spec's; "
                 "later growths in the same run of finite steps come every scale_window steps, "
                 "as in the spec.",
        matters="Barely: the first growth after each overflow comes one step late (1001 finite "
                "steps instead of 1000 at DeepSpeed's default loss_scale_window); with "
                "scale_window 1 the first finite step after an overflow never grows.",
        checked=f"{_SOURCE}: stable_interval = (self.cur_iter - self.last_overflow_iter) - 1, "
                "grow if stable_interval > 0 and stable_interval % self.scale_window == 0, then "
                "cur_iter += 1 (cur_iter starts at 0, last_overflow_iter at -1 and becomes "
                "cur_iter at each overflow). growth_on_nth_finite (1024, window 3, FFFFFF): "
                "stable intervals 0 to 5, the growth on step 4 (the spec's on step 3). "
                "interval_one (window 1, FFIF): step 1 has interval 0 and keeps 1024 (the spec "
                "grows to 2048). Five finite steps at window 2: 1024, 1024, 2048, 2048, 4096 "
                "(the spec 1024, 2048, 2048, 4096, 4096): the second growth comes 2 steps after "
                "the first.",
        snippet=f"{_SNIPPETS}/grows_one_step_late.py"),
    Difference(
        cause="hysteresis not refilled by finite steps",
        sentence="With consecutive_hysteresis=False (DeepSpeed's default) a finite step does "
                 "not refill the hysteresis: only a growth sets cur_hysteresis back to "
                 "delayed_shift, so overflows separated by finite steps add up until the next "
                 "growth, where the spec counts consecutive overflows.",
        matters="Yes with hysteresis > 1 (DeepSpeed's default is 2): two isolated overflows "
                "within one growth window back off, where the spec waits for two in a row. "
                "consecutive_hysteresis=True refills it on every finite step.",
        checked=f"{_SOURCE}: a finite step sets cur_hysteresis = delayed_shift `if "
                "self.consecutive_hysteresis`, or in the growth branch. hysteresis_two (1024, "
                "window 3, delayed_shift 2, IIFIFII): I -> cur_hysteresis 1 (1024); I -> back off "
                "to 512; F; I -> back off to 256 at step 4, where the spec has seen one overflow "
                "since a finite step (512). IFI from 1024: 1024, 1024, 512 (the spec 1024 "
                "throughout).",
        snippet=f"{_SNIPPETS}/hysteresis_not_refilled_by_finite_steps.py",
        columns=("deepspeed",)),
    Difference(
        cause="hysteresis not re-armed at a backoff",
        sentence=_NOT_REARMED.format(refill="a growth (consecutive_hysteresis=False, the "
                                            "default)"),
        matters=_NOT_REARMED_MATTERS,
        checked=_NOT_REARMED_CHECKED,
        snippet=f"{_SNIPPETS}/hysteresis_not_re_armed_at_a_backoff.py",
        columns=("deepspeed",)),
    Difference(
        cause="hysteresis not re-armed at a backoff",
        sentence=_NOT_REARMED.format(refill="a finite step (consecutive_hysteresis=True)"),
        matters=_NOT_REARMED_MATTERS + " With consecutive_hysteresis=True the next finite "
                "step ends such a run of backoffs.",
        checked=_NOT_REARMED_CHECKED,
        snippet="docs/snippets/zoo/deepspeed-consecutive/hysteresis_not_re_armed_at_a_backoff.py",
        columns=("deepspeed-consecutive",)),
    Difference(
        cause="raises Exception",
        sentence="When the scale already equals min_scale, an overflow raises "
                 "Exception('Current loss scale already at minimum - cannot decrease scale "
                 "anymore. Exiting run.') instead of keeping the scale at the floor and skipping "
                 "the step.",
        matters="Yes: a run that overflows at the floor (min_loss_scale, 1 by default) stops "
                "with an exception.",
        checked=f"{_SOURCE}: `if (self.cur_scale == self.min_scale) and "
                "self.raise_error_at_min_scale: raise Exception(...)`; raise_error_at_min_scale "
                "defaults to True and CreateLossScaler, which ZeRO calls, passes only the fp16 "
                "config's dynamic_loss_scale_args, which do not hold it. min_scale_clamp (4, "
                "min_scale 1.5, IIIF): max(2, 1.5) = 2, max(1, 1.5) = 1.5, then the third "
                "overflow at 1.5 == min_scale raises (the spec stays at 1.5).",
        snippet=f"{_SNIPPETS}/raises_exception.py"),
    Difference(
        cause="keeps the scale in float64",
        sentence="Its scale is a Python float (float64) that is never rounded to float32: a "
                 "growth from 2**127 gives 2**128, and backoffs go on below 2**-149 (2**-150...), "
                 "values no float32 holds, where the spec keeps 2**127 and reaches 0.",
        matters="Little: at 2**128 the float32 scaled loss overflows, the step is skipped and "
                "the scale backs off to 2**127 (one wasted step per growth attempt); below "
                "2**-149 a float32 loss times the scale is 0 either way. Between those bounds its "
                "factor of 2 gives the spec's scales exactly.",
        checked=f"{_SOURCE}: self.cur_scale *= self.scale_factor, and next_scale = "
                "max(self.cur_scale / self.scale_factor, self.min_scale), on Python floats. "
                "growth_overflow_keeps_scale (2**127, window 1, FFIF): step 2 grows (one step "
                "late) to 3.402823669209385e+38, no float32 value (the spec keeps 2**127). "
                "backoff_reaches_zero_and_stays (2**-148, min_scale 0: no floor, IIFF): "
                "2**-149, then 2**-150 = 7.006e-46 (the spec 0).",
        snippet=f"{_SNIPPETS}/keeps_the_scale_in_float64.py"),
    Difference(
        cause="takes a finite step whose 1/scale overflows",
        sentence="ZeRO's step checks the scaled gradients for inf/NaN, then multiplies them by "
                 "1. / loss_scale: where that reciprocal is past float32 (a scale below about "
                 "2.9e-39) the finite step is taken with inf gradients, where the spec counts it "
                 "as an overflow, backs off and skips it.",
        matters="Not through DeepSpeed's config: its min_loss_scale is an integer >= 1, so "
                "backoffs never take the scale below 1 (only an initial_scale_power of -128 or "
                "less starts there).",
        checked=f"{_ZERO}: has_overflow tests has_inf_or_nan on the scaled gradients, then "
                "_update_scale, then unscale_and_clip_grads does grad.data.mul_(1. / "
                "combined_scale). reciprocal_overflow_skips_finite_steps (2**-130, window 1, "
                "FFF): the gradients 2**-130 * x are finite, update_scale(False) keeps 2**-130 "
                "(stable interval 0), and 1. / 2**-130 = 2**130 is inf as a float32 multiplier: "
                "the step writes inf into the parameters (the spec backs off to 2**-131 and "
                "skips). backoff_reaches_zero_and_stays: at 2**-150 the scaled gradients are 0 "
                "and 0 * inf = NaN.",
        snippet=f"{_SNIPPETS}/takes_a_finite_step_whose_reciprocal_overflows.py"),
    Difference(
        cause="unscales the growth step with the new scale",
        sentence="ZeRO's step updates the scale before it unscales, so the step whose update "
                 "grows the scale divides gradients scaled by the old scale by the new one: it "
                 "steps with gradients growth_factor (2) times too small.",
        matters="Slightly: one step in every scale_window (1000 by default) is taken with half "
                "its gradient; Adam's normalisation absorbs most of it, SGD takes a half step.",
        checked=f"{_ZERO}: self._update_scale(self.overflow) runs before "
                "unscale_and_clip_grads, which multiplies by 1. / self.loss_scale, the updated "
                "cur_scale. scale_window 2, FFF: step 3 grows 1024 -> 2048 (stable interval 2) "
                "and unscales gradients scaled by 1024 with 1/2048; the parameters after step 3 "
                "differ from those of the same run at a steady 1024, those after steps 1 and 2 "
                "do not.",
        snippet=f"{_SNIPPETS}/unscales_the_growth_step_with_the_new_scale.py"),
)
