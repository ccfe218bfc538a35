"""Deprecated: ``unifiedamp.port_source`` is now part of ``unifiedamp.porting``.

This module re-exports the same objects (:func:`port_source`, :class:`PortResult`,
:class:`CallSite`, :data:`TARGETS`) and warns on import; it goes in the next release.
"""

from __future__ import annotations

import warnings

from unifiedamp.porting import TARGETS, CallSite, PortResult, port_source

__all__ = ["CallSite", "PortResult", "TARGETS", "port_source"]

# stacklevel 2 names the user's import line: the import system's own frames are skipped.
warnings.warn("unifiedamp.port_source is deprecated and goes in the next release: import its "
              "names from unifiedamp.porting", DeprecationWarning, stacklevel=2)
