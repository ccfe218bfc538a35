"""Deprecated: ``unifiedamp.port_state`` is now part of ``unifiedamp.porting``.

This module re-exports the same objects (the state forms: :data:`FORMS`,
:func:`detect_form`, :func:`read_state`, :func:`convert_state`; the checkpoint files:
:func:`file_type`, :func:`load_file`, :func:`save_file`, :func:`port_state_file`,
:data:`LIGHTNING_KEYS`) and warns on import; it goes in the next release.
"""

from __future__ import annotations

import warnings

from unifiedamp.porting import (
    FORMS,
    LIGHTNING_KEYS,
    convert_state,
    detect_form,
    file_type,
    load_file,
    port_state_file,
    read_state,
    save_file,
)

__all__ = ["FORMS", "LIGHTNING_KEYS", "convert_state", "detect_form", "file_type", "load_file",
           "port_state_file", "read_state", "save_file"]

# stacklevel 2 names the user's import line: the import system's own frames are skipped.
warnings.warn("unifiedamp.port_state is deprecated and goes in the next release: import its "
              "names from unifiedamp.porting", DeprecationWarning, stacklevel=2)
