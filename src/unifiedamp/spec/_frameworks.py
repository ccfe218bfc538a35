"""How each native scaler spells the canonical parameters, its defaults, and what it can express.

Data only. The porting aliases (:data:`unifiedamp.spec.ALIASES`) are derived from
the ``names`` here, and ``tests/test_framework_assumptions.py`` checks the
``defaults`` against the framework where it is installed.

Each row: ``api`` (the native class), ``version`` (the releases whose native
API has these names and defaults; the releases unifiedamp's backends support are
the ranges of the package's extras), ``names`` (canonical -> native parameter name),
``defaults`` (by canonical name; a parameter the native constructor does not
take has the value it hard-codes), and ``native`` (which values it can express
itself: ``"any"`` means every valid value). A backend whose native scaler
cannot express a config implements the spec itself.
"""

from __future__ import annotations

import copy

# typing.TYPE_CHECKING without importing typing, which (with re and enum) would cost
# about a third of ``import unifiedamp`` (tests/test_import.py); type checkers know
# this idiom.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FRAMEWORKS"]

_PADDLE: dict[str, Any] = {
    "api": "paddle.amp.GradScaler",
    "version": ">=3.0",
    "names": {"init_scale": "init_loss_scaling", "growth_factor": "incr_ratio",
              "backoff_factor": "decr_ratio", "growth_interval": "incr_every_n_steps",
              "enabled": "enable", "hysteresis": "decr_every_n_nan_or_inf",
              "dynamic": "use_dynamic_loss_scaling"},
    "defaults": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                 "growth_interval": 2000, "enabled": True, "hysteresis": 1, "dynamic": True},
    "native": {"init_scale": "any", "growth_factor": "> 1.0", "backoff_factor": "< 1.0",
               "growth_interval": "any", "enabled": "any", "hysteresis": "any",
               "min_scale": "no", "max_scale": "no", "dynamic": "any"},
}

FRAMEWORKS: dict[str, dict[str, Any]] = {
    "torch": {
        "api": "torch.amp.GradScaler",
        "version": ">=2.3",
        "names": {"init_scale": "init_scale", "growth_factor": "growth_factor",
                  "backoff_factor": "backoff_factor", "growth_interval": "growth_interval",
                  "enabled": "enabled"},
        "defaults": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                     "growth_interval": 2000, "enabled": True},
        "native": {"init_scale": "any", "growth_factor": "> 1.0", "backoff_factor": "< 1.0",
                   "growth_interval": "any", "enabled": "any", "hysteresis": "1 only",
                   "min_scale": "no", "max_scale": "no", "dynamic": "True only"},
    },
    "paddle": copy.deepcopy(_PADDLE),
    # Scripts written against paddle 2.x (whose documentation, and AmpScaler, say
    # 32768 / 1000 / 2) carry other defaults than paddle 3.x: porting must know which.
    "paddle2": copy.deepcopy({
        **_PADDLE, "version": "2.x",
        "defaults": {**_PADDLE["defaults"], "init_scale": 32768.0, "growth_interval": 1000,
                     "hysteresis": 2},
    }),
    "keras": {
        "api": "keras.optimizers.LossScaleOptimizer",
        "version": ">=3.0",
        "names": {"init_scale": "initial_scale", "growth_interval": "dynamic_growth_steps"},
        "defaults": {"init_scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                     "growth_interval": 2000},
        "native": {"init_scale": "any", "growth_factor": "2.0 only",
                   "backoff_factor": "0.5 only", "growth_interval": "any",
                   "enabled": "any", "hysteresis": "1 only", "min_scale": "no",
                   "max_scale": "no", "dynamic": "True only"},
    },
    "jmp": {
        "api": "jmp.DynamicLossScale",
        "version": "0.0.4",
        "names": {"init_scale": "loss_scale", "growth_interval": "period",
                  "min_scale": "min_loss_scale"},
        # jmp's min_loss_scale defaults to 1.0: a port that leaves it out gets a
        # floor our default (None) does not have.
        "defaults": {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                     "min_scale": 1.0},
        "native": {"init_scale": "any", "growth_factor": "factor",
                   "backoff_factor": "1 / growth_factor only", "growth_interval": "any",
                   "enabled": "no", "hysteresis": "1 only", "min_scale": "any",
                   "max_scale": "no", "dynamic": "True only"},
    },
}
