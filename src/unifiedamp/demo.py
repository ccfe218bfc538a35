"""Deprecated: ``unifiedamp.demo`` is now ``unifiedamp.cli.demo``.

This module re-exports the demo's public names (its config and forced overflows, the spec's
:func:`reference`, :func:`demo_report`...) and warns on import; it goes in the next release.
"""

from __future__ import annotations

import warnings

from unifiedamp.cli import demo as _demo
from unifiedamp.cli.demo import *  # noqa: F403 - the names of its __all__

__all__ = _demo.__all__

# stacklevel 2 names the user's import line: the import system's own frames are skipped.
warnings.warn("unifiedamp.demo is deprecated and goes in the next release: import "
              "unifiedamp.cli.demo", DeprecationWarning, stacklevel=2)
