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


_LATE_GROWTH = Difference(
    sentence="DeepSpeed grows when (cur_iter - last_overflow_iter - 1) is a positive "
             "multiple of scale_window, which first happens on the (scale_window + 1)-th "
             "finite step after the start or after an overflow (then every scale_window "
             "steps): one step later than the spec's growth_interval-th.",
    matters="Slightly: the first growth after each overflow comes one iteration late "
            "(negligible at DeepSpeed's default window of 1000).",
    checked="deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale: "
            "stable_interval = (self.cur_iter - self.last_overflow_iter) - 1, grow if "
            "stable_interval > 0 and stable_interval % self.scale_window == 0, then "
            "cur_iter += 1 (cur_iter starts at 0, last_overflow_iter at -1 and becomes "
            "cur_iter at an overflow). By hand, scale_window 3, 'FFFFFF': stable intervals "
            "0, 1, 2, 3, 4, 5 -> 1024 1024 1024 2048 2048 2048 (spec 1024 1024 2048 2048 "
            "2048 4096); scale_window 1, 'F': interval 0, no growth (spec 2048); confirmed: "
            "scale_window 2, 'FFFFFIFFFFF' reads 1024 1024 2048 2048 4096 2048 2048 2048 "
            "4096 4096 8192.")

_HYSTERESIS_SINCE_GROWTH = Difference(
    sentence="With consecutive_hysteresis=False (DeepSpeed's default) the hysteresis counts "
             "overflows since the last growth, not consecutive ones: finite steps do not "
             "refill it, and once it is used up every overflow backs off until the next "
             "growth.",
    matters="Yes with hysteresis > 1 (DeepSpeed's default is 2): overflows separated by "
            "finite steps add up, so the scale backs off more often than under the spec's "
            "rule. consecutive_hysteresis=True refills it on every finite step.",
    checked="DynamicLossScaler.update_scale: on an overflow, back off if delayed_shift == 1 "
            "or cur_hysteresis == 1 (cur_hysteresis stays 1), else cur_hysteresis -= 1; on a "
            "finite step cur_hysteresis = delayed_shift only if consecutive_hysteresis, or "
            "at a growth. By hand, delayed_shift 2, scale_window 3, 'IIFIFII': I -> "
            "hysteresis 1, 1024; I -> back off to 512; F; I -> hysteresis is still 1, back "
            "off to 256 (spec 512: one overflow since a finite step). Confirmed, 'IIFIII', "
            "window 100: 1024 512 512 256 128 64 (consecutive: 1024 512 512 512 256 128; "
            "spec 1024 512 512 512 256 256).")

_RAISES_AT_MIN = Difference(
    sentence="When the scale already equals min_scale, an overflow raises "
             "Exception('Current loss scale already at minimum - cannot decrease scale "
             "anymore. Exiting run.') instead of keeping the scale at the floor and skipping "
             "the step.",
    matters="Yes: a run that overflows at the floor (min_loss_scale, default 1) stops with an "
            "exception.",
    checked="DynamicLossScaler.update_scale: `if (self.cur_scale == self.min_scale) and "
            "self.raise_error_at_min_scale: raise Exception(...)`; raise_error_at_min_scale "
            "defaults to True and CreateLossScaler (runtime/fp16/loss_scaler.py), which ZeRO "
            "calls, passes only dynamic_loss_args, which do not hold it. By hand, init 4, "
            "min 1.5, 'IIIF': max(2, 1.5) = 2, max(1, 1.5) = 1.5, then the third overflow "
            "at 1.5 == min_scale raises.")

_FLOAT64_UP = Difference(
    sentence="The scale is a Python float (float64) with no float32 bound: it grows past "
             "float32's maximum (2**127 * 2 = 2**128), where the spec keeps the scale.",
    matters="Little: with a scale of 2**128 the float32 scaled loss overflows, the step is "
            "skipped and the scale backs off to 2**127 (one wasted step per growth attempt).",
    checked="DynamicLossScaler.update_scale: self.cur_scale *= self.scale_factor on a "
            "Python float. By hand, init 2**127, scale_window 1, 'FFIF': step 1 has stable "
            "interval 0 (no growth, as the spec, whose growth would overflow); step 2 grows "
            "to 2**128 = 3.4028236692093846e38, no float32 value (spec keeps 2**127).")

_RECIPROCAL = Difference(
    sentence="DeepSpeed checks the scaled gradients for inf/NaN and then multiplies them by "
             "1. / cur_scale, so where that reciprocal is past float32 (a scale below about "
             "2.9e-39) the finite step is taken with inf gradients, where the spec counts it "
             "as an overflow, backs off and skips it.",
    matters="Only after the scale has collapsed below ~2.9e-39, which DeepSpeed's default "
            "min_loss_scale of 1 prevents.",
    checked="runtime/zero/stage_1_and_2.py: has_overflow_partitioned_grads_serial tests "
            "has_inf_or_nan(grad) on the scaled gradients; unscale_and_clip_grads does "
            "grad.data.mul_(1. / combined_scale). By hand, init 2**-130, 'F': the gradients "
            "0.5/16 * 2**-130 are finite, no overflow, update_scale(False) keeps 2**-130 "
            "(stable interval 0; spec backs off to 2**-131 and skips), and 1. / 2**-130 = "
            "2**130 multiplies the float32 gradients as inf.")

_FLOAT64_DOWN = Difference(
    sentence="The scale is a Python float (float64), so backoffs go on below float32's "
             "smallest value: 2**-149 / 2 = 2**-150, no float32 value, where the spec's "
             "scale is 0.",
    matters="No: only scales below 2**-126 (after some 140 consecutive overflows) are "
            "affected, and a float32 loss multiplied by them is 0 either way.",
    checked="DynamicLossScaler.update_scale: next_scale = max(self.cur_scale / "
            "self.scale_factor, self.min_scale) on Python floats (min_scale 0: the "
            "adapter's 'no floor'). By hand, init 2**-148, 'II': 2**-149, then 2**-150 = "
            "7.006e-46 (spec: f32(2**-149 * 0.5) = 0).")

_NOT_REARMED = Difference(
    sentence="A backoff leaves the hysteresis used up (cur_hysteresis stays 1), so every "
             "further consecutive overflow backs off again, where the spec re-arms it at the "
             "backoff and waits for delayed_shift more overflows.",
    matters="Yes with delayed_shift > 1 (DeepSpeed's default is 2): a burst of k overflows "
            "backs off k - 1 times instead of k / 2, in both hysteresis modes.",
    checked="DynamicLossScaler.update_scale: back off `if self.delayed_shift == 1 or "
            "self.cur_hysteresis == 1`; that branch leaves cur_hysteresis at 1, which is "
            "set back to delayed_shift only on a finite step (consecutive_hysteresis=True) "
            "or at a growth. By hand, delayed_shift 2, 'IIII': cur_hysteresis 2 -> 1 "
            "(1024); 1: back off (512); still 1: back off (256); 128. The spec gives 1024, "
            "512, 512, 256.")

_NEW_SCALE_UNSCALE = Difference(
    sentence="ZeRO's step updates the scale before it unscales, so the step whose update "
             "grows the scale divides gradients scaled by the old scale by the new one: it "
             "steps with gradients growth_factor (2) times too small.",
    matters="Slightly: one step in every scale_window (1000 by default) is taken with half "
            "its gradient; Adam's normalisation absorbs most of it, SGD takes a half step.",
    checked="runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.step: "
            "self._update_scale(self.overflow) runs before unscale_and_clip_grads, which "
            "multiplies by 1. / self.loss_scale, the updated cur_scale. By hand, "
            "scale_window 2, 'FFF': step 3 grows 1024 -> 2048 (stable interval 2) and "
            "unscales gradients scaled by 1024 with 1/2048; the parameters after step 3 "
            "differ from those of the same run at a steady 1024, those after steps 1 and 2 "
            "do not.")

#: Test id -> how DeepSpeed's scaler differs there, checked by hand (both adapters:
#: hysteresis_two fails with consecutive_hysteresis=False only).
DIFFERENCES: dict[str, Difference] = {
    "test_vector[growth_on_nth_finite]": _LATE_GROWTH,
    "test_vector[backoff_resets_growth]": _LATE_GROWTH,
    "test_vector[nan_backs_off_like_inf]": _LATE_GROWTH,
    "test_vector[interval_one]": _LATE_GROWTH,
    "test_vector[hysteresis_two]": _HYSTERESIS_SINCE_GROWTH,
    "test_vector[hysteresis_rearmed_after_backoff]": _NOT_REARMED,
    "test_the_growth_step_is_unscaled_with_the_old_scale": _NEW_SCALE_UNSCALE,
    "test_vector[min_scale_clamp]": _RAISES_AT_MIN,
    "test_vector[growth_overflow_keeps_scale]": _FLOAT64_UP,
    "test_vector[growth_overflow_keeps_scale_with_hysteresis]": _FLOAT64_UP,
    "test_vector[reciprocal_overflow_skips_finite_steps]": _RECIPROCAL,
    "test_vector[backoff_reaches_zero_and_stays]": _FLOAT64_DOWN,
    "test_random_configs_and_steps_match_reference": Difference(
        sentence=_LATE_GROWTH.sentence + " And an overflow at the floor raises (see "
                 "min_scale_clamp).",
        matters=_LATE_GROWTH.matters + " The exception at the floor stops the run.",
        checked="Hypothesis finds both: scale_window 1, 'F' (stable interval 0: no growth, "
                "the spec grows to 2.0) and init_scale = min_scale = 1.0, 'I' (the overflow "
                "at cur_scale == min_scale raises). " + _LATE_GROWTH.checked),
}
