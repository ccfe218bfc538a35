"""The canonical ``state_dict`` format: writing it, and reading it or a native torch/Paddle dict.

Reading only reads: :func:`parse_state_dict` validates everything and returns
values, so a backend that applies them afterwards never half-applies a bad dict.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from unifiedamp.spec._config import (
    CANONICAL,
    INT32_MAX,
    ScalerConfig,
    config_from_args,
    is_real,
)
from unifiedamp.spec._float32 import f32
from unifiedamp.spec._natives import FRAMEWORKS
from unifiedamp.spec._rule import ScalerState

__all__ = ["STATE_FORMAT", "STATE_KEYS", "STATE_VERSION", "parse_state_dict", "to_state_dict"]

STATE_FORMAT = "unifiedamp.GradScaler"
STATE_VERSION = 1

STATE_KEYS = ("format", "version", "backend", "config", "scale", "growth_tracker",
              "hysteresis_tracker")


def to_state_dict(config: ScalerConfig, state: ScalerState, backend: str) -> dict[str, Any]:
    """The canonical, JSON-serialisable ``state_dict`` every backend returns.

    Example:
        >>> d = to_state_dict(ScalerConfig(), ScalerState(1024.0, 3, 0), "numpy")
        >>> d["format"], d["scale"], d["growth_tracker"]
        ('unifiedamp.GradScaler', 1024.0, 3)
    """
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "backend": backend,
        "config": config.to_dict(),
        "scale": float(state.scale),
        "growth_tracker": int(state.growth_tracker),
        "hysteresis_tracker": int(state.hysteresis_tracker),
    }


def _state_error(message: str) -> ValueError:
    return ValueError(f"Invalid scaler state_dict: {message}; nothing was loaded")


def _tracker(d: Mapping[str, Any], key: str, as_name: str) -> int:
    value = d[key]
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or int(value) < 0:
        raise _state_error(f"{as_name} must be an int >= 0, got {key}={value!r}")
    if int(value) > INT32_MAX - 1:
        raise _state_error(f"{as_name} must be <= {INT32_MAX - 1} (devices count it up by one "
                           f"in int32), got {key}={value!r}")
    return int(value)


def _scale_value(value: Any) -> float:
    # Native dicts carry the scale as a float, a 1-element array or a tensor.
    if hasattr(value, "item") and not isinstance(value, numbers.Number):
        size = getattr(value, "size", 1)
        size = size() if callable(size) else size
        if hasattr(value, "numel"):
            size = value.numel()
        if size != 1:
            raise _state_error(f"scale must hold one value, got {size}")
        value = value.item()
    if not is_real(value):
        raise _state_error(f"scale must be a number, got {value!r}")
    try:
        scale = float(value)
    except OverflowError:  # an int past float64's range, e.g. 10**400 from JSON
        raise _state_error(f"scale must be finite and >= 0 in float32, got an int of "
                           f"{len(str(abs(int(value))))} digits") from None
    # 0 is a state the rule reaches (backoffs without min_scale end there), and a
    # scaler reloads every state it can write.
    if not (math.isfinite(scale) and scale >= 0 and math.isfinite(f32(scale))):
        raise _state_error(f"scale must be finite and >= 0 in float32, got {value!r}")
    return f32(scale) + 0.0  # + 0.0: -0.0 is 0


def _parse_native(d: Mapping[str, Any], base: ScalerConfig) -> tuple[ScalerConfig, ScalerState]:
    # torch.amp.GradScaler.state_dict(): scale, growth_factor, backoff_factor,
    # growth_interval, _growth_tracker. paddle.amp.GradScaler.state_dict(): scale,
    # incr_ratio, decr_ratio, incr_every_n_steps, decr_every_n_nan_or_inf,
    # incr_count, decr_count, use_dynamic_loss_scaling. Parameters a native dict
    # does not carry keep the loading scaler's values.
    framework = "torch" if "_growth_tracker" in d else "paddle"
    names = FRAMEWORKS[framework]["names"]
    if framework == "torch":
        trackers = {"growth_tracker": "_growth_tracker"}
    else:
        trackers = {"growth_tracker": "incr_count", "hysteresis_tracker": "decr_count"}
    required = ["scale", *trackers.values()]
    missing = [k for k in required if k not in d]
    if missing:
        raise _state_error(f"missing key(s) {missing} (a native {framework} GradScaler dict "
                           f"has {required})")
    changes = {native: d[native] for native in names.values() if native in d and native != "scale"}
    try:
        config = config_from_args((), changes, base=base)
    except (TypeError, ValueError) as exc:
        raise _state_error(str(exc)) from None
    state = ScalerState(
        _scale_value(d["scale"]),
        *(_tracker(d, trackers[k], k) if k in trackers else 0
          for k in ("growth_tracker", "hysteresis_tracker")),
    )
    return config, state


def parse_state_dict(
    d: Any, base: ScalerConfig | None = None
) -> tuple[ScalerConfig, ScalerState]:
    """Validates a state dict and returns the config and state it holds.

    Accepts the canonical dict of any backend, and the native state dicts of
    ``torch.amp.GradScaler`` and ``paddle.amp.GradScaler`` (whose missing
    parameters are taken from ``base``). It only reads ``d``: a caller that
    applies the result after this returns never half-applies a bad dict.

    Raises:
        ValueError: Another format or version, a missing or ill-typed field, a
            negative or non-finite scale, a tracker below 0 or past int32.
        TypeError: ``d`` is not a mapping.

    Example:
        >>> cfg, st = parse_state_dict({"scale": 1024.0, "growth_factor": 2.0,
        ...     "backoff_factor": 0.5, "growth_interval": 100, "_growth_tracker": 7})
        >>> cfg.growth_interval, st
        (100, ScalerState(scale=1024.0, growth_tracker=7, hysteresis_tracker=0))
    """
    base = base or ScalerConfig()
    if not isinstance(d, Mapping):
        raise TypeError(f"state_dict must be a dict, got {type(d).__name__}")
    if not d:
        raise _state_error(
            "it is empty, possibly saved from a disabled torch or paddle GradScaler"
        )
    if "format" not in d:
        # Any one tracker key marks a native dict, so that a missing one (or a missing
        # scale) is named rather than the dict called unknown.
        if "_growth_tracker" in d or "incr_count" in d or "decr_count" in d:
            return _parse_native(d, base)
        raise _state_error(
            f"no 'format' key and not a torch or paddle GradScaler dict (keys: {sorted(d)})"
        )
    if d["format"] != STATE_FORMAT:
        raise _state_error(f"format must be {STATE_FORMAT!r}, got {d['format']!r}")
    version = d.get("version")
    if type(version) is float and version == STATE_VERSION:
        raise _state_error(f"version must be the int {STATE_VERSION}, got the float "
                           f"{version!r}; write \"version\": {STATE_VERSION}")
    if version != STATE_VERSION or isinstance(version, bool):
        raise _state_error(
            f"version {d.get('version')!r} is not supported (this unifiedamp reads version "
            f"{STATE_VERSION}); load it with the unifiedamp release that wrote it"
        )
    missing = [k for k in STATE_KEYS if k not in d]
    if missing:
        raise _state_error(f"missing key(s) {missing}")
    if not isinstance(d["backend"], str) or not d["backend"]:
        raise _state_error(f"backend must be the name of the backend that wrote it, got "
                           f"{d['backend']!r}")
    raw = d["config"]
    if not isinstance(raw, Mapping):
        raise _state_error(f"config must be a dict, got {raw!r}")
    absent = [k for k in CANONICAL if k not in raw]
    if absent:
        raise _state_error(f"config is missing {absent}")
    unknown = [k for k in raw if k not in CANONICAL]
    if unknown:
        raise _state_error(f"config has unknown key(s) {unknown}")
    try:
        config = ScalerConfig(**raw)
    except (TypeError, ValueError) as exc:
        raise _state_error(str(exc)) from None
    state = ScalerState(
        _scale_value(d["scale"]),
        _tracker(d, "growth_tracker", "growth_tracker"),
        _tracker(d, "hysteresis_tracker", "hysteresis_tracker"),
    )
    return config, state
