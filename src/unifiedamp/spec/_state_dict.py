"""The canonical ``state_dict`` format, and each native form: reading and writing them.

Reading only reads: :func:`parse_state_dict` validates everything and returns
values, so a backend that applies them afterwards never half-applies a bad dict.
The native forms (:data:`unifiedamp.spec.STATE_FORMS`: torch's, Paddle's, Keras's
optimizer variables, jmp's fields) are told apart by :func:`detect_form`, read by
:func:`read_form` and written by :func:`write_form`, which refuses a config the form
cannot carry (what each native scaler carries is its entry's ``carries`` in the
natives' table).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, SupportsFloat, SupportsInt, cast

from unifiedamp.errors import EmptyStateDictError
from unifiedamp.spec._config import (
    CANONICAL,
    INT32_MAX,
    ScalerConfig,
    config_from_args,
    is_real,
)
from unifiedamp.spec._float32 import FLOAT32_MAX, f32
from unifiedamp.spec._natives import (
    FRAMEWORKS,
    NATIVE_SCALERS,
    STATE_FORMS,
    cannot_carry,
)
from unifiedamp.spec._rule import ScalerState

__all__ = ["FLAX_FIELDS", "FLAX_SCALER", "STATE_FORMAT", "STATE_KEYS", "STATE_VERSION",
           "detect_form", "flax_defaults", "form_cannot_carry", "native_defaults",
           "native_dict", "parse_state_dict", "read_form", "state_number", "to_state_dict",
           "write_form"]

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
        scale = float(cast(SupportsFloat, value))  # a real number (checked above)
    except OverflowError:  # an int past float64's range, e.g. 10**400 from JSON
        raise _state_error(f"scale must be finite and >= 0 in float32, got an int of "
                           f"{len(str(abs(int(cast(SupportsInt, value)))))} digits") from None
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
    framework = detect_form(d)
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
        EmptyStateDictError: ``d`` is empty (a ValueError, and a RuntimeError as torch's and
            Paddle's own scalers raise).
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
        raise EmptyStateDictError(
            "Invalid scaler state_dict: it is empty, possibly saved from a disabled torch or "
            "paddle GradScaler; nothing was loaded")
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


# ------------------------------------------------------------------ native forms

_JMP_KEYS = ("loss_scale", "counter", "period", "factor", "min_loss_scale")


def detect_form(d: Any) -> str:
    """Which of :data:`STATE_FORMS` a dict is, from its keys.

    Example:
        >>> detect_form({"scale": 1024.0, "_growth_tracker": 3, "growth_factor": 2.0,
        ...              "backoff_factor": 0.5, "growth_interval": 100})
        'torch'
        >>> detect_form({"dynamic_scale": 1024.0, "step_counter": 3})
        'keras'
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"a scaler state must be a dict, got {type(d).__name__}")
    for form, entry in STATE_FORMS.items():
        keys = entry["keys"]
        # torch's and paddle's dicts are marked by any one tracker key, so that a
        # missing one is named rather than the dict called unknown.
        if (any if form in ("torch", "paddle") else all)(k in d for k in keys):
            return form
    raise ValueError(
        f"not a scaler state: keys {sorted(map(str, d))} match none of the forms "
        f"{tuple(STATE_FORMS)} (canonical has 'format'; torch '_growth_tracker'; paddle "
        "'incr_count'; keras 'dynamic_scale' and 'step_counter'; jmp 'loss_scale' and "
        "'counter'; flax 'fin_steps' and 'scale'); pass the scaler's own entry (key=) if this "
        "is a whole checkpoint")


def state_number(d: Mapping[str, Any], key: str) -> Any:
    """The number at ``d[key]``, unwrapped from a 1-element list, array or tensor."""
    # Files give back 0-d or 1-element arrays and tensors where the framework held a
    # variable (Keras, jmp, msgpack, npz), and JSON gives lists for Paddle's [scale].
    if key not in d:
        raise ValueError(f"Invalid scaler state_dict: the {detect_form(d)} form needs {key!r}, "
                         f"and this dict has only {sorted(map(str, d))}; nothing was loaded")
    value = d[key]
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if hasattr(value, "item") and not isinstance(value, numbers.Number):
        array: Any = value  # an array or a tensor (a list has no .item)
        size = array.numel() if hasattr(array, "numel") else getattr(array, "size", None)
        if size == 1:
            value = array.item()
    return value


def native_defaults(form: str) -> ScalerConfig:
    """The config of the native scaler whose state dicts have ``form``, at its defaults.

    Example:
        >>> native_defaults("keras").init_scale
        32768.0
    """
    if form == "canonical":
        return ScalerConfig()
    defaults = FRAMEWORKS[form]["defaults"]
    return ScalerConfig(**{k: v for k, v in defaults.items() if k in CANONICAL})


def read_form(d: Any, config: ScalerConfig | None = None
              ) -> tuple[ScalerConfig, ScalerState, str]:
    """Validates a scaler state in any of :data:`STATE_FORMS`: ``(config, state, form)``.

    ``config`` gives the parameters the form does not carry (torch's ``init_scale``,
    Keras's whole config, jmp's hysteresis...); without it they are the defaults of
    that form's native scaler, except jmp's ``init_scale``, which is its current
    ``loss_scale`` (jmp keeps no initial scale).

    Raises:
        ValueError: Not a known form, or a field out of range; names the field.

    Example:
        >>> cfg, st, form = read_form({"dynamic_scale": 512.0, "step_counter": 2})
        >>> form, cfg.growth_interval, cfg.init_scale, st
        ('keras', 2000, 32768.0, ScalerState(scale=512.0, growth_tracker=2, hysteresis_tracker=0))
    """
    form = detect_form(d)
    if form in ("canonical", "torch", "paddle"):
        flat = dict(d)
        if form != "canonical":
            flat["scale"] = state_number(d, "scale")
            for key in ("_growth_tracker", "incr_count", "decr_count"):
                if key in flat:
                    flat[key] = state_number(d, key)
        cfg, state = parse_state_dict(flat, base=config or native_defaults(form))
        return cfg, state, form
    if form == "keras":
        base = config or native_defaults("keras")
        hyst = state_number(d, "hysteresis_counter") if "hysteresis_counter" in d else 0
        steps = state_number(d, "step_counter")
        # Keras's variables carry no config: a counter at or past the bound of the assumed
        # one (Keras's own defaults) says the assumption is wrong.
        for name, value, bound in (("step_counter", steps, "growth_interval"),
                                   ("hysteresis_counter", hyst, "hysteresis")):
            if config is None and type(value) is int and 0 < getattr(base, bound) <= value:
                raise ValueError(
                    f"Invalid scaler state_dict: {name}={value} needs a config with {bound} "
                    f"> {value}, and Keras's variables carry no config: pass config= (the "
                    "optimizer's scaler_config); nothing was loaded")
        cfg, state = parse_state_dict(to_state_dict(base, ScalerState(0.0), "keras")
                                      | {"scale": state_number(d, "dynamic_scale"),
                                         "growth_tracker": steps, "hysteresis_tracker": hyst})
        return cfg, state, form
    if form == "flax":
        return (*_read_flax(d, config), form)
    missing = [k for k in _JMP_KEYS if k not in d]
    if missing:
        raise ValueError(f"Invalid scaler state_dict: the jmp form is missing {missing} "
                         f"(jmp.DynamicLossScale has {list(_JMP_KEYS)}); nothing was loaded")
    factor, floor = state_number(d, "factor"), state_number(d, "min_loss_scale")
    scale = state_number(d, "loss_scale")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
               for v in (factor, floor, scale)):
        raise ValueError(f"Invalid scaler state_dict: loss_scale, factor and min_loss_scale "
                         f"must be finite numbers, got {scale!r}, {factor!r}, {floor!r}; "
                         "nothing was loaded")
    if factor <= 0:
        raise ValueError(f"Invalid scaler state_dict: jmp's factor must be > 0, got "
                         f"factor={factor!r}; nothing was loaded")
    base = config or ScalerConfig(scale if scale > 0 else 1.0)
    raw = base.to_dict() | {"growth_factor": float(factor), "backoff_factor": 1.0 / factor,
                            "growth_interval": state_number(d, "period"),
                            # jmp's 0 is "no floor" (jnp.maximum(0, scale / f))
                            "min_scale": float(floor) if floor > 0 else None}
    canonical = to_state_dict(base, ScalerState(0.0), "jax") | {
        "config": raw, "scale": scale, "growth_tracker": state_number(d, "counter"),
        "hysteresis_tracker": 0}
    cfg, state = parse_state_dict(canonical)
    return cfg, state, form


#: The natives' table key of Flax's scaler.
FLAX_SCALER = "flax.training.dynamic_scale.DynamicScale"
#: DynamicScale's config fields -> canonical names (a dict of all its fields carries them):
#: its names but ``scale``, which is its state (and stands for ``init_scale``).
FLAX_FIELDS = {native: canonical for native, canonical in
               NATIVE_SCALERS[FLAX_SCALER]["names"].items() if native != "scale"}


def flax_defaults(scale: Any, **fields: Any) -> ScalerConfig:
    """The config whose spec trajectory is that of ``DynamicScale(**fields)`` (its defaults
    for the fields not given) now at ``scale``.

    Flax grows when ``fin_steps == growth_interval``, on the (growth_interval + 1)-th finite
    step in a row: the spec's ``growth_interval`` is one more. It clamps a growth past
    float32's largest number to it: ``max_scale`` is that number. ``minimum_scale`` is
    ``min_scale`` (its default 2**-126, ``jnp.finfo(jnp.float32).tiny``; None is no floor),
    and the current scale stands for ``init_scale`` (Flax keeps no initial one; its default
    65536 where ``scale`` is none).

    Raises:
        ValueError: A field ``DynamicScale`` does not have, or a value no config holds.

    Example:
        >>> cfg = flax_defaults(512.0)
        >>> cfg.init_scale, cfg.growth_interval, cfg.min_scale == 2.0**-126, cfg.max_scale
        (512.0, 2001, True, 3.4028234663852886e+38)
        >>> flax_defaults(8.0, growth_interval=3, minimum_scale=None).growth_interval
        4
    """
    defaults = NATIVE_SCALERS[FLAX_SCALER]["versions"]["0"]["defaults"]
    unknown = sorted(set(fields) - set(FLAX_FIELDS))
    if unknown:
        raise ValueError(f"DynamicScale has no field {unknown}: its config fields are "
                         f"{list(FLAX_FIELDS)}")
    values = {**{native: defaults[native] for native in FLAX_FIELDS}, **fields}
    interval, floor = values["growth_interval"], values["minimum_scale"]
    if not isinstance(interval, numbers.Integral) or isinstance(interval, bool) or interval < 0:
        raise _state_error(f"DynamicScale's growth_interval must be an int >= 0, got "
                           f"{interval!r}")
    usable = is_real(scale) and math.isfinite(float(scale)) and 0 < float(scale)
    try:
        return ScalerConfig(float(scale) if usable else defaults["scale"],
                            values["growth_factor"], values["backoff_factor"], int(interval) + 1,
                            min_scale=None if floor is None else float(floor),
                            max_scale=FLOAT32_MAX)
    except (TypeError, ValueError) as exc:
        raise _state_error(str(exc)) from None


def _read_flax(d: Mapping[str, Any], config: ScalerConfig | None
               ) -> tuple[ScalerConfig, ScalerState]:
    """Flax's ``DynamicScale`` state: ``fin_steps`` is the growth tracker as it is (the same
    count of finite steps in a row, :func:`flax_defaults` makes the interval one more); the
    config is ``config``, else DynamicScale's defaults, and a dict of every field
    (``dataclasses.asdict``) gives its own."""
    scale = state_number(d, "scale")
    given = {native: state_number(d, native) for native in FLAX_FIELDS if native in d}
    if config is None or given:
        own = flax_defaults(scale, **given)
        config = own if config is None else config.replace(
            **{FLAX_FIELDS[native]: getattr(own, FLAX_FIELDS[native]) for native in given})
    cfg, state = parse_state_dict(to_state_dict(config, ScalerState(0.0), "jax") | {
        "scale": scale, "growth_tracker": state_number(d, "fin_steps"), "hysteresis_tracker": 0})
    if state.growth_tracker >= cfg.growth_interval:
        # Flax grows only when fin_steps == growth_interval - 1 here: from past it, never
        # until an overflow; the spec would grow on the next finite step.
        raise ValueError(
            f"Invalid scaler state_dict: fin_steps={state.growth_tracker} is past DynamicScale's "
            f"growth_interval={cfg.growth_interval - 1}: Flax's DynamicScale never grows from "
            "it until an overflow, unifiedamp would on the next finite step; pass the config "
            "it was saved with (config=, CLI: --config), or set fin_steps to 0 to restart the "
            "count; nothing was loaded")
    return cfg, state


def form_cannot_carry(config: ScalerConfig, form: str) -> list[str]:
    """What of ``config`` the state dicts of ``form`` cannot carry (empty: all of it).

    Example:
        >>> form_cannot_carry(ScalerConfig(hysteresis=2), "torch")
        ['hysteresis=2']
        >>> form_cannot_carry(ScalerConfig(hysteresis=2), "paddle")
        []
    """
    if not config.enabled:
        # torch and paddle save {} for a disabled scaler, which nothing can load.
        return ["enabled=False (a disabled scaler has no native state)"]
    native = STATE_FORMS[form]["carries"]
    return [] if native is None else cannot_carry(config, native)


def write_form(config: ScalerConfig, state: ScalerState, form: str) -> dict[str, Any]:
    """The state dict of ``form`` holding ``config`` and ``state``, as the native scaler
    writes it (the backends' ``native_state_dict()`` and porting write this).

    Raises:
        ValueError: ``form`` cannot carry ``config`` (:func:`form_cannot_carry`); names what.

    Example:
        >>> write_form(ScalerConfig(growth_interval=100), ScalerState(1024.0, 7, 0), "jmp")
        {'loss_scale': 1024.0, 'counter': 7, 'period': 100, 'factor': 2.0, 'min_loss_scale': 0.0}
    """
    lost = form_cannot_carry(config, form)
    if lost:
        backend = STATE_FORMS[form]["backend"]
        raise ValueError(
            f"the {form} form cannot carry {', '.join(lost)}: loading it would run another "
            f"rule. Convert with to='canonical' (every unifiedamp backend loads it, "
            f"ua.GradScaler(..., backend='{backend}') included); nothing was written")
    return native_dict(config, state, form)


def native_dict(config: ScalerConfig, state: ScalerState, form: str) -> dict[str, Any]:
    """The keys of ``form``'s state dict for ``config`` and ``state``, unchecked: the caller
    knows the form carries the config (:func:`write_form` checks first).

    Example:
        >>> native_dict(ScalerConfig(), ScalerState(1024.0, 7, 0), "keras")
        {'dynamic_scale': 1024.0, 'step_counter': 7, 'hysteresis_counter': 0}
    """
    s, c = state, config
    if form == "torch":
        # The factors rounded to float32: torch's kernel multiplies by the factor it
        # holds, and the float32 one gives the spec's bits.
        return {"scale": s.scale, "growth_factor": f32(c.growth_factor),
                "backoff_factor": f32(c.backoff_factor), "growth_interval": c.growth_interval,
                "_growth_tracker": s.growth_tracker}
    if form == "paddle":
        import numpy as np

        # paddle's load reads state_dict["scale"][0].
        return {"scale": np.array([s.scale], np.float32), "incr_ratio": c.growth_factor,
                "decr_ratio": c.backoff_factor, "incr_every_n_steps": c.growth_interval,
                "decr_every_n_nan_or_inf": c.hysteresis, "incr_count": s.growth_tracker,
                "decr_count": s.hysteresis_tracker, "use_dynamic_loss_scaling": c.dynamic}
    if form == "keras":
        return {"dynamic_scale": s.scale, "step_counter": s.growth_tracker,
                "hysteresis_counter": s.hysteresis_tracker}
    if form == "flax":
        import numpy as np

        # The arrays a Flax checkpoint restores (float32 scale, int32 fin_steps): a
        # DynamicScale restored from them multiplies in float32 from its first update.
        return {"fin_steps": np.asarray(s.growth_tracker, np.int32),
                "scale": np.asarray(s.scale, np.float32)}
    if form == "jmp":
        # min_loss_scale 0.0 is "no floor" (its default 1.0 would add one).
        return {"loss_scale": s.scale, "counter": s.growth_tracker, "period": c.growth_interval,
                "factor": c.growth_factor, "min_loss_scale": c.min_scale or 0.0}
    raise ValueError(f"no native form {form!r}: one of {tuple(STATE_FORMS)[1:]}")
