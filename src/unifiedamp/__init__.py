"""unifiedamp: one dynamic loss scaler for mixed-precision training, for every framework.

``import unifiedamp`` imports no framework; a backend imports its own when it
is first used.

Example:
    >>> import unifiedamp as ua
    >>> scaler = ua.GradScaler(1024.0, growth_interval=100, backend="numpy")
    >>> scaler.get_scale()
    1024.0
"""

from unifiedamp._scaler import GradScaler
from unifiedamp.errors import (
    AmbiguousBackendError,
    EmptyStateDictError,
    ForeignArrayError,
    FrameworkConflictError,
    MissingBackendError,
    NoInfChecksError,
    ScaleCollapseError,
    ScaleCollapseWarning,
    ScaleNotCalledError,
    UnknownBackendError,
)
from unifiedamp.spec import ScalerConfig, ScalerState

__version__ = "0.1.0"

__all__ = [
    "AmbiguousBackendError",
    "EmptyStateDictError",
    "ForeignArrayError",
    "FrameworkConflictError",
    "GradScaler",
    "MissingBackendError",
    "NoInfChecksError",
    "ScaleCollapseError",
    "ScaleCollapseWarning",
    "ScaleNotCalledError",
    "ScalerConfig",
    "ScalerState",
    "UnknownBackendError",
    "__version__",
]
