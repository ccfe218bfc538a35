"""The spec's update rule on torch tensors: which configs torch's own kernel runs, the rule as
tensor ops for the others (compiled into one kernel on CUDA, replayed as a CUDA graph), and
the bound that keeps the check for an unscalable scale off the device."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from unifiedamp import spec
from unifiedamp.backends.torch._compat import current_dispatch_mode
from unifiedamp.spec import ScalerConfig, cannot_carry

__all__ = [
    "COMPILED_RULE_DEVICES", "capture_rule", "not_finite", "rule_constants",
    "rule_for", "spec_update_", "torch_expressible", "traced", "updates_before_unscalable",
]


def torch_expressible(config: ScalerConfig) -> bool:
    """Whether torch's own update kernel (``torch.amp.GradScaler``'s) computes this
    config's update.

    Example:
        >>> from unifiedamp.spec import ScalerConfig, cannot_carry
        >>> torch_expressible(ScalerConfig()), torch_expressible(ScalerConfig(hysteresis=2))
        (True, False)
    """
    return not cannot_carry(config, "torch.amp.GradScaler")


#: Scales at or above this are far from MIN_UNSCALABLE (8x): 1 / scale is finite
#: there, and float32 products stay normal, so rounding is relative (2**-24 at most).
_SAFE_SCALE = 2 * spec.FLOAT32_MIN_NORMAL


def updates_before_unscalable(config: ScalerConfig, scale: float) -> float:
    """How many updates from ``scale`` provably keep the scale >= ``_SAFE_SCALE``.

    Each update multiplies the scale by at least ``f32(backoff_factor)`` (growth and
    holding only raise or keep it; min_scale only raises it), rounded to nearest, so
    after n updates it is >= scale * (b * (1 - 2**-24)) ** n. Until then the spec's
    extra inf for an unscalable scale cannot happen and its device check is skipped.

    Example:
        >>> updates_before_unscalable(ScalerConfig(), 65536.0)  # 2**16 down to ~2**-125
        139
        >>> updates_before_unscalable(ScalerConfig(min_scale=1.0), 65536.0)
        inf
    """
    if not scale >= _SAFE_SCALE:
        return 0
    floor_scale = config.min_scale if config.min_scale is not None else 0.0
    backoff = spec.f32(config.backoff_factor) * (1 - 2.0**-24)
    if not config.dynamic or spec.f32(floor_scale) >= _SAFE_SCALE or backoff >= 1.0:
        return math.inf
    # One update less than the bound: the logarithms are rounded too.
    return max(0, math.floor(math.log(scale / _SAFE_SCALE) / -math.log(backoff)) - 1)


def rule_constants(config: ScalerConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """The rule's float32 constants as 0-dim tensors on ``device``, made once per config:
    a Python number in ``torch.where`` would be a new tensor (a kernel) at every update."""
    values = {"one": 1.0, "zero": 0.0, "growth": spec.f32(config.growth_factor),
              "backoff": spec.f32(config.backoff_factor)}
    if config.min_scale is not None:
        values["min"] = spec.f32(config.min_scale)
    if config.max_scale is not None:
        values["max"] = spec.f32(config.max_scale)
    constants = {name: torch.tensor(value, dtype=torch.float32, device=device)
                 for name, value in values.items()}
    constants["one64"] = torch.tensor(1.0, dtype=torch.float64, device=device)
    return constants


def spec_update_(scale: torch.Tensor, growth: torch.Tensor, hyst: torch.Tensor,
                 found_inf: torch.Tensor, config: ScalerConfig,
                 constants: dict[str, torch.Tensor]) -> None:
    """The spec's update as tensor ops, in place, with no host sync.

    ``found_inf`` is 0.0 or 1.0 (float32); ``constants`` come from ``rule_constants``.
    """
    if not config.dynamic:
        growth.zero_()
        hyst.zero_()
        return
    # Few, small ops: each is a kernel launch (a few microseconds) on any device.
    # The trackers in float64 (exact over int32, which float32 is not past 2**24)
    # with the flag as a 0/1 multiplier: (tracker + 1) * flag is one addcmul.
    finite = constants["one64"] - found_inf
    inf = constants["one64"] - finite
    new_hyst = torch.addcmul(inf, hyst, inf)  # + 1 on an inf, else 0
    new_growth = torch.addcmul(finite, growth, finite)  # + 1 when finite, else 0
    back_off = new_hyst >= config.hysteresis
    grow = new_growth >= config.growth_interval  # never after an inf: new_growth is 0 then
    # One multiply by backoff, growth or 1.0 (exact). A float32 tensor times a
    # float32 value rounds once: the spec's f32(scale * f32(factor)).
    factor = torch.where(back_off, constants["backoff"],
                         torch.where(grow, constants["growth"], constants["one"]))
    candidate = scale * factor
    if config.min_scale is not None:  # on a backoff only: max(candidate, min or 0)
        candidate = torch.maximum(candidate,
                                  torch.where(back_off, constants["min"], constants["zero"]))
    if config.max_scale is not None:  # on a growth only; it keeps the scale finite too
        candidate = torch.where(grow, candidate.clamp_(max=constants["max"]), candidate)
    # Only a growth can overflow (to +inf, never NaN); then the old scale stays.
    torch.where(candidate != math.inf, candidate, scale, out=scale)
    hyst.copy_(new_hyst.masked_fill_(back_off, 0))
    growth.copy_(new_growth.masked_fill_(grow, 0))


def not_finite(finite: Any, device: torch.device) -> torch.Tensor:
    """``update(finite)``'s flag as a check: a float32 0.0/1.0 (1.0: not finite) on
    ``device``, without a host sync."""
    if isinstance(finite, torch.Tensor):
        return torch.logical_not(finite).to(device=device, dtype=torch.float32,
                                            non_blocking=True)
    return torch.tensor(0.0 if bool(finite) else 1.0, device=device)


def traced(device_type: str) -> bool:
    """Whether this code is being traced into a graph that runs again without it:
    ``torch.compile``, or a CUDA graph capture (asked only for a ``"cuda"`` scale: a few
    microseconds of host time per call otherwise). The host-side shortcuts then step
    aside (a replay does not run this Python) and nothing reads the device. Takes the
    device's type as a string: reading ``tensor.device`` costs host time at every step."""
    return torch.compiler.is_compiling() or (
        device_type == "cuda" and torch.cuda.is_current_stream_capturing())


# ------------------------------------------------------------ the rule compiled

#: Device types on which the tensor-op rule runs compiled by torch.compile, as one
#: fused kernel (Triton on CUDA) instead of ~16 small ones: on a GPU each is a launch.
#: On a CPU the small ops cost microseconds and a compilation seconds, so not there.
COMPILED_RULE_DEVICES = {"cuda"}
#: ``spec_update_`` through ``torch.compile``, made at the first compilation.
_compiled_rule: Any = None
#: (config, device type) -> whether the compiled rule runs there (tried once each).
_compiled_ok: dict[tuple[ScalerConfig, str], bool] = {}


def rule_for(config: ScalerConfig, constants: dict[str, torch.Tensor],
             device: torch.device) -> Any:
    """``spec_update_``, compiled where ``COMPILED_RULE_DEVICES`` asks for it and the
    compiler works (else, once warned, the tensor ops)."""
    if (device.type not in COMPILED_RULE_DEVICES or torch.compiler.is_compiling()
            or current_dispatch_mode() is not None):
        # Inside a compiled step the rule is traced with the step; under a dispatch
        # mode (a FLOP counter, a debug mode) torch.compile refuses to run.
        return spec_update_
    key = (config, device.type)
    ok = _compiled_ok.get(key)
    if ok is None:
        ok = _compiled_ok[key] = _try_compiled_rule(config, constants, device)
    return _compiled_rule if ok else spec_update_


def _try_compiled_rule(config: ScalerConfig, constants: dict[str, torch.Tensor],
                       device: torch.device) -> bool:
    """Compiles the rule for ``config`` with a first call on scratch tensors: a failure
    (no Triton, no C++ compiler, a dispatch mode active) can come after dynamo has run
    the function eagerly, so it must not touch the scaler's own tensors."""
    global _compiled_rule
    if _compiled_rule is None:
        _compiled_rule = torch.compile(spec_update_, fullgraph=True, dynamic=False)
    scratch = (torch.ones((), device=device), torch.zeros((), dtype=torch.int32, device=device),
               torch.zeros((), dtype=torch.int32, device=device),
               torch.zeros((), device=device))
    try:
        _compiled_rule(*scratch, config, constants)
    except Exception as exc:
        warnings.warn(f"torch.compile could not compile the loss-scale update on {device.type} "
                      f"({exc!r:.300}); it runs as separate tensor ops instead",
                      RuntimeWarning, stacklevel=5)
        return False
    return True


def capture_rule(scale: torch.Tensor, growth: torch.Tensor, hyst: torch.Tensor,
                 config: ScalerConfig, constants: dict[str, torch.Tensor]
                 ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """The compiled rule on these tensors as a CUDA graph of its one kernel, and the flag
    buffer it reads: copy each update's found_inf into the flag, then replay the graph.
    A call of a compiled function costs more host time than a launch-bound step can hide
    (``docs/backends/torch.md``, Performance); a replay costs a few microseconds. Capture
    records, it does not run: the tensors are the scaler's own."""
    flag = torch.zeros((), device=scale.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _compiled_rule(scale, growth, hyst, flag, config, constants)
    return graph, flag
