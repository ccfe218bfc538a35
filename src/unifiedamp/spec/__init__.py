"""The normative specification of dynamic loss scaling, executable.

Everything every backend must agree on lives here, in pure Python, one concern
per module; this package re-exports the public names:

- ``_float32``: float32 rounding and bit patterns;
- ``_names``: the canonical parameter names;
- ``_config``: :class:`ScalerConfig`, its validation, building one from any spelling;
- ``_natives``: one table per native scaler (its call, defaults per version, what it can
  carry, its state dict), the porting aliases;
- ``_rule``: :class:`ScalerState` and the reference :func:`update`;
- ``_state_dict``: the canonical ``state_dict``, and reading and writing each native form;
- ``_vectors``: the hand-computed test vectors;
- ``_document``: the whole spec as JSON and Markdown (``unifiedamp spec``).

The update rule, run once per iteration with ``found_inf`` being the OR of
every unscale check since the previous update::

    if not dynamic:   scale unchanged, trackers reset to 0
    elif found_inf:
        growth_tracker = 0
        hysteresis_tracker += 1
        if hysteresis_tracker >= hysteresis:
            scale = f32(scale * f32(backoff_factor)), clamped up to f32(min_scale)
            hysteresis_tracker = 0
    else:
        hysteresis_tracker = 0
        growth_tracker += 1
        if growth_tracker >= growth_interval:
            candidate = f32(scale * f32(growth_factor)), clamped down to f32(max_scale)
            if candidate is finite: scale = candidate
            growth_tracker = 0

Example:
    >>> from unifiedamp.spec import ScalerConfig, ScalerState, update
    >>> config = ScalerConfig(1024.0, growth_interval=3)
    >>> state = ScalerState.initial(config)
    >>> for found_inf in [False, False, False, True]:
    ...     state = update(config, state, found_inf)
    ...     print(state.scale, state.growth_tracker)
    1024.0 1
    1024.0 2
    2048.0 0
    1024.0 0
"""

import importlib

from unifiedamp.spec._config import CANONICAL, INT32_MAX, ScalerConfig, config_from_args
from unifiedamp.spec._float32 import FLOAT32_MIN_NORMAL, f32, f32_bits, f32_from_bits, f32_hex
from unifiedamp.spec._natives import ALIASES, FRAMEWORKS, NATIVE_SCALERS, STATE_FORMS, cannot_carry
from unifiedamp.spec._rule import MIN_UNSCALABLE, ScalerState, unscale_overflows, update

# ``import unifiedamp`` needs only the config and the rule. The state-dict format,
# the test vectors and the spec document are loaded on first access (PEP 562), to
# keep the bare import fast (tests/core/test_import.py).
_LAZY = {
    "STATE_FORMAT": "_state_dict", "STATE_VERSION": "_state_dict",
    "parse_state_dict": "_state_dict", "to_state_dict": "_state_dict",
    "detect_form": "_state_dict", "read_form": "_state_dict", "write_form": "_state_dict",
    "native_dict": "_state_dict",
    "VECTORS": "_vectors", "Vector": "_vectors", "run_reference": "_vectors",
    "SCHEMA_VERSION": "_document", "SPEC_VERSION": "_document",
    "spec_document": "_document", "spec_markdown": "_document",
}

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from unifiedamp.spec._document import (
        SCHEMA_VERSION,
        SPEC_VERSION,
        spec_document,
        spec_markdown,
    )
    from unifiedamp.spec._state_dict import (
        STATE_FORMAT,
        STATE_VERSION,
        detect_form,
        native_dict,
        parse_state_dict,
        read_form,
        to_state_dict,
        write_form,
    )
    from unifiedamp.spec._vectors import VECTORS, Vector, run_reference


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ALIASES",
    "CANONICAL",
    "FLOAT32_MIN_NORMAL",
    "FRAMEWORKS",
    "INT32_MAX",
    "MIN_UNSCALABLE",
    "NATIVE_SCALERS",
    "SCHEMA_VERSION",
    "SPEC_VERSION",
    "STATE_FORMAT",
    "STATE_FORMS",
    "STATE_VERSION",
    "VECTORS",
    "ScalerConfig",
    "ScalerState",
    "Vector",
    "cannot_carry",
    "config_from_args",
    "detect_form",
    "f32",
    "f32_bits",
    "f32_from_bits",
    "f32_hex",
    "native_dict",
    "parse_state_dict",
    "read_form",
    "run_reference",
    "spec_document",
    "spec_markdown",
    "to_state_dict",
    "unscale_overflows",
    "update",
    "write_form",
]
