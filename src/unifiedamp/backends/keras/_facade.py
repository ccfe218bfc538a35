"""The helpers of unifiedamp's facade that the Keras backend uses, imported here only: the
backend's other modules import them from this one, so where they live is written once."""

from __future__ import annotations

from unifiedamp._scaler import (
    GradScaler,
    HostCounters,
    LastUpdate,
    NoInfChecksError,
    diagnostics_options,
    is_flag,
    new_scale_value,
    update_arguments,
    watched_pairs,
)

__all__ = ["GradScaler", "HostCounters", "LastUpdate", "NoInfChecksError", "diagnostics_options",
           "is_flag", "new_scale_value", "update_arguments", "watched_pairs"]
