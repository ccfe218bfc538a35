"""The conformance suite: proves that a scaler follows the spec, step by step, bit for bit.

Two ways in (see ``docs/conformance.md``):

- subclass :class:`ScalerContract` in your own test module and give it an
  ``adapter`` fixture;
- ``pytest --pyargs unifiedamp.conformance --unifiedamp-backend NAME_OR_module:Class``
  (or the ``UNIFIEDAMP_BACKEND`` environment variable).

A backend is driven through an adapter (:mod:`unifiedamp.conformance.interface`);
the built-in backends' adapters are in :mod:`unifiedamp.conformance.adapters`.
Every name here loads on first use, so that the pytest plugin in this package
imports nothing heavy (no NumPy, no hypothesis) in a run that does not use it.

Example:
    >>> from unifiedamp import spec
    >>> from unifiedamp.conformance import run_vector
    >>> from unifiedamp.backends.numpy import NumpyGradScaler
    >>> print(run_vector(NumpyGradScaler.conformance_adapter(), spec.VECTORS[0]))
    None
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CAPABILITIES": "interface", "Adapter": "interface", "ImperativeAdapter": "interface",
    "Problem": "interface", "FunctionalAdapter": "interface", "STEP_KINDS": "interface",
    "Divergence": "_runner", "run_steps": "_runner", "run_vector": "_runner",
    "ScalerContract": "contract",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
