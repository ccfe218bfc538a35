"""A scaler's *state* in five forms, each the dict a framework's checkpoint holds.

- ``"canonical"``: unifiedamp's ``state_dict()`` (config, scale, both trackers);
- ``"torch"``: ``torch.amp.GradScaler.state_dict()`` (``scale``, the factors,
  ``growth_interval``, ``_growth_tracker``);
- ``"paddle"``: ``paddle.amp.GradScaler.state_dict()`` (``scale`` as a 1-element
  float32 array, ``incr_count``, ``decr_count``...);
- ``"keras"``: a Keras ``LossScaleOptimizer``'s variables ``dynamic_scale``,
  ``step_counter`` (and unifiedamp's ``hysteresis_counter``): the state only, the
  config is the optimizer's constructor's;
- ``"jmp"``: the fields of ``jmp.DynamicLossScale`` (``loss_scale``, ``counter``,
  ``period``, ``factor``, ``min_loss_scale``), as a JAX checkpoint stores them.

:func:`detect_form` tells them apart by their keys; :func:`read_state` validates one through
:func:`unifiedamp.spec.parse_state_dict`, so every form is held to the same rules;
:func:`convert_state` writes another, and nothing is dropped silently: a form that cannot
carry the config raises and names what would be lost. How each native form is read and
written is here, in ``read_state`` and ``_write`` (and what each can carry, in ``_lost``);
a ``.keras`` model's optimizer variables are read and assigned by the child process in
``_checkpoints``.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from typing import Any

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState, f32

__all__ = ["FORMS", "convert_state", "detect_form", "read_state"]

#: The forms :func:`convert_state` reads and writes.
FORMS = ("canonical", "torch", "paddle", "keras", "jmp")

# The backend a canonical dict written from a native form names.
_BACKEND_OF = {"torch": "torch", "paddle": "paddle", "keras": "keras", "jmp": "jax"}

_KERAS_KEYS = ("dynamic_scale", "step_counter")
_JMP_KEYS = ("loss_scale", "counter", "period", "factor", "min_loss_scale")


def _closest(value: Any, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(value), choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def detect_form(d: Any) -> str:
    """Which of :data:`FORMS` a dict is, from its keys.

    Example:
        >>> detect_form({"scale": 1024.0, "_growth_tracker": 3, "growth_factor": 2.0,
        ...              "backoff_factor": 0.5, "growth_interval": 100})
        'torch'
        >>> detect_form({"dynamic_scale": 1024.0, "step_counter": 3})
        'keras'
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"a scaler state must be a dict, got {type(d).__name__}")
    if "format" in d:
        return "canonical"
    if "_growth_tracker" in d:
        return "torch"
    if "incr_count" in d or "decr_count" in d:
        return "paddle"
    if all(k in d for k in _KERAS_KEYS):
        return "keras"
    if "loss_scale" in d and "counter" in d:
        return "jmp"
    raise ValueError(
        f"not a scaler state: keys {sorted(map(str, d))} match none of the forms {FORMS} "
        "(canonical has 'format'; torch '_growth_tracker'; paddle 'incr_count'; keras "
        "'dynamic_scale' and 'step_counter'; jmp 'loss_scale' and 'counter'); pass the "
        "scaler's own entry (key=) if this is a whole checkpoint")


def _number(d: Mapping[str, Any], key: str) -> Any:
    # Files give back 0-d or 1-element arrays and tensors where the framework held a
    # variable (Keras, jmp, msgpack, npz), and JSON gives lists for Paddle's [scale].
    if key not in d:
        raise ValueError(f"Invalid scaler state_dict: the {detect_form(d)} form needs {key!r}, "
                         f"and this dict has only {sorted(map(str, d))}; nothing was loaded")
    value = d[key]
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if hasattr(value, "item") and not isinstance(value, numbers.Number):
        size = value.numel() if hasattr(value, "numel") else getattr(value, "size", None)
        if size == 1:
            value = value.item()
    return value


def _parse(canonical_like: dict[str, Any]) -> tuple[ScalerConfig, ScalerState]:
    return spec.parse_state_dict(canonical_like)


def read_state(d: Any, config: ScalerConfig | None = None
               ) -> tuple[ScalerConfig, ScalerState, str]:
    """Validates a scaler state in any of :data:`FORMS`: ``(config, state, form)``.

    ``config`` gives the parameters the form does not carry (torch's ``init_scale``,
    Keras's whole config, jmp's hysteresis...); without it they are the defaults of
    that form's native scaler (:data:`unifiedamp.spec.FRAMEWORKS`), except jmp's
    ``init_scale``, which is its current ``loss_scale`` (jmp keeps no initial scale).

    Raises:
        ValueError: Not a known form, or a field out of range; names the field.

    Example:
        >>> cfg, st, form = read_state({"dynamic_scale": 512.0, "step_counter": 2})
        >>> form, cfg.growth_interval, cfg.init_scale, st
        ('keras', 2000, 32768.0, ScalerState(scale=512.0, growth_tracker=2, hysteresis_tracker=0))
    """
    form = detect_form(d)
    if form in ("canonical", "torch", "paddle"):
        flat = dict(d)
        if form != "canonical":
            flat["scale"] = _number(d, "scale")
            for key in ("_growth_tracker", "incr_count", "decr_count"):
                if key in flat:
                    flat[key] = _number(d, key)
        base = config or _native_defaults(form)
        cfg, state = spec.parse_state_dict(flat, base=base)
        return cfg, state, form
    if form == "keras":
        base = config or _native_defaults("keras")
        hyst = _number(d, "hysteresis_counter") if "hysteresis_counter" in d else 0
        cfg, state = _parse(spec.to_state_dict(base, ScalerState(0.0), "keras")
                            | {"scale": _number(d, "dynamic_scale"),
                               "growth_tracker": _number(d, "step_counter"),
                               "hysteresis_tracker": hyst})
        if state.hysteresis_tracker and state.hysteresis_tracker >= cfg.hysteresis:
            raise ValueError(
                f"Invalid scaler state_dict: hysteresis_counter={state.hysteresis_tracker} "
                f"needs a config with hysteresis > {state.hysteresis_tracker}, and Keras's "
                "variables carry no config: pass config= (the optimizer's scaler_config); "
                "nothing was loaded")
        return cfg, state, form
    missing = [k for k in _JMP_KEYS if k not in d]
    if missing:
        raise ValueError(f"Invalid scaler state_dict: the jmp form is missing {missing} "
                         f"(jmp.DynamicLossScale has {list(_JMP_KEYS)}); nothing was loaded")
    factor, floor = _number(d, "factor"), _number(d, "min_loss_scale")
    scale = _number(d, "loss_scale")
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
                            "growth_interval": _number(d, "period"),
                            # jmp's 0 is "no floor" (jnp.maximum(0, scale / f))
                            "min_scale": float(floor) if floor > 0 else None}
    canonical = spec.to_state_dict(base, ScalerState(0.0), "jax") | {
        "config": raw, "scale": scale, "growth_tracker": _number(d, "counter"),
        "hysteresis_tracker": 0}
    cfg, state = _parse(canonical)
    return cfg, state, form


def _native_defaults(form: str) -> ScalerConfig:
    if form == "canonical":
        return ScalerConfig()
    defaults = spec.FRAMEWORKS[form]["defaults"]
    return ScalerConfig(**{k: v for k, v in defaults.items() if k in spec.CANONICAL})


def _lost(config: ScalerConfig, to: str) -> list[str]:
    """What the ``to`` form cannot carry of ``config`` (empty: it carries everything)."""
    c = config
    if not c.enabled:
        # torch and paddle save {} for a disabled scaler, which nothing can load.
        return ["enabled=False (a disabled scaler has no native state)"]
    checks = {
        "torch": [("growth_factor", c.growth_factor > 1.0),
                  ("backoff_factor", c.backoff_factor < 1.0),
                  ("hysteresis", c.hysteresis == 1), ("min_scale", c.min_scale is None),
                  ("max_scale", c.max_scale is None), ("dynamic", c.dynamic)],
        "paddle": [("growth_factor", c.growth_factor > 1.0),
                   ("backoff_factor", c.backoff_factor < 1.0),
                   ("min_scale", c.min_scale is None), ("max_scale", c.max_scale is None)],
        # jmp backs off by its one factor: backoff must be 1 / growth in float32.
        "jmp": [("backoff_factor", f32(c.backoff_factor) == f32(1.0 / c.growth_factor)),
                ("hysteresis", c.hysteresis == 1), ("max_scale", c.max_scale is None),
                ("dynamic", c.dynamic)],
        "keras": [],  # the variables carry no config at all: the optimizer's constructor does
    }[to]
    return [f"{name}={getattr(c, name)!r}" for name, ok in checks if not ok]


def _write(config: ScalerConfig, state: ScalerState, to: str, backend: str) -> dict[str, Any]:
    if to == "canonical":
        return spec.to_state_dict(config, state, backend)
    lost = _lost(config, to)
    if lost:
        raise ValueError(
            f"the {to} form cannot carry {', '.join(lost)}: loading it would run another "
            f"rule. Convert with to='canonical' (every unifiedamp backend loads it, "
            f"ua.GradScaler(..., backend='{_BACKEND_OF[to]}') included); nothing was written")
    s, c = state, config
    if to == "torch":
        # The factors rounded to float32, as TorchGradScaler.native_state_dict(): torch's
        # kernel multiplies by the factor it holds, and the float32 one gives the spec's bits.
        return {"scale": s.scale, "growth_factor": f32(c.growth_factor),
                "backoff_factor": f32(c.backoff_factor), "growth_interval": c.growth_interval,
                "_growth_tracker": s.growth_tracker}
    if to == "paddle":
        import numpy as np

        # As PaddleGradScaler.native_state_dict(); paddle's load reads state_dict["scale"][0].
        return {"scale": np.array([s.scale], np.float32), "incr_ratio": c.growth_factor,
                "decr_ratio": c.backoff_factor, "incr_every_n_steps": c.growth_interval,
                "decr_every_n_nan_or_inf": c.hysteresis, "incr_count": s.growth_tracker,
                "decr_count": s.hysteresis_tracker, "use_dynamic_loss_scaling": c.dynamic}
    if to == "keras":
        return {"dynamic_scale": s.scale, "step_counter": s.growth_tracker,
                "hysteresis_counter": s.hysteresis_tracker}
    # jmp: min_loss_scale 0.0 is "no floor" (its default 1.0 would add one).
    return {"loss_scale": s.scale, "counter": s.growth_tracker, "period": c.growth_interval,
            "factor": c.growth_factor, "min_loss_scale": c.min_scale or 0.0}


def convert_state(state: Any, to: str, config: ScalerConfig | None = None) -> dict[str, Any]:
    """A scaler state in any of :data:`FORMS`, in the form ``to``.

    The scale stays the same float32 value and the trackers the same ints. A form
    that cannot carry the config (torch's has no hysteresis, min/max scale or static
    mode; Paddle's no min/max scale; jmp's no hysteresis or max scale) raises,
    naming what would be lost; ``to="canonical"`` carries everything. The Keras form
    is the optimizer's variables only: build the optimizer with the config
    (``ua.GradScaler(**config, backend="keras").wrap(opt)``) and assign them.

    Args:
        state: A canonical, torch, paddle, keras or jmp state dict.
        to: One of :data:`FORMS`.
        config: The parameters the input form does not carry (see :func:`read_state`).

    Raises:
        ValueError: An unknown ``to``, an invalid ``state``, or a config ``to`` cannot
            carry. Nothing is modified.

    Example:
        >>> torch_sd = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
        ...             "growth_interval": 100, "_growth_tracker": 7}
        >>> jmp_sd = convert_state(torch_sd, "jmp")
        >>> jmp_sd
        {'loss_scale': 1024.0, 'counter': 7, 'period': 100, 'factor': 2.0, 'min_loss_scale': 0.0}
        >>> convert_state(jmp_sd, "torch") == torch_sd
        True
        >>> canonical = convert_state(torch_sd, "canonical", ScalerConfig(1024.0, hysteresis=2))
        >>> convert_state(canonical, "torch")
        Traceback (most recent call last):
        ...
        ValueError: the torch form cannot carry hysteresis=2: loading it would run another rule. ...
    """
    if to not in FORMS:
        raise ValueError(f"to must be one of {FORMS}, got {to!r}{_closest(to, FORMS)}")
    if config is not None and not isinstance(config, ScalerConfig):
        raise TypeError(f"config must be a ScalerConfig or None, got {type(config).__name__}: "
                        "ScalerConfig(**d) builds one from a dict")
    cfg, st, form = read_state(state, config)
    backend = state.get("backend", "unifiedamp") if form == "canonical" else _BACKEND_OF[form]
    return _write(cfg, st, to, str(backend))
