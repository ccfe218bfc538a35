"""Flax's ``flax.training.dynamic_scale.DynamicScale``: its state in and out of unifiedamp.

``DynamicScale`` is a ``flax.struct`` dataclass: its config is its constructor's fields
(``growth_factor``, ``backoff_factor``, ``growth_interval``, ``minimum_scale``) and its state
the two pytree leaves ``scale`` and ``fin_steps``, all a Flax checkpoint holds of it (the
spec's ``"flax"`` form). ``fin_steps`` counts the finite steps in a row, as the spec's
growth tracker does, and is carried as it is. Flax grows when ``fin_steps ==
growth_interval``, on the (growth_interval + 1)-th finite step in a row, and clamps a growth
past float32's maximum: the spec's config with the same trajectory has ``growth_interval``
one more and ``max_scale`` float32's maximum (:func:`unifiedamp.spec._state_dict.flax_defaults`),
which is what a state read from Flax gets, so a run resumed under unifiedamp continues Flax's
trajectory; :func:`flax_notes` says so wherever a state crosses over.

- :func:`dynamic_scale_kwargs`: the ``DynamicScale(...)`` arguments that hold a config;
- :func:`to_dynamic_scale`: a live ``DynamicScale`` holding a unifiedamp scaler's config and
  state (its checkpoints then resume under Flax);
- reading a live ``DynamicScale`` is :func:`unifiedamp.porting.from_native`'s;
- :func:`load_orbax` and :func:`save_orbax`: an Orbax checkpoint directory (a Flax train
  state's usual home), for :func:`unifiedamp.porting.port_state_file`.

No framework is imported at module import.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection, Mapping
from typing import Any

from unifiedamp.porting._limits import ReadLimits, check_tree
from unifiedamp.spec import ScalerConfig, ScalerState, parse_state_dict
from unifiedamp.spec._natives import cannot_carry
from unifiedamp.spec._state_dict import FLAX_FIELDS, flax_defaults, state_number
from unifiedamp.spec._state_dict import FLAX_SCALER as FLAX

__all__ = ["FLAX", "dynamic_scale_kwargs", "flax_config", "flax_notes", "is_orbax",
           "load_orbax", "save_orbax", "to_dynamic_scale"]


def dynamic_scale_kwargs(config: ScalerConfig) -> dict[str, Any]:
    """The ``DynamicScale`` keyword arguments whose trajectory is ``config``'s (its state aside).

    ``growth_interval`` is one less (Flax grows when ``fin_steps == growth_interval``, one
    finite step later than the spec), ``scale`` is ``init_scale`` (Flax keeps no other),
    ``minimum_scale=None`` is no floor. ``max_scale`` must be None or float32's maximum, to
    which Flax clamps a growth (with None the spec keeps the scale instead: a scale above
    1.7e38, past anything a loss is multiplied by).

    Raises:
        ValueError: ``DynamicScale`` cannot hold ``config`` (a hysteresis, a ceiling, a
            static or disabled scaler); names what, and what to use instead.

    Example:
        >>> dynamic_scale_kwargs(ScalerConfig(1024.0, growth_interval=100))
        {'growth_factor': 2.0, 'backoff_factor': 0.5, 'growth_interval': 99, 'scale': 1024.0, \
'minimum_scale': None}
        >>> dynamic_scale_kwargs(ScalerConfig(hysteresis=2))
        Traceback (most recent call last):
        ...
        ValueError: flax's DynamicScale cannot hold hysteresis=2: ...
    """
    lost = cannot_carry(config, FLAX)
    if lost:
        raise ValueError(f"flax's DynamicScale cannot hold {', '.join(lost)}: it has no "
                         "hysteresis, ceiling, static or disabled mode; keep unifiedamp's "
                         "scaler (ua.GradScaler(..., backend='jax')) for this config")
    return {"growth_factor": config.growth_factor, "backoff_factor": config.backoff_factor,
            "growth_interval": config.growth_interval - 1, "scale": config.init_scale,
            "minimum_scale": config.min_scale}


def to_dynamic_scale(scaler: Any) -> Any:
    """A ``flax.training.dynamic_scale.DynamicScale`` with a unifiedamp scaler's config and
    state (``scaler`` may also be a canonical ``state_dict``).

    ``scale`` is the current scale as a float32 array and ``fin_steps`` the growth tracker
    as an int32 array, the leaves a restored Flax checkpoint holds, and ``growth_interval``
    one less than the config's: Flax's rule then grows on the same steps as unifiedamp's.

    Raises:
        ValueError: The config is one ``DynamicScale`` cannot hold (:func:`dynamic_scale_kwargs`),
            or the scaler is inside a hysteresis count Flax has no place for.

    Example:
        >>> import unifiedamp as ua
        >>> scaler = ua.GradScaler(1024.0, growth_interval=3, backend="jax")
        >>> ds = to_dynamic_scale(scaler)
        >>> type(ds).__name__, float(ds.scale), int(ds.fin_steps), ds.growth_interval
        ('DynamicScale', 1024.0, 0, 2)
    """
    import numpy as np
    from flax.training.dynamic_scale import DynamicScale

    state_dict = scaler if isinstance(scaler, dict) else scaler.state_dict()
    config, state = parse_state_dict(state_dict)
    kwargs = dynamic_scale_kwargs(config)
    if state.hysteresis_tracker:
        raise ValueError(f"the scaler counts {state.hysteresis_tracker} non-finite step(s) "
                         "toward a backoff (hysteresis_tracker), which DynamicScale has no "
                         "place for; convert after its next finite step")
    kwargs.update(scale=np.asarray(state.scale, np.float32),
                  fin_steps=np.asarray(state.growth_tracker, np.int32))
    return DynamicScale(**kwargs)


def flax_notes(config: ScalerConfig, state: ScalerState, source: str, target: str) -> list[str]:
    """What a state converted from (``source="flax"``) or to (``target="flax"``) Flax's form
    means for the run, and what to build (empty when neither is ``"flax"``).

    Example:
        >>> for note in flax_notes(ScalerConfig(growth_interval=4), ScalerState(8.0, 1, 0),
        ...                        "flax", "canonical"):
        ...     print(note)  # doctest: +ELLIPSIS
        growth_interval=4: DynamicScale(growth_interval=3) grows when fin_steps == 3, ...
    """
    if "flax" not in (source, target):
        return []
    n = config.growth_interval
    notes = [f"growth_interval={n}: DynamicScale(growth_interval={n - 1}) grows when "
             f"fin_steps == {n - 1}, at {n} finite steps in a row, as unifiedamp's "
             f"rule with growth_interval={n} does: both grow on the same steps; fin_steps is "
             "the growth tracker as it is"]
    if source == "flax":
        notes.append(f"max_scale={config.max_scale!r}: DynamicScale clamps a growth past "
                     "float32's maximum to it; min_scale is its minimum_scale (default 2**-126, "
                     "jnp.finfo(jnp.float32).tiny). The resumed run continues Flax's trajectory")
    else:
        notes.append(f"the flax form carries no config: restore the two leaves "
                     f"(flax.serialization.from_state_dict / from_bytes) into "
                     f"DynamicScale(**{dynamic_scale_kwargs(config)})")
        if config.max_scale is None:
            notes.append("DynamicScale clamps a growth past float32's maximum (3.4e38) to it, "
                         "where this config keeps the scale: the only difference, past any "
                         "scale a loss is multiplied by")
    return notes


def flax_config(state: Mapping[str, Any], config: ScalerConfig,
                fields: Collection[str]) -> ScalerConfig:
    """The config of a flax-form ``state`` from the ``fields`` of ``config`` the caller named
    (the CLI's ``--config``), read as ``DynamicScale``'s own: ``growth_interval`` is Flax's
    (the spec's is one more), ``min_scale`` its ``minimum_scale``; the fields not named are
    ``DynamicScale``'s defaults (a floor of 2**-126), not the canonical ones, and
    ``init_scale`` is the current scale.

    Example:
        >>> cfg = flax_config({"fin_steps": 1, "scale": 8.0}, ScalerConfig(growth_interval=3),
        ...                   ["growth_interval"])
        >>> cfg.init_scale, cfg.growth_interval, cfg.min_scale == 2.0**-126
        (8.0, 4, True)
    """
    native = {canonical: name for name, canonical in FLAX_FIELDS.items()}
    scale = state_number(state, "scale")
    base = flax_defaults(scale, **{native[name]: getattr(config, name)
                                   for name in fields if name in native})
    return base.replace(**{name: getattr(config, name) for name in fields if name not in native})


def is_orbax(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an Orbax checkpoint directory (it holds Orbax's metadata)."""
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, name)) for name in ("_CHECKPOINT_METADATA", "_METADATA"))


def load_orbax(path: str | os.PathLike, trusted: bool = False,
               limits: ReadLimits | None = None) -> Any:
    """The tree of an Orbax checkpoint directory (``PyTreeCheckpointer().restore``: arrays
    from its TensorStore files, the rest from its JSON metadata; no pickle). Without
    ``trusted`` the tree is held to ``limits`` (:class:`ReadLimits`).

    Raises:
        ValueError: orbax-checkpoint is not installed, or the directory cannot be read;
            names the path.
    """
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise ValueError(f"{path} is an Orbax checkpoint directory, and orbax-checkpoint is "
                         "not installed: pip install orbax-checkpoint; nothing was "
                         "read") from None
    try:
        with warnings.catch_warnings():
            # "Sharding info not provided": one process restores onto its default device.
            warnings.simplefilter("ignore", UserWarning)
            tree = ocp.PyTreeCheckpointer().restore(os.path.abspath(path))
    except Exception as exc:  # noqa: BLE001 - any reader failure on untrusted files
        detail = (str(exc).splitlines() or [""])[0][:300]
        raise ValueError(f"{path} cannot be read as an Orbax checkpoint ({type(exc).__name__}: "
                         f"{detail}): it is damaged or of another type; nothing was "
                         "read") from None
    if not trusted:
        check_tree(tree, ReadLimits() if limits is None else limits)
    return tree


def save_orbax(tree: Any, path: str | os.PathLike) -> None:
    """Writes ``tree`` as a new Orbax checkpoint directory. Orbax writes it under a temporary
    name and renames it when complete, so a failure leaves no partial checkpoint at
    ``path``; an existing ``path`` is refused (rewriting one would delete it first).
    """
    if os.path.exists(path):
        raise ValueError(f"{path} exists: an Orbax checkpoint is written to a new directory "
                         "(replacing one would delete it before the new one is whole); pass "
                         "-o with a new directory name; nothing was written")
    import orbax.checkpoint as ocp

    ocp.PyTreeCheckpointer().save(os.path.abspath(path), tree)
