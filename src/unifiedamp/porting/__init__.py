"""Porting loss-scaler code, live scalers and checkpoints between frameworks.

Import every name from here, ``from unifiedamp.porting import ...``; the modules below it
are private and may change.

- Configs: :func:`config_from_call` (a native constructor call -> the canonical
  :class:`~unifiedamp.spec.ScalerConfig`), :func:`native_call` (a config -> a native
  constructor's keyword arguments, with what it cannot express), both reading
  :data:`NATIVE_SCALERS`, the table of native constructors and their defaults per version.
- Live scalers: :func:`from_native` (a torch, paddle, Keras, jmp or Flax ``DynamicScale``
  scaler -> the equivalent unifiedamp scaler, with its state); :func:`to_dynamic_scale`
  (a unifiedamp scaler -> Flax's ``DynamicScale``, with :func:`dynamic_scale_kwargs`).
- Source: :func:`port_source` rewrites the native scaler constructors of a Python file for
  another :data:`TARGETS` entry (the ``unifiedamp port`` command); it returns a
  :class:`PortResult` of :class:`CallSite` records.
- States: :func:`detect_form`, :func:`read_state` and :func:`convert_state` move a scaler
  state between the :data:`FORMS` (canonical, torch, paddle, keras, jmp, flax).
- Checkpoint files: :func:`load_file` and :func:`save_file` (atomic; no file runs code
  unless trusted, and reading one is bounded by :class:`ReadLimits`), :func:`file_type`,
  and :func:`port_state_file`, which converts the state inside a checkpoint and keeps the
  rest (Lightning's entries: :data:`LIGHTNING_KEYS`; the
  ``unifiedamp port-state`` command).

No framework is imported by ``import unifiedamp.porting``: each function imports what it
reads or builds.

Example:
    >>> from unifiedamp.porting import config_from_call, native_call
    >>> config, _ = config_from_call("torch.amp.GradScaler", ("cuda", 1024.0))
    >>> native_call(config, "paddle")[0]["init_loss_scaling"]
    1024.0
"""

from __future__ import annotations

from unifiedamp.porting._checkpoints import (
    LIGHTNING_KEYS,
    file_type,
    load_file,
    port_state_file,
    save_file,
)
from unifiedamp.porting._config import NATIVE_SCALERS, config_from_call, native_call
from unifiedamp.porting._flax import dynamic_scale_kwargs, to_dynamic_scale
from unifiedamp.porting._from_native import from_native
from unifiedamp.porting._limits import ReadLimits
from unifiedamp.porting._source import TARGETS, CallSite, PortResult, port_source
from unifiedamp.porting._states import FORMS, convert_state, detect_form, read_state

__all__ = [
    "FORMS",
    "LIGHTNING_KEYS",
    "NATIVE_SCALERS",
    "TARGETS",
    "CallSite",
    "PortResult",
    "ReadLimits",
    "config_from_call",
    "convert_state",
    "detect_form",
    "dynamic_scale_kwargs",
    "file_type",
    "from_native",
    "load_file",
    "native_call",
    "port_source",
    "port_state_file",
    "read_state",
    "save_file",
    "to_dynamic_scale",
]
