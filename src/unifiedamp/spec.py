"""The normative specification of dynamic loss scaling, executable.

Everything every backend must agree on lives here, in pure Python: the
configuration and its validation, the aliases used when porting code, the
reference update rule in float32 arithmetic, the canonical ``state_dict``
format, the per-framework name maps, and the test vectors.

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

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "ALIASES",
    "CANONICAL",
    "FLOAT32_MIN_NORMAL",
    "FRAMEWORKS",
    "STATE_FORMAT",
    "STATE_VERSION",
    "SCHEMA_VERSION",
    "SPEC_VERSION",
    "VECTORS",
    "ScalerConfig",
    "ScalerState",
    "Vector",
    "config_from_args",
    "f32",
    "f32_hex",
    "parse_state_dict",
    "run_reference",
    "spec_document",
    "to_state_dict",
    "update",
]

SPEC_VERSION = 1
# The layout of spec_document() (docs/spec-schema.md); bumped only when a key
# changes meaning or disappears.
SCHEMA_VERSION = 1
STATE_FORMAT = "unifiedamp.GradScaler"
STATE_VERSION = 1
FLOAT32_MIN_NORMAL = 2.0**-126

_F32 = struct.Struct("<f")


def f32(x: float) -> float:
    """Rounds ``x`` to the nearest float32 (ties to even), returned as a Python float.

    Example:
        >>> f32(0.1)
        0.10000000149011612
        >>> f32(1e39)
        inf
    """
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:
        # struct refuses finite values that round past float32's range; IEEE rounds them to inf.
        return math.copysign(math.inf, x)


def f32_hex(x: float) -> str:
    """The float32 bit pattern of ``x`` as ``0x########``, for error messages.

    Example:
        >>> f32_hex(1.0)
        '0x3f800000'
    """
    return "0x" + _F32.pack(f32(x))[::-1].hex()


# --------------------------------------------------------------------------- parameters

CANONICAL = (
    "init_scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "enabled",
    "hysteresis",
    "min_scale",
    "max_scale",
    "dynamic",
)
_POSITIONAL = CANONICAL[:5]

# Porting aliases: each maps to exactly one canonical name. They rename; they
# never bring the other framework's defaults along.
ALIASES: dict[str, str] = {
    # camelCase (the torch command reference's spelling)
    "initScale": "init_scale",
    "growthFactor": "growth_factor",
    "backoffFactor": "backoff_factor",
    "growthInterval": "growth_interval",
    "minScale": "min_scale",
    "maxScale": "max_scale",
    # paddle.amp.GradScaler
    "init_loss_scaling": "init_scale",
    "incr_ratio": "growth_factor",
    "decr_ratio": "backoff_factor",
    "incr_every_n_steps": "growth_interval",
    "decr_every_n_nan_or_inf": "hysteresis",
    "enable": "enabled",
    "use_dynamic_loss_scaling": "dynamic",
    # keras.optimizers.LossScaleOptimizer
    "initial_scale": "init_scale",
    "dynamic_growth_steps": "growth_interval",
    # jmp.DynamicLossScale
    "loss_scale": "init_scale",
    "period": "growth_interval",
    "min_loss_scale": "min_scale",
}

_RULES = {
    "init_scale": "a finite number > 0 that float32 can hold",
    "growth_factor": "a finite number >= 1",
    "backoff_factor": "a number with 0 < backoff_factor <= 1",
    "growth_interval": "an int >= 1",
    "enabled": "a bool",
    "hysteresis": "an int >= 1",
    "min_scale": "None or a finite number > 0 that float32 can hold, <= max_scale",
    "max_scale": "None or a finite number > 0 that float32 can hold, >= min_scale",
    "dynamic": "a bool",
}


def _is_real(value: Any) -> bool:
    # bool is an int in Python; a scale of True is a bug, not a 1.
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _invalid(name: str, value: Any, exc: type[Exception] = ValueError) -> Exception:
    return exc(f"{name} must be {_RULES[name]}, got {value!r}")


def _check_real(name: str, value: Any) -> float:
    if not _is_real(value):
        raise _invalid(name, value, TypeError)
    return float(value)


def _check_positive_f32(name: str, value: Any) -> float:
    x = _check_real(name, value)
    if not (math.isfinite(x) and x > 0 and math.isfinite(f32(x)) and f32(x) > 0):
        raise _invalid(name, value)
    return x


def _check_int(name: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise _invalid(name, value, TypeError)
    if value < 1:
        raise _invalid(name, value)
    return int(value)


def _check_bool(name: str, value: Any) -> bool:
    # numpy.bool_ is not a bool subclass but is unambiguous; ints are not accepted.
    if type(value).__name__ not in ("bool", "bool_"):
        raise _invalid(name, value, TypeError)
    return bool(value)


@dataclasses.dataclass(frozen=True)
class ScalerConfig:
    """An immutable, validated loss-scaler configuration.

    The first five parameters may be given positionally, in the order of
    ``torch.amp.GradScaler`` (without its device). The rest are keyword-only.

    Args:
        init_scale: The scale before the first update. Rounded to float32.
        growth_factor: Multiplier applied after ``growth_interval`` finite updates in a row.
        backoff_factor: Multiplier applied after ``hysteresis`` non-finite updates in a row.
        growth_interval: How many consecutive finite updates trigger a growth.
        enabled: ``False`` turns every scaler verb into a pass-through.
        hysteresis: How many consecutive non-finite updates trigger a backoff.
        min_scale: Floor applied after a backoff (``None``: no floor).
        max_scale: Ceiling applied after a growth (``None``: no ceiling).
        dynamic: ``False`` keeps the scale fixed (static loss scaling).

    Raises:
        TypeError: A parameter has the wrong type.
        ValueError: A parameter is out of range. The message names the parameter,
            the value received and what is allowed.

    Example:
        >>> ScalerConfig(1024.0, 2.0, 0.5, 100).growth_interval
        100
        >>> ScalerConfig(growth_interval=0)
        Traceback (most recent call last):
        ...
        ValueError: growth_interval must be an int >= 1, got 0
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True
    _: dataclasses.KW_ONLY
    hysteresis: int = 1
    min_scale: float | None = None
    max_scale: float | None = None
    dynamic: bool = True

    def __post_init__(self) -> None:
        values = {
            "init_scale": _check_positive_f32("init_scale", self.init_scale),
            "growth_factor": _check_real("growth_factor", self.growth_factor),
            "backoff_factor": _check_real("backoff_factor", self.backoff_factor),
            "growth_interval": _check_int("growth_interval", self.growth_interval),
            "enabled": _check_bool("enabled", self.enabled),
            "hysteresis": _check_int("hysteresis", self.hysteresis),
            "dynamic": _check_bool("dynamic", self.dynamic),
        }
        if not (math.isfinite(values["growth_factor"]) and values["growth_factor"] >= 1):
            raise _invalid("growth_factor", self.growth_factor)
        if not 0 < values["backoff_factor"] <= 1:
            raise _invalid("backoff_factor", self.backoff_factor)
        for name in ("min_scale", "max_scale"):
            value = getattr(self, name)
            values[name] = None if value is None else _check_positive_f32(name, value)
        lo, hi = values["min_scale"], values["max_scale"]
        if lo is not None and hi is not None and f32(lo) > f32(hi):
            raise ValueError(
                f"min_scale must be <= max_scale, got min_scale={self.min_scale!r} "
                f"and max_scale={self.max_scale!r}; swap them or drop one"
            )
        # Store plain Python values so the config hashes, compares and serialises
        # the same whatever numeric types the caller passed.
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> ScalerConfig:
        """A copy with some parameters changed (canonical names or aliases), validated.

        Example:
            >>> ScalerConfig().replace(incr_ratio=3.0).growth_factor
            3.0
        """
        return config_from_args((), changes, base=self)

    def to_dict(self) -> dict[str, Any]:
        """Every canonical parameter, JSON-serialisable.

        Example:
            >>> ScalerConfig().to_dict()["growth_interval"]
            2000
        """
        return {name: getattr(self, name) for name in CANONICAL}


def _suggest(name: str, extra_names: tuple[str, ...]) -> str:
    known = [*CANONICAL, *ALIASES, *extra_names]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if not close:
        lowered = {k.lower().replace("_", ""): k for k in known}
        hit = lowered.get(name.lower().replace("_", ""))
        close = [hit] if hit else []
    hint = f" (did you mean {close[0]!r}?)" if close else f"; valid names: {', '.join(CANONICAL)}"
    return f"Unknown parameter: {name!r}{hint}"


def config_from_args(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    base: ScalerConfig | None = None,
    extra_names: tuple[str, ...] = (),
) -> ScalerConfig:
    """Builds a config from positional and keyword arguments that may use aliases.

    Args:
        args: Up to five positional values, in canonical order.
        kwargs: Canonical names or any alias in :data:`ALIASES`.
        base: Values not given are taken from here (default: the spec defaults).
        extra_names: Other names the caller accepts, so that a typo of one of
            them gets a useful suggestion.

    Raises:
        TypeError: Too many positional values, an unknown name, or one
            parameter given twice (the message names both spellings).

    Example:
        >>> config_from_args((), {"initScale": 1024.0, "incr_every_n_steps": 10}).growth_interval
        10
        >>> config_from_args((), {"initScal": 1.0})
        Traceback (most recent call last):
        ...
        TypeError: Unknown parameter: 'initScal' (did you mean 'initScale'?)
    """
    if len(args) > len(_POSITIONAL):
        raise TypeError(
            f"GradScaler takes at most {len(_POSITIONAL)} positional parameters "
            f"({', '.join(_POSITIONAL)}), got {len(args)}; pass the rest by keyword"
        )
    spelled: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, value in zip(_POSITIONAL, args, strict=False):
        spelled[name] = f"positional argument {_POSITIONAL.index(name) + 1}"
        values[name] = value
    for key, value in kwargs.items():
        canonical = key if key in CANONICAL else ALIASES.get(key)
        if canonical is None:
            raise TypeError(_suggest(key, extra_names))
        if canonical in spelled:
            first = spelled[canonical]
            first = first if first.startswith("positional") else repr(first)
            raise TypeError(
                f"{canonical} was given twice, as {first} and as {key!r}; pass only one"
            )
        spelled[canonical] = key
        values[canonical] = value
    base_values = (base or ScalerConfig()).to_dict()
    base_values.update(values)
    return ScalerConfig(**base_values)


# --------------------------------------------------------------------------- the algorithm


class ScalerState(NamedTuple):
    """The dynamic part of a scaler: what a checkpoint must carry.

    Attributes:
        scale: The current scale, a float32 value held in a Python float.
        growth_tracker: Consecutive finite updates since the last growth or backoff.
        hysteresis_tracker: Consecutive non-finite updates since the last backoff.

    Example:
        >>> ScalerState.initial(ScalerConfig(0.1))
        ScalerState(scale=0.10000000149011612, growth_tracker=0, hysteresis_tracker=0)
    """

    scale: float
    growth_tracker: int = 0
    hysteresis_tracker: int = 0

    @classmethod
    def initial(cls, config: ScalerConfig) -> ScalerState:
        """The state before the first update: ``f32(init_scale)``, trackers at 0."""
        return cls(f32(config.init_scale), 0, 0)


def update(config: ScalerConfig, state: ScalerState, found_inf: bool) -> ScalerState:
    """The reference update: one iteration of the spec, in float32 arithmetic.

    Each product of two float32 values is exact in float64 (24 + 24 bits < 53),
    so rounding that product once to float32 is exactly an IEEE float32 multiply.

    Example:
        >>> config = ScalerConfig(1.0, growth_factor=1.1, growth_interval=1)
        >>> update(config, ScalerState.initial(config), False).scale
        1.100000023841858
    """
    scale, growth, hyst = state
    if not config.dynamic:
        return ScalerState(scale, 0, 0)
    if found_inf:
        growth, hyst = 0, hyst + 1
        if hyst >= config.hysteresis:
            scale = f32(scale * f32(config.backoff_factor))
            if config.min_scale is not None:
                scale = max(scale, f32(config.min_scale))
            hyst = 0
        return ScalerState(scale, growth, hyst)
    hyst, growth = 0, growth + 1
    if growth >= config.growth_interval:
        candidate = f32(scale * f32(config.growth_factor))
        if config.max_scale is not None:
            candidate = min(candidate, f32(config.max_scale))
        if math.isfinite(candidate):
            scale = candidate
        growth = 0
    return ScalerState(scale, growth, hyst)


# --------------------------------------------------------------------------- state_dict

_STATE_KEYS = ("format", "version", "backend", "config", "scale", "growth_tracker",
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
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise _state_error(f"{as_name} must be an int >= 0, got {key}={value!r}")
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
    if not _is_real(value):
        raise _state_error(f"scale must be a number, got {value!r}")
    scale = float(value)
    if not (math.isfinite(scale) and scale > 0 and math.isfinite(f32(scale)) and f32(scale) > 0):
        raise _state_error(f"scale must be finite and > 0 in float32, got {value!r}")
    return f32(scale)


def _parse_native(d: Mapping[str, Any], base: ScalerConfig) -> tuple[ScalerConfig, ScalerState]:
    # torch.amp.GradScaler.state_dict(): scale, growth_factor, backoff_factor,
    # growth_interval, _growth_tracker. paddle.amp.GradScaler.state_dict(): scale,
    # incr_ratio, decr_ratio, incr_every_n_steps, decr_every_n_nan_or_inf,
    # incr_count, decr_count, use_dynamic_loss_scaling. Parameters a native dict
    # does not carry keep the loading scaler's values.
    if "_growth_tracker" in d:
        names = FRAMEWORKS["torch"]["names"]
        trackers = {"growth_tracker": "_growth_tracker"}
    else:
        names = FRAMEWORKS["paddle"]["names"]
        trackers = {"growth_tracker": "incr_count", "hysteresis_tracker": "decr_count"}
    required = ["scale", *trackers.values()]
    missing = [k for k in required if k not in d]
    if missing:
        raise _state_error(f"missing key(s) {missing}")
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
            non-finite or non-positive scale, a negative tracker.
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
        if "scale" in d and ("_growth_tracker" in d or "incr_count" in d):
            return _parse_native(d, base)
        raise _state_error(
            f"no 'format' key and not a torch or paddle GradScaler dict (keys: {sorted(d)})"
        )
    if d["format"] != STATE_FORMAT:
        raise _state_error(f"format must be {STATE_FORMAT!r}, got {d['format']!r}")
    if d.get("version") != STATE_VERSION:
        raise _state_error(
            f"version {d.get('version')!r} is not supported (this unifiedamp reads version "
            f"{STATE_VERSION}); load it with the unifiedamp release that wrote it"
        )
    missing = [k for k in _STATE_KEYS if k not in d]
    if missing:
        raise _state_error(f"missing key(s) {missing}")
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


# --------------------------------------------------------------------------- frameworks

# How each native scaler spells the canonical parameters, its defaults, and
# what it can express natively ("any" = every valid value). A backend whose
# native scaler cannot express a config implements the spec itself.
FRAMEWORKS: dict[str, dict[str, Any]] = {
    "torch": {
        "api": "torch.amp.GradScaler",
        "names": {"init_scale": "init_scale", "growth_factor": "growth_factor",
                  "backoff_factor": "backoff_factor", "growth_interval": "growth_interval",
                  "enabled": "enabled"},
        "defaults": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                     "growth_interval": 2000, "enabled": True},
        "native": {"init_scale": "any", "growth_factor": "> 1.0", "backoff_factor": "< 1.0",
                   "growth_interval": "any", "enabled": "any", "hysteresis": "1 only",
                   "min_scale": "no", "max_scale": "no", "dynamic": "True only"},
    },
    "paddle": {
        "api": "paddle.amp.GradScaler",
        "names": {"init_scale": "init_loss_scaling", "growth_factor": "incr_ratio",
                  "backoff_factor": "decr_ratio", "growth_interval": "incr_every_n_steps",
                  "enabled": "enable", "hysteresis": "decr_every_n_nan_or_inf",
                  "dynamic": "use_dynamic_loss_scaling"},
        "defaults": {"init_scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                     "growth_interval": 1000, "enabled": True, "hysteresis": 2,
                     "dynamic": True},
        "native": {"init_scale": "any", "growth_factor": "> 1.0", "backoff_factor": "< 1.0",
                   "growth_interval": "any", "enabled": "any", "hysteresis": "any",
                   "min_scale": "no", "max_scale": "no", "dynamic": "any"},
    },
    "keras": {
        "api": "keras.optimizers.LossScaleOptimizer",
        "names": {"init_scale": "initial_scale", "growth_interval": "dynamic_growth_steps"},
        "defaults": {"init_scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                     "growth_interval": 2000},
        "native": {"init_scale": "any", "growth_factor": "2.0 only",
                   "backoff_factor": "0.5 only", "growth_interval": "any",
                   "enabled": "any", "hysteresis": "1 only", "min_scale": "no",
                   "max_scale": "no", "dynamic": "True only"},
    },
    "jmp": {
        "api": "jmp.DynamicLossScale",
        "names": {"init_scale": "loss_scale", "growth_interval": "period",
                  "min_scale": "min_loss_scale"},
        "defaults": {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                     "min_scale": None},
        "native": {"init_scale": "any", "growth_factor": "factor",
                   "backoff_factor": "1 / growth_factor only", "growth_interval": "any",
                   "enabled": "no", "hysteresis": "1 only", "min_scale": "any",
                   "max_scale": "no", "dynamic": "True only"},
    },
}


def spec_document() -> dict[str, Any]:
    """The whole specification as one JSON-serialisable dict (``unifiedamp spec``).

    Example:
        >>> doc = spec_document()
        >>> doc["parameters"][0]["name"], doc["parameters"][0]["default"]
        ('init_scale', 65536.0)
    """
    defaults = ScalerConfig().to_dict()
    aliases: dict[str, list[str]] = {name: [] for name in CANONICAL}
    for alias, name in ALIASES.items():
        aliases[name].append(alias)
    return {
        "schema": "unifiedamp.spec",
        "schema_version": SCHEMA_VERSION,
        "spec_version": SPEC_VERSION,
        "state_format": {"format": STATE_FORMAT, "version": STATE_VERSION,
                         "keys": list(_STATE_KEYS)},
        "parameters": [
            {"name": name, "default": defaults[name], "positional": name in _POSITIONAL,
             "valid": _RULES[name], "aliases": aliases[name]}
            for name in CANONICAL
        ],
        "frameworks": FRAMEWORKS,
        "vectors": [v.to_dict() for v in VECTORS],
    }


# --------------------------------------------------------------------------- test vectors


class Vector(NamedTuple):
    """One reference scenario: a config, a step pattern and the scales it must produce.

    ``steps`` is a string of ``F`` (all gradients finite), ``I`` (an inf) and
    ``N`` (a NaN), one character per iteration. ``changes`` maps a step index
    to config changes applied just before that step (as ``set_*`` would).
    ``scales`` is the scale after each update, computed by hand.
    """

    name: str
    config: dict[str, Any]
    steps: str
    scales: tuple[float, ...]
    changes: dict[int, dict[str, Any]] = {}

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["scales"] = list(self.scales)
        d["changes"] = {str(k): v for k, v in self.changes.items()}
        return d


def run_reference(vector: Vector) -> list[ScalerState]:
    """The reference trajectory of a vector: the state after each update.

    Example:
        >>> [s.scale for s in run_reference(VECTORS[0])] == list(VECTORS[0].scales)
        True
    """
    config = ScalerConfig(**vector.config)
    state = ScalerState.initial(config)
    trace = []
    for i, kind in enumerate(vector.steps):
        if i in vector.changes:
            config = config.replace(**vector.changes[i])
        state = update(config, state, kind != "F")
        trace.append(state)
    return trace


_G = 1.100000023841858  # f32(1.1)
VECTORS: tuple[Vector, ...] = (
    Vector("growth_on_nth_finite", {"init_scale": 1024.0, "growth_interval": 3},
           "FFFFFF", (1024, 1024, 2048, 2048, 2048, 4096)),
    Vector("backoff_resets_growth", {"init_scale": 1024.0, "growth_interval": 3},
           "IFFFIIFFFF", (512, 512, 512, 1024, 512, 256, 256, 256, 512, 512)),
    Vector("nan_backs_off_like_inf", {"init_scale": 1024.0, "growth_interval": 2},
           "NFFNI", (512, 512, 1024, 512, 256)),
    Vector("interval_one", {"init_scale": 1024.0, "growth_interval": 1},
           "FFIF", (2048, 4096, 2048, 4096)),
    Vector("defaults_first_steps", {}, "IIF", (32768, 16384, 16384)),
    Vector("hysteresis_two", {"init_scale": 1024.0, "growth_interval": 3, "hysteresis": 2},
           "IIFIFII", (1024, 512, 512, 512, 512, 512, 256)),
    Vector("min_scale_clamp", {"init_scale": 4.0, "min_scale": 1.5}, "IIIF",
           (2, 1.5, 1.5, 1.5)),
    Vector("max_scale_clamp", {"init_scale": 4.0, "growth_interval": 1, "max_scale": 10.0},
           "FFFI", (8, 10, 10, 5)),
    Vector("growth_overflow_keeps_scale", {"init_scale": 2.0**127, "growth_interval": 1},
           "FFIF", (2.0**127, 2.0**127, 2.0**126, 2.0**127)),
    Vector("non_power_of_two_factors_float32",
           {"init_scale": 1.0, "growth_factor": 1.1, "backoff_factor": 0.7,
            "growth_interval": 1},
           "FFFI",
           # float32 after every multiply. Carrying the scale in float64 and rounding
           # once at the end gives 0.9316999912261963 at the last step instead.
           (_G, 1.2100000381469727, 1.3310000896453857, 0.9317000508308411)),
    Vector("backoff_below_one", {"init_scale": 2.0}, "IIIF", (1, 0.5, 0.25, 0.25)),
    Vector("growth_factor_one", {"init_scale": 8.0, "growth_factor": 1.0,
                                 "growth_interval": 1}, "FFI", (8, 8, 4)),
    Vector("backoff_factor_one", {"init_scale": 8.0, "backoff_factor": 1.0,
                                  "growth_interval": 2}, "IFIFF", (8, 8, 8, 8, 16)),
    Vector("static_mode", {"init_scale": 1024.0, "growth_interval": 1, "dynamic": False},
           "FIFNF", (1024, 1024, 1024, 1024, 1024)),
    Vector("lowered_interval_grows_next_finite",
           {"init_scale": 1024.0, "growth_interval": 5},
           "FFFFF", (1024, 1024, 1024, 2048, 2048), changes={3: {"growth_interval": 2}}),
)
