"""A copy of a zoo scaler's rule, with bugs to plant: the suite must name the cause of each.

``PaddleRuleCopy`` is Paddle's dynamic loss scaling as its static-graph kernels run it
(``check_finite_and_unscale`` and ``update_loss_scaling``: float32 scale and ratios, int
good/bad step counters, ``==`` tests, a floor of 1 on backoff, no growth past inf; the
eager ``paddle.amp.GradScaler._update`` has no floor) in NumPy, over the NumPy backend's
SGD. ``UNIFIEDAMP_PLANTED_BUG`` names one bug to plant
(``PLANTED``); test_conformance_zoo.py runs the suite on each. ``state_on_skipped_step``
(optimizer state built, non-zero, by a skipped step) is driven by tests/core/test_causes.py.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from unifiedamp import spec
from unifiedamp.conformance.adapters.numpy import make_problem
from unifiedamp.conformance.interface import Adapter
from unifiedamp.spec import ScalerConfig, ScalerState

#: Bug name -> the cause the suite must name for it.
PLANTED = {
    "growth_one_step_late": "grows one step late",
    "nan_not_inf": "NaN taken as finite",
    "double_factor": "multiplies by a float64 factor",
    "float64_scale": "keeps the scale in float64",
    "hysteresis_not_rearmed": "hysteresis not re-armed at a backoff",
    "state_not_reloaded": "load does not restore the growth_tracker",
    # The scale and trackers stay right; only the parameters show these.
    "skips_growth_step": "skips the step that grows",
    "unscales_with_the_new_scale": "unscales the growth step with the new scale",
}


class PaddleRule:
    """Paddle's scaler rule; ``bug`` plants one of :data:`PLANTED`."""

    def __init__(self, config: ScalerConfig, bug: str = ""):
        self.config, self.bug = config, bug
        self.scale = np.float32(config.init_scale)
        self.good = self.bad = 0
        self.found_inf = False
        self.lazy: list[np.ndarray] = []

    def scale_loss(self, value: np.ndarray) -> np.ndarray:
        return value * self.scale.astype(value.dtype)

    def step(self, optimizer: Any) -> None:
        # check_finite_and_unscale: unscale by the float32 reciprocal, flag any inf/NaN.
        scale = self.scale
        if self.bug == "unscales_with_the_new_scale" and \
                self.good + 1 == self.config.growth_interval:
            scale = np.float32(scale * np.float32(self.config.growth_factor))
        inv = np.float32(1) / scale
        grads = [g * inv.astype(g.dtype) for g in optimizer.grads]
        bad = np.isinf if self.bug == "nan_not_inf" else (lambda g: ~np.isfinite(g))
        found = any(bool(bad(g).any()) for g in grads)
        self.found_inf = self.found_inf or found
        if self.bug == "state_on_skipped_step" and found and not self.lazy:
            self.lazy.append(np.ones(2, np.float32))  # optimizer state a skipped step built
        if self.bug == "skips_growth_step" and self.good + 1 == self.config.growth_interval:
            return
        if not found:
            optimizer.grads = grads
            optimizer.step()

    def update(self) -> None:
        # update_loss_scaling: float32 ratios, == against the step counts.
        c = self.config
        incr, decr = np.float32(c.growth_factor), np.float32(c.backoff_factor)
        if self.bug in ("double_factor", "float64_scale"):
            incr, decr = np.float64(c.growth_factor), np.float64(c.backoff_factor)
        f32 = np.float64 if self.bug == "float64_scale" else np.float32
        if not c.dynamic:
            self.found_inf = False
            return
        if self.found_inf:
            self.good, self.bad = 0, self.bad + 1
            if self.bad == c.hysteresis:
                self.scale = max(f32(self.scale * decr), f32(1))
                if self.bug != "hysteresis_not_rearmed":
                    self.bad = 0
        else:
            self.bad, self.good = 0, self.good + 1
            interval = c.growth_interval + (self.bug == "growth_one_step_late")
            if self.good == interval:
                grown = f32(self.scale * incr)
                self.scale = grown if np.isfinite(grown) else self.scale
                self.good = 0
        self.found_inf = False

    def state_dict(self) -> dict[str, Any]:
        return spec.to_state_dict(self.config, ScalerState(float(self.scale), self.good,
                                                           self.bad), "paddle-copy")

    def load_state_dict(self, d: dict[str, Any]) -> None:
        config, state = spec.parse_state_dict(d)
        self.config, self.scale = config.replace(enabled=self.config.enabled), np.float32(
            state.scale)
        if self.bug != "state_not_reloaded":
            self.good, self.bad = state.growth_tracker, state.hysteresis_tracker


class PaddleRuleCopy(Adapter):
    """Drives :class:`PaddleRule` (with the bug ``UNIFIEDAMP_PLANTED_BUG`` names, if any).

    ``UNIFIEDAMP_COPY_COMPARE=scale_and_skip`` reads no tracker;
    ``UNIFIEDAMP_COPY_SPACE=tiny`` declares a config space that most drawn configs miss.
    """

    capabilities = frozenset({"multi_optimizer", "set_config", "state_dict"})
    fixed = {"min_scale": None, "max_scale": None}

    def __init__(self) -> None:
        self.bug = os.environ.get("UNIFIEDAMP_PLANTED_BUG", "")
        self.name = f"paddle-copy{f'[{self.bug}]' if self.bug else ''}"
        self.compare = os.environ.get("UNIFIEDAMP_COPY_COMPARE", "full")
        self.tiny = os.environ.get("UNIFIEDAMP_COPY_SPACE") == "tiny"

    def expresses(self, config: ScalerConfig) -> str | None:
        if self.tiny and (config.growth_factor, config.backoff_factor) != (2.0, 0.5):
            return "this copy runs only the factors 2 and 0.5"
        return super().expresses(config)

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        return PaddleRule(config, self.bug), [make_problem() for _ in range(optimizers)]

    def iterate(self, handle: Any, kinds: str) -> Any:
        rule, problems = handle
        for kind, problem in zip(kinds, problems, strict=True):
            problem.set_grads(kind, _Scaling(rule))
            rule.step(problem.optimizer)
        rule.update()
        return handle

    def read(self, handle: Any) -> ScalerState:
        if self.compare == "scale_and_skip":
            return ScalerState(float(handle[0].scale), None, None)
        return ScalerState(float(handle[0].scale), handle[0].good, handle[0].bad)

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        return [*(a.copy() for problem in handle[1] for a in problem.snapshot()),
                *handle[0].lazy]

    def reconfigure(self, handle: Any, changes: dict[str, Any]) -> Any:
        handle[0].config = handle[0].config.replace(**changes)
        return handle

    def save(self, handle: Any) -> dict[str, Any]:
        return handle[0].state_dict()

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        handle[0].load_state_dict(state_dict)
        return handle


class _Scaling:
    """What the NumPy problem calls to scale its gradients."""

    def __init__(self, rule: PaddleRule):
        self.scale = rule.scale_loss
