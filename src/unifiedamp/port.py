"""Deprecated: ``unifiedamp.port`` is now part of ``unifiedamp.porting``.

This module re-exports the same objects (:data:`NATIVE_SCALERS`, :func:`config_from_call`,
:func:`native_call`, :func:`from_native`) and warns on import; it goes in the next release.
"""

from __future__ import annotations

import warnings

from unifiedamp.porting import NATIVE_SCALERS, config_from_call, from_native, native_call

__all__ = ["NATIVE_SCALERS", "config_from_call", "from_native", "native_call"]

# stacklevel 2 names the user's import line: the import system's own frames are skipped.
warnings.warn("unifiedamp.port is deprecated and goes in the next release: import its names "
              "from unifiedamp.porting", DeprecationWarning, stacklevel=2)
