"""The configuration: :class:`ScalerConfig`, its validation, and building one from any spelling."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

from unifiedamp.spec._float32 import f32
from unifiedamp.spec._names import CANONICAL, POSITIONAL
from unifiedamp.spec._natives import ALIASES

# typing.TYPE_CHECKING without importing typing, which (with re and enum) a bare ``import
# unifiedamp`` must not load (tests/core/test_import.py); type checkers know this idiom.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ALIASES", "CANONICAL", "INT32_MAX", "POSITIONAL", "RULES", "ScalerConfig",
           "config_from_args", "is_real", "python_scalar"]


#: The largest trackers, growth_interval and hysteresis: devices count in int32.
INT32_MAX = 2**31 - 1

RULES = {
    "init_scale": "a finite number > 0 that float32 can hold",
    "growth_factor": "a finite number >= 1 that float32 can hold",
    "backoff_factor": "a number with 0 < backoff_factor <= 1 that is > 0 in float32",
    "growth_interval": f"an int with 1 <= growth_interval <= {INT32_MAX}",
    "enabled": "a bool",
    "hysteresis": f"an int with 1 <= hysteresis <= {INT32_MAX}",
    "min_scale": "None or a finite number > 0 that float32 can hold, <= max_scale",
    "max_scale": "None or a finite number > 0 that float32 can hold, >= min_scale",
    "dynamic": "a bool",
}

# What a porting user most likely meant by a parameter that has no counterpart here.
_FOREIGN = {
    "factor": "jmp's factor=f means growth_factor=f and backoff_factor=1/f: pass both",
}


def is_real(value: Any) -> bool:
    # bool is an int in Python; a scale of True is a bug, not a 1.
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _invalid(name: str, value: Any, exc: type[Exception] = ValueError, hint: str = "") -> Exception:
    return exc(f"{name} must be {RULES[name]}{hint}, got {value!r}")


def python_scalar(name: str, value: Any) -> Any:
    """A 0-d array of any framework (NumPy, JAX, torch...) as the Python number it holds.

    Anything else is returned as it is, for the type checks to judge. Configs are
    static: a traced value (inside ``jax.jit``) has no number yet and is refused.

    Example:
        >>> import numpy as np
        >>> python_scalar("init_scale", np.asarray(1024.0)), python_scalar("x", "s")
        (1024.0, 's')
    """
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, (numbers.Number, str)):
        return value
    if tuple(shape) != ():
        raise TypeError(f"{name} must be a number, got an array of shape {tuple(shape)}")
    try:
        return value.item()
    except Exception:  # noqa: BLE001 - each framework raises its own type for a tracer
        raise TypeError(
            f"{name} must be a concrete number, got {type(value).__name__} {value!r}: a "
            "scaler's config is static, so build it outside jax.jit (or any traced "
            "function) from Python numbers or concrete arrays") from None


def _check_real(name: str, value: Any) -> float:
    if not is_real(value):
        raise _invalid(name, value, TypeError)
    try:
        return float(value)
    except OverflowError:  # an int past float64's range
        raise _invalid(name, value) from None


def _check_positive_f32(name: str, value: Any) -> float:
    x = _check_real(name, value)
    if not (math.isfinite(x) and x > 0 and math.isfinite(f32(x)) and f32(x) > 0):
        raise _invalid(name, value)
    return x


def _check_int(name: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise _invalid(name, value, TypeError)
    if int(value) < 1:
        raise _invalid(name, value)
    if int(value) > INT32_MAX:
        never = "; growth_factor=1.0 never grows" if name == "growth_interval" else ""
        raise _invalid(name, value, hint=f" (trackers count in int32 on devices{never})")
    return int(value)


def _check_bool(name: str, value: Any) -> bool:
    # numpy.bool_ is not a bool subclass but is unambiguous; ints are not accepted.
    if type(value).__name__ not in ("bool", "bool_"):
        raise _invalid(name, value, TypeError)
    return bool(value)


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
        ValueError: growth_interval must be an int with 1 <= growth_interval <= 2147483647, got 0
    """

    # A plain class that behaves like the frozen dataclass it used to be (same
    # signature, repr, equality, hash, FrozenInstanceError, pickles): ``import
    # dataclasses`` pulls in ``inspect`` and ``re``, which a bare ``import unifiedamp``
    # must not load (tests/core/test_import.py). What no longer applies is dataclasses.fields(),
    # asdict() and replace() on it: ``to_dict()`` and ``replace()`` do that.
    # The class attributes are the defaults, readable on the class as before.
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True
    hysteresis: int = 1
    min_scale: float | None = None
    max_scale: float | None = None
    dynamic: bool = True

    __match_args__ = POSITIONAL

    # The fields in __dict__, the kept hash apart; weak references as a dataclass has them.
    __slots__ = ("__dict__", "__weakref__", "_hash")
    _hash: int

    def __init__(
        self,
        init_scale: float = 65536.0,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        hysteresis: int = 1,
        min_scale: float | None = None,
        max_scale: float | None = None,
        dynamic: bool = True,
    ) -> None:
        given = {"init_scale": init_scale, "growth_factor": growth_factor,
                 "backoff_factor": backoff_factor, "growth_interval": growth_interval,
                 "enabled": enabled, "hysteresis": hysteresis, "min_scale": min_scale,
                 "max_scale": max_scale, "dynamic": dynamic}
        raw = {name: python_scalar(name, given[name]) for name in CANONICAL}
        values: dict[str, Any] = {
            "init_scale": _check_positive_f32("init_scale", raw["init_scale"]),
            "growth_factor": _check_real("growth_factor", raw["growth_factor"]),
            "backoff_factor": _check_real("backoff_factor", raw["backoff_factor"]),
            "growth_interval": _check_int("growth_interval", raw["growth_interval"]),
            "enabled": _check_bool("enabled", raw["enabled"]),
            "hysteresis": _check_int("hysteresis", raw["hysteresis"]),
            "dynamic": _check_bool("dynamic", raw["dynamic"]),
        }
        growth, backoff = values["growth_factor"], values["backoff_factor"]
        # The rule multiplies by f32(factor): a factor that rounds to inf or 0 there
        # would make every growth overflow or every backoff a collapse to 0.
        if not (math.isfinite(growth) and growth >= 1 and math.isfinite(f32(growth))):
            raise _invalid("growth_factor", raw["growth_factor"])
        if not (0 < backoff <= 1 and f32(backoff) > 0):
            raise _invalid("backoff_factor", raw["backoff_factor"])
        for name in ("min_scale", "max_scale"):
            values[name] = None if raw[name] is None else _check_positive_f32(name, raw[name])
        lo, hi = values["min_scale"], values["max_scale"]
        if lo is not None and hi is not None and f32(lo) > f32(hi):
            raise ValueError(
                f"min_scale must be <= max_scale, got min_scale={raw['min_scale']!r} "
                f"and max_scale={raw['max_scale']!r}; swap them or drop one"
            )
        # Store plain Python values so the config hashes, compares and serialises
        # the same whatever numeric types the caller passed.
        for name in CANONICAL:
            object.__setattr__(self, name, values[name])

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in CANONICAL)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in CANONICAL)
        return f"{type(self).__qualname__}({fields})"

    def __eq__(self, other: object) -> bool:
        if other is self:  # the usual case for a pytree's aux data or a cache key
            return True
        if other.__class__ is self.__class__ and isinstance(other, ScalerConfig):
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self) -> int:
        # Kept after the first call (in a slot: vars() shows the fields only): JAX
        # hashes a scaler's config (its pytree aux data) at every jitted call, and
        # the torch scaler at every tensor-op update.
        try:
            return self._hash
        except AttributeError:
            cached = hash(self._values())
            object.__setattr__(self, "_hash", cached)
            return cached

    def __getstate__(self) -> dict[str, Any]:
        # __dict__ without the slot: a hash holding None differs between processes
        # (Python 3.11), so a copy computes its own.
        return dict(self.__dict__)

    def __setattr__(self, name: str, value: Any) -> None:
        raise _frozen(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise _frozen(f"cannot delete field {name!r}")

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


def _frozen(message: str) -> AttributeError:
    # The error a frozen dataclass raises, so that code catching it keeps working;
    # dataclasses is imported only on this error path (see ScalerConfig).
    import dataclasses

    return dataclasses.FrozenInstanceError(message)


def _suggest(name: str, extra_names: tuple[str, ...]) -> str:
    # difflib is imported only here, for an error message (import time).
    import difflib

    if name in _FOREIGN:
        return f"Unknown parameter: {name!r} ({_FOREIGN[name]})"
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
    if len(args) > len(POSITIONAL):
        raise TypeError(
            f"GradScaler takes at most {len(POSITIONAL)} positional parameters "
            f"({', '.join(POSITIONAL)}), got {len(args)}; pass the rest by keyword"
        )
    spelled: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, value in zip(POSITIONAL, args, strict=False):
        spelled[name] = f"positional argument {POSITIONAL.index(name) + 1}"
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
    config = ScalerConfig(**base_values)
    if base is None:
        _check_init_within_bounds(config)
    return config


def _check_init_within_bounds(config: ScalerConfig) -> None:
    # A new scaler outside its bounds would have its first backoff raise the scale to
    # min_scale (or its first growth lower it to max_scale). Checked when a scaler is
    # built, not on a loaded state or a bound changed mid-run: there init_scale is
    # only a record, and the running scale is what the bounds act on.
    init, lo, hi = f32(config.init_scale), config.min_scale, config.max_scale
    name = ("min_scale" if lo is not None and init < f32(lo) else
            "max_scale" if hi is not None and init > f32(hi) else None)
    if name is not None:
        raise ValueError(
            f"init_scale must be within [min_scale, max_scale], got init_scale="
            f"{config.init_scale!r} and {name}={getattr(config, name)!r}; start at {name} or "
            "move the bound")
