"""A scaler's *state* in six forms, each the dict a framework's checkpoint holds.

- ``"canonical"``: unifiedamp's ``state_dict()`` (config, scale, both trackers);
- ``"torch"``: ``torch.amp.GradScaler.state_dict()`` (``scale``, the factors,
  ``growth_interval``, ``_growth_tracker``);
- ``"paddle"``: ``paddle.amp.GradScaler.state_dict()`` (``scale`` as a 1-element
  float32 array, ``incr_count``, ``decr_count``...);
- ``"keras"``: a Keras ``LossScaleOptimizer``'s variables ``dynamic_scale``,
  ``step_counter`` (and unifiedamp's ``hysteresis_counter``): the state only, the
  config is the optimizer's constructor's;
- ``"jmp"``: the fields of ``jmp.DynamicLossScale`` (``loss_scale``, ``counter``,
  ``period``, ``factor``, ``min_loss_scale``), as a JAX checkpoint stores them;
- ``"flax"``: the pytree leaves of Flax's ``DynamicScale`` (``scale``, ``fin_steps``),
  ``flax.serialization.to_state_dict(dynamic_scale)``: the state only, the config is the
  ``DynamicScale``'s fields (its defaults unless given; a dict of every field carries
  them). ``fin_steps`` is the growth tracker; Flax grows one finite step later than the
  spec with the same ``growth_interval``, so its config reads as ``growth_interval + 1``
  with ``max_scale`` float32's maximum (its clamp), the spec's config with its trajectory
  (``unifiedamp.porting._flax``).

:func:`detect_form` tells them apart by their keys; :func:`read_state` validates one through
:func:`unifiedamp.spec.parse_state_dict`, so every form is held to the same rules;
:func:`convert_state` writes another, and nothing is dropped silently: a form that cannot
carry the config raises and names what would be lost. How each form is read and written,
and what it can carry, is the spec's (``unifiedamp.spec.STATE_FORMS`` and the native
scalers' table); a ``.keras`` model's optimizer variables are read and assigned in
``_keras_files``.
"""

from __future__ import annotations

import difflib
from typing import Any

from unifiedamp import spec
from unifiedamp.spec import STATE_FORMS, ScalerConfig
from unifiedamp.spec._state_dict import detect_form, read_form, write_form

__all__ = ["FORMS", "convert_state", "detect_form", "read_state"]

#: The forms :func:`convert_state` reads and writes (:data:`unifiedamp.spec.STATE_FORMS`).
FORMS = tuple(STATE_FORMS)


def _closest(value: Any, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(value), choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: Validates a scaler state in any of :data:`FORMS`: ``(config, state, form)``; the
#: parameters a form does not carry come from ``config`` or its native scaler's defaults.
read_state = read_form


def convert_state(state: Any, to: str, config: ScalerConfig | None = None) -> dict[str, Any]:
    """A scaler state in any of :data:`FORMS`, in the form ``to``.

    The scale stays the same float32 value and the trackers the same ints. A form
    that cannot carry the config (torch's has no hysteresis, min/max scale or static
    mode; Paddle's no min/max scale; jmp's no hysteresis or max scale) raises,
    naming what would be lost; ``to="canonical"`` carries everything. The Keras form
    is the optimizer's variables only: build the optimizer with the config
    (``ua.GradScaler(**config, backend="keras").wrap(opt)``) and assign them.

    Args:
        state: A canonical, torch, paddle, keras, jmp or flax state dict.
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
    cfg, st, form = read_form(state, config)
    if to != "canonical":
        return write_form(cfg, st, to)
    backend = state.get("backend", "unifiedamp") if form == "canonical" else \
        STATE_FORMS[form]["backend"]
    return spec.to_state_dict(cfg, st, str(backend))
