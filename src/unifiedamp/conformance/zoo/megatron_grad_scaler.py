"""The zoo's adapter of Megatron-core's ``DynamicGradScaler``
(``megatron.core.optimizer.grad_scaler``).

The scaler has no step logic of its own; the adapter runs the loop of
``megatron/core/optimizer/optimizer.py`` (``MixedPrecisionOptimizer.step``):

1. the loss is scaled by ``optimizer.scale_loss(loss)``: ``grad_scaler.scale * loss``;
2. ``prepare_grads`` -> ``_unscale_main_grads_and_check_for_nan``:
   ``torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf,
   grad_scaler.inv_scale)`` (its all-reduce over the model-parallel group is a no-op
   with one process), then ``grad_scaler.update(found_inf_flag)``;
3. on ``found_inf_flag`` the step returns without ``optimizer.step()``; otherwise the
   inner optimizer steps.

The model's float32 parameters stand for Megatron's main parameters (its fp16 copies
only change where the gradients come from).

Megatron's scaler takes ``initial_scale``, ``min_scale``, ``growth_factor``,
``backoff_factor``, ``growth_interval`` and ``hysteresis``; it asserts
``growth_factor > 1``, ``backoff_factor < 1`` and ``min_scale > 0``, and has no
``max_scale`` and no static mode (that is ``ConstantGradScaler``). A config without
``min_scale`` runs with the smallest one it takes, ``2**-149`` (the smallest float32
above 0). Its ``_growth_tracker`` is the spec's growth tracker; its
``_hysteresis_tracker`` counts down from ``hysteresis`` and only a growth refills it,
which is not the spec's count of consecutive non-finite steps: the suite compares the
scale, the growth tracker and which steps are skipped.

Megatron allocates its tensors with ``device='cuda'`` and its ``load_state_dict`` calls
``.cuda(torch.cuda.current_device())``. On another device (``UNIFIEDAMP_DEVICE``,
default ``cpu``) the adapter runs those two methods under a ``TorchFunctionMode`` that
sends ``cuda`` to that device (and ``torch.cuda.current_device`` to 0); every line of
Megatron's code runs as written.

``save``/``load`` convert Megatron's ``state_dict()`` (``scale``, ``growth_tracker``,
``hysteresis_tracker``) to the canonical dict and back, the hysteresis tracker as
``hysteresis - _hysteresis_tracker`` (overflows since the last growth), which loads
back to the same state. Megatron's dict carries no config: a Megatron run takes it
from its arguments, so ``load`` builds the scaler from the dict's config, then calls
``load_state_dict``.

Example (``unifiedamp conformance --zoo`` runs it; building one imports nothing):
    >>> from unifiedamp.conformance.zoo.megatron_grad_scaler import MegatronDynamicGradScaler
    >>> from unifiedamp.spec import ScalerConfig
    >>> adapter = MegatronDynamicGradScaler()
    >>> adapter.expresses(ScalerConfig(backoff_factor=1.0))
    'megatron.core DynamicGradScaler asserts backoff_factor < 1.0, got backoff_factor=1.0'
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from unifiedamp.conformance.interface import Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.conformance.zoo.torch_grad_scaler import (
    Run,
    backward_one,
    device,
    snapshot,
    torch_problems,
)
from unifiedamp.spec import ScalerConfig, ScalerState, parse_state_dict, read_form, to_state_dict

__all__ = ["DIFFERENCES", "MegatronDynamicGradScaler"]

#: What a config without min_scale runs with: Megatron asserts min_scale > 0.
NO_FLOOR = 2.0**-149


def _scaler_class() -> Any:
    with warnings.catch_warnings():
        # "Transformer Engine and Apex are not installed. Falling back to local
        # implementations": the optimizer package's fused kernels, not the scaler's.
        warnings.simplefilter("ignore", UserWarning)
        # (Megatron-core ships no type information: read as Any.)
        module: Any = importlib.import_module("megatron.core.optimizer.grad_scaler")
    return module.DynamicGradScaler


@contextlib.contextmanager
def _cuda_as(dev: str) -> Iterator[None]:
    """Runs Megatron's ``device='cuda'`` allocations and ``.cuda(...)`` moves on ``dev``."""
    if dev.startswith("cuda"):
        yield
        return
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaAs(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0].to(dev)
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = dev
            return func(*args, **kwargs)

    current_device = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0
    try:
        with CudaAs():
            yield
    finally:
        torch.cuda.current_device = current_device


class MegatronDynamicGradScaler(Adapter):
    """``megatron.core.optimizer.grad_scaler.DynamicGradScaler`` driven by
    ``MixedPrecisionOptimizer.step`` (see the module's docstring)."""

    name = "megatron.core DynamicGradScaler"
    capabilities = frozenset({"state_dict"})
    fixed: dict[str, Any] = {"max_scale": None, "dynamic": True}
    compare = "scale_and_skip"

    def __init__(self) -> None:
        self.device = device()

    def expresses(self, config: ScalerConfig) -> str | None:
        reason = super().expresses(config)
        if reason is None and not config.growth_factor > 1.0:
            reason = (f"{self.name} asserts growth_factor > 1.0, got "
                      f"growth_factor={config.growth_factor!r}")
        if reason is None and not config.backoff_factor < 1.0:
            reason = (f"{self.name} asserts backoff_factor < 1.0, got "
                      f"backoff_factor={config.backoff_factor!r}")
        if reason is None and not config.enabled:
            reason = f"{self.name} has no enabled=False (bf16 runs without a scaler)"
        return reason

    def info(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {"framework": "megatron-core", "version": version("megatron-core"),
                "device": self.device}

    def _scaler(self, config: ScalerConfig) -> Any:
        cls = _scaler_class()
        with _cuda_as(self.device):
            return cls(initial_scale=config.init_scale,
                       min_scale=NO_FLOOR if config.min_scale is None else config.min_scale,
                       growth_factor=config.growth_factor,
                       backoff_factor=config.backoff_factor,
                       growth_interval=config.growth_interval, hysteresis=config.hysteresis)

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Run:
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"cannot build {self.name} for {config}: {reason}")
        if optimizers != 1:
            raise ValueError(f"{self.name} runs one optimizer (Megatron's ChainedOptimizer "
                             "gives each of its optimizers its own scaler)")
        return Run(self._scaler(config), torch_problems(1, self.device), config)

    def iterate(self, handle: Run, kinds: str) -> Run:
        import torch

        scaler = handle.scaler
        # MegatronOptimizer.scale_loss is get_loss_scale() * loss, the scaler's scale.
        opt, grads = backward_one(self.name, handle, kinds, lambda loss: scaler.scale * loss)
        found_inf = torch.zeros(1, dtype=torch.float, device=self.device)
        with torch.no_grad():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf,
                                                             scaler.inv_scale)
        found_inf_flag = found_inf.item() > 0
        scaler.update(found_inf_flag)
        if not found_inf_flag:
            opt.step()
        return handle

    def read(self, handle: Run) -> ScalerState:
        scaler = handle.scaler
        return ScalerState(scaler.scale.item(), scaler._growth_tracker, None)

    def snapshot(self, handle: Run) -> list[np.ndarray]:
        return snapshot(handle)

    def save(self, handle: Run) -> dict[str, Any]:
        native = handle.scaler.state_dict()
        config = handle.config
        state = ScalerState(native["scale"].item(), native["growth_tracker"],
                            config.hysteresis - native["hysteresis_tracker"])
        # Validates as a loader would: the scale a float32 value >= 0, trackers >= 0.
        return to_state_dict(*parse_state_dict(to_state_dict(config, state, self.name)),
                             self.name)

    def load(self, handle: Run, state_dict: dict[str, Any]) -> Run:
        import torch

        config, state, _ = read_form(state_dict, handle.config)
        config = config.replace(enabled=handle.config.enabled)
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"{self.name} cannot load {config}: {reason}")
        scaler = self._scaler(config)
        with _cuda_as(self.device):
            scaler.load_state_dict({
                "scale": torch.tensor([state.scale], dtype=torch.float),
                "growth_tracker": state.growth_tracker,
                "hysteresis_tracker": config.hysteresis - state.hysteresis_tracker})
        handle.scaler, handle.config = scaler, config
        return handle


_SOURCE = "megatron/core/optimizer/grad_scaler.py (megatron-core 0.16.1), DynamicGradScaler"
_SNIPPETS = "docs/snippets/zoo/megatron"

#: Each cause of Megatron-core's departures from the spec, checked by hand.
DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="hysteresis not refilled by finite steps",
        sentence="Megatron's hysteresis counts overflows since the last growth, not consecutive "
                 "ones: _hysteresis_tracker is refilled only by a growth, so finite steps "
                 "between two overflows do not reset it.",
        matters="Yes with hysteresis > 1 (Megatron's default is 2): two isolated overflows "
                "within one growth interval back off, where the spec waits for two in a row.",
        checked=f"{_SOURCE}.update: on found_inf _growth_tracker = 0 and _hysteresis_tracker "
                "-= 1, a backoff if it is <= 0; a finite step does _growth_tracker += 1, and "
                "only when that reaches growth_interval is _hysteresis_tracker set back to "
                "hysteresis. hysteresis_two (1024, interval 3, hysteresis 2, IIFIFII): I -> 1; "
                "I -> 0, back off to 512; F; I -> -1, back off to 256 (the spec: one overflow "
                "since a finite step, 512). Random (1.0, interval 2, hysteresis 2, IFI): I -> 1, "
                "F, I -> 0, back off to 0.5 (the spec keeps 1.0). The state tests meet it in "
                "the run after the load, which reads back the saved state exactly: saved after "
                "FFFFFI (2048, _hysteresis_tracker 1), FF does not refill it, and the next I "
                "backs off to 1024 where the spec keeps 2048.",
        snippet=f"{_SNIPPETS}/hysteresis_not_refilled_by_finite_steps.py"),
    Difference(
        cause="hysteresis not re-armed at a backoff",
        sentence="A backoff leaves _hysteresis_tracker at 0 or below, so every further overflow "
                 "backs off again until a growth sets it back to hysteresis, where the spec "
                 "re-arms the hysteresis at each backoff and waits for hysteresis more overflows "
                 "in a row.",
        matters="Yes with hysteresis > 1 (Megatron's default is 2): at hysteresis h a burst of k "
                "overflows in a row backs off k - h + 1 times, the spec k // h times.",
        checked=f"{_SOURCE}.update: `self._hysteresis_tracker -= 1` at every overflow and a "
                "backoff `if self._hysteresis_tracker <= 0`, with no reset there. "
                "hysteresis_rearmed_after_backoff (1024, hysteresis 2, IIII): trackers 1, 0, "
                "-1, -2, scales 1024, 512, 256, 128 (the spec 1024, 512, 512, 256). Loaded from "
                "a numpy scaler's state (hysteresis 2, backoff 0.25, FIIFFFIIIF): the third I "
                "of the last three backs off again, 144 where the spec has 576.",
        snippet=f"{_SNIPPETS}/hysteresis_not_re_armed_at_a_backoff.py"),
    Difference(
        cause="growth overflows to inf",
        sentence="Megatron grows with self._scale * self.growth_factor without checking that "
                 "the product is finite: from 2**127 the scale becomes inf and stays inf "
                 "(every scaled loss overflows, and torch.max(inf * backoff_factor, min_scale) "
                 "is inf), so every later step is skipped. An inf scale is no state of the "
                 "spec: the canonical state dict refuses it, so such a run cannot be saved.",
        matters="Only if the scale reaches 2**127 (~1.7e38): training then stops for good. "
                "Megatron starts at 2**32 and fp16 gradients overflow long before, so rare.",
        checked=f"{_SOURCE}.update: self._scale = self._scale * self.growth_factor on float32 "
                "tensors, and a backoff torch.max(self._scale * self.backoff_factor, "
                "self.min_scale). growth_overflow_keeps_scale (2**127, interval 1, FFIF): step 1 "
                "gives 2**128 = inf in float32 (the spec keeps 2**127), then every step is "
                "skipped at inf. test_every_reachable_state_reloads draws such runs (init "
                "2**126, growth_factor 4, interval 1, F: inf), whose state no canonical dict "
                "holds: saving it meets 'scale must be finite'.",
        snippet=f"{_SNIPPETS}/growth_overflows_to_inf.py"),
    Difference(
        cause="takes a finite step whose 1/scale overflows",
        sentence="Megatron unscales with torch's _amp_foreach_non_finite_check_and_unscale_, "
                 "which tests the scaled gradients before it multiplies them, so where 1/scale "
                 "overflows float32 (a scale below about 2.9e-39) the finite gradients pass, are "
                 "multiplied by inv_scale = inf, and the optimizer steps with inf gradients, "
                 "where the spec backs off and skips.",
        matters="Only after the scale has collapsed below ~2.9e-39, which Megatron's default "
                "--min-loss-scale of 1 prevents.",
        checked="megatron/core/optimizer/optimizer.py, "
                "MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan: "
                "torch._amp_foreach_non_finite_check_and_unscale_(main_grads, found_inf, "
                "grad_scaler.inv_scale), inv_scale = scale.double().reciprocal().float(), inf "
                "for 2**-130. reciprocal_overflow_skips_finite_steps (2**-130, interval 1, "
                "FFF): found_inf 0, the scale grows to 2**-129 (the spec backs off to 2**-131) "
                "and the step writes inf into the parameters. backoff_reaches_zero_and_stays: "
                "at the floor 2**-149, the same.",
        snippet=f"{_SNIPPETS}/takes_a_finite_step_whose_reciprocal_overflows.py"),
    Difference(
        cause="floor at the smallest float32",
        sentence="Megatron asserts min_scale > 0.0, so it has no 'no floor': a config without "
                 "min_scale runs with the smallest floor its float32 min_scale tensor holds, "
                 "2**-149, and the scale stops there instead of reaching 0. (A Python min_scale "
                 "below 2**-150 passes the assertion and rounds to 0 in that tensor, which is no "
                 "floor.)",
        matters="No: only scales below 2**-126, after some 150 overflows in a row, differ.",
        checked=f"{_SOURCE}.__init__: `assert min_scale > 0.0`, self.min_scale = "
                "torch.tensor([min_scale], dtype=torch.float, ...); update backs off to "
                "torch.max(scale * backoff_factor, min_scale). backoff_reaches_zero_and_stays "
                "(2**-148, IIFF): 2**-149, then max(0, 2**-149) = 2**-149 (the spec 0).",
        snippet=f"{_SNIPPETS}/floor_at_the_smallest_float32.py"),
    Difference(
        cause="grows only when the tracker equals the interval",
        sentence="Megatron grows only when _growth_tracker == growth_interval, so a tracker "
                 "already past the interval (a checkpoint's growth_tracker loaded into a run "
                 "with a smaller --loss-scale-window) never equals it: the scale never grows "
                 "again until an overflow resets the tracker.",
        matters="When a run resumes with a smaller loss_scale_window than its checkpoint's "
                "tracker: the scale stops growing until the next overflow.",
        checked=f"{_SOURCE}.update: `if self._growth_tracker == self.growth_interval`; "
                "load_state_dict sets _growth_tracker from the dict. A loaded tracker 7 with "
                "interval 5: F -> 8, no growth (the spec: 8 >= 5, grows to 2048).",
        snippet=f"{_SNIPPETS}/grows_only_when_the_tracker_equals_the_interval.py"),
)
