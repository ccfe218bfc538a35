"""A live native scaler (torch, paddle, Keras, jmp, Flax) as the equivalent unifiedamp scaler.

:func:`from_native` reads the native object's config and state (its private attributes
where it has no public getter: one reader per framework, ``_read_torch`` ...) and builds
the backend's scaler with them. No framework is imported here: an object is recognised
through the framework modules already in ``sys.modules``, and the backend it builds is
imported then.
"""

from __future__ import annotations

import sys

from unifiedamp.porting._config import _scalar
from unifiedamp.spec import ScalerConfig, ScalerState, f32

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["from_native"]


def _module(name: str) -> Any:
    # A native object's framework is in sys.modules already: nothing is imported here.
    return sys.modules.get(name)


def from_native(obj: Any, backend: str | None = None, **options: Any) -> Any:
    """The unifiedamp scaler equivalent to a live native scaler, carrying its state.

    - ``torch.amp.GradScaler`` (and ``torch.cuda.amp``'s, FSDP's ``ShardedGradScaler``):
      a torch-backend scaler on the same device, with the scale and growth tracker.
    - ``paddle.amp.GradScaler`` / ``AmpScaler``: a paddle-backend scaler with the scale
      and both counters (``incr_count``, ``decr_count``). A paddle scaler that disabled
      itself (on a CPU place) gives a disabled scaler.
    - ``keras.optimizers.LossScaleOptimizer``: a :class:`~unifiedamp.backends.keras.KerasGradScaler`
      whose ``.optimizer`` is a new ``SpecLossScaleOptimizer`` wrapping the *same*
      ``inner_optimizer`` (its slots and iterations carry over), holding the scale and
      the step counter: use ``scaler.optimizer`` in place of ``obj``. An optimizer made
      by unifiedamp's ``wrap`` gives ``KerasGradScaler.of(obj)``.
    - ``jmp.DynamicLossScale`` / ``StaticLossScale`` / ``NoOpLossScale``: a jax-backend
      scaler; ``init_scale`` is the current ``loss_scale`` (jmp keeps no initial scale)
      and the growth tracker is ``counter``.
    - ``flax.training.dynamic_scale.DynamicScale``: a jax-backend scaler with its trajectory:
      its factors, ``growth_interval`` one more (Flax grows when ``fin_steps ==
      growth_interval``, one finite step later than the spec), ``max_scale`` float32's
      maximum (its clamp), ``minimum_scale`` as ``min_scale``, ``init_scale`` its current
      ``scale`` and the growth tracker ``fin_steps``. ``unifiedamp.porting.to_dynamic_scale``
      goes back.
    - a unifiedamp scaler: itself, or moved to ``backend``.

    Args:
        obj: The native scaler.
        backend: Another unifiedamp backend for the same config and state (moved
            through the canonical state dict; a keras backend scaler then has no
            optimizer yet: call ``wrap``).
        **options: Passed to the backend's constructor (``device=``...).

    Raises:
        TypeError: ``obj`` is none of the types above.

    Example:
        >>> from_native(object())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: from_native takes a torch.amp.GradScaler, ...
    """
    import unifiedamp as ua
    from unifiedamp import spec

    if isinstance(obj, ua.GradScaler):
        if backend is None or backend == obj.backend:
            return obj
        return _build(backend, obj.config, obj.state, options)
    read = _reader(obj)
    if read is None:
        raise TypeError(
            "from_native takes a torch.amp.GradScaler, torch.cuda.amp.GradScaler or "
            "ShardedGradScaler, a paddle.amp.GradScaler or AmpScaler, a "
            "keras.optimizers.LossScaleOptimizer, a jmp DynamicLossScale, StaticLossScale or "
            "NoOpLossScale, a flax DynamicScale, or a unifiedamp GradScaler; got "
            f"{type(obj).__module__}."
            f"{type(obj).__qualname__}")
    native_backend, config, state, extra = read(obj)
    if native_backend == "keras" and backend in (None, "keras"):
        from unifiedamp.backends.keras import KerasGradScaler, SpecLossScaleOptimizer

        if isinstance(obj, SpecLossScaleOptimizer):
            return KerasGradScaler.of(obj)
        scaler = KerasGradScaler(**config.to_dict())
        scaler.load_state_dict(spec.to_state_dict(config, state, "keras"))
        scaler.wrap(obj.inner_optimizer)
        return scaler
    # The native's own options (its device) mean nothing to another backend.
    own = backend in (None, native_backend)
    return _build(backend or native_backend, config, state, {**(extra if own else {}), **options})


def _build(backend: str, config: ScalerConfig, state: ScalerState,
           options: dict[str, Any]) -> Any:
    import unifiedamp as ua
    from unifiedamp import spec

    scaler = ua.GradScaler(**config.to_dict(), backend=backend, **options)
    saved = spec.to_state_dict(config, state, backend)
    from unifiedamp.backends._functional import FunctionalGradScaler

    if isinstance(scaler, FunctionalGradScaler):
        return scaler.restore(saved)  # an immutable value: restore returns the loaded one
    scaler.load_state_dict(saved)
    return scaler


def _reader(obj: Any) -> Any:
    torch, paddle, keras, jmp = (_module(m) for m in ("torch", "paddle", "keras", "jmp"))
    if torch is not None and isinstance(obj, torch.amp.GradScaler):
        return _read_torch
    if paddle is not None and isinstance(obj, paddle.amp.AmpScaler):
        return _read_paddle
    if keras is not None and isinstance(obj, keras.optimizers.LossScaleOptimizer):
        return _read_keras
    if jmp is not None and isinstance(obj, (jmp.DynamicLossScale, jmp.StaticLossScale,
                                            jmp.NoOpLossScale)):
        return _read_jmp
    flax = _module("flax.training.dynamic_scale")
    if flax is not None and isinstance(obj, flax.DynamicScale):
        return _read_flax
    return None


def _read_flax(obj: Any) -> tuple[str, ScalerConfig, ScalerState, dict[str, Any]]:
    # Its pytree leaves (scale, fin_steps) are the flax form's; its fields the config.
    from unifiedamp.spec._state_dict import FLAX_FIELDS, read_form

    fields = {name: getattr(obj, name) for name in FLAX_FIELDS}
    config, state, _ = read_form({"fin_steps": _scalar(obj.fin_steps),
                                  "scale": float(_scalar(obj.scale)), **fields})
    return "jax", config, state, {}


def _read_torch(obj: Any) -> tuple[str, ScalerConfig, ScalerState, dict[str, Any]]:
    # torch 2.13 sets none of its attributes on a disabled scaler (e.g. device 'cuda'
    # without CUDA): there is nothing to carry but "disabled".
    if not obj.is_enabled():
        return "torch", ScalerConfig(enabled=False), ScalerState(65536.0, 0, 0), {}
    scale = obj._scale  # None until the first scale(): the device is then torch's _device
    device = str(scale.device) if scale is not None else obj._device
    config = ScalerConfig(obj._init_scale, obj.get_growth_factor(), obj.get_backoff_factor(),
                          obj.get_growth_interval())
    state = ScalerState(f32(obj.get_scale()), int(obj._get_growth_tracker()), 0)
    extra: dict[str, Any] = {"device": device}
    group = getattr(obj, "process_group", None)  # ShardedGradScaler's
    if group is not None and _module("torch").distributed.is_initialized():
        extra["process_group"] = group
    return "torch", config, state, extra


def _read_paddle(obj: Any) -> tuple[str, ScalerConfig, ScalerState, dict[str, Any]]:
    if not obj.is_enable():
        return "paddle", ScalerConfig(enabled=False), ScalerState(65536.0, 0, 0), {}
    config = ScalerConfig(obj._init_loss_scaling, obj._incr_ratio, obj._decr_ratio,
                          obj._incr_every_n_steps, hysteresis=obj._decr_every_n_nan_or_inf,
                          dynamic=bool(obj._use_dynamic_loss_scaling))
    state = ScalerState(f32(float(obj._scale.numpy().reshape(-1)[0])), int(obj._incr_count),
                        int(obj._decr_count))
    return "paddle", config, state, {}


def _read_keras(obj: Any) -> tuple[str, ScalerConfig, ScalerState, dict[str, Any]]:
    from keras import ops

    config = ScalerConfig(float(obj.initial_scale), 2.0, 0.5, int(obj.dynamic_growth_steps))
    if not obj.built:
        return "keras", config, ScalerState.initial(config), {}
    state = ScalerState(float(ops.convert_to_numpy(obj.dynamic_scale)),  # pyright: ignore[reportArgumentType]
                        int(ops.convert_to_numpy(obj.step_counter)), 0)  # pyright: ignore[reportArgumentType]
    return "keras", config, state, {}


def _read_jmp(obj: Any) -> tuple[str, ScalerConfig, ScalerState, dict[str, Any]]:
    jmp = _module("jmp")
    if isinstance(obj, jmp.NoOpLossScale):
        return "jax", ScalerConfig(enabled=False), ScalerState(65536.0, 0, 0), {}
    scale = f32(float(_scalar(obj.loss_scale)))
    if isinstance(obj, jmp.StaticLossScale):
        return "jax", ScalerConfig(scale, dynamic=False), ScalerState(scale, 0, 0), {}
    factor = float(_scalar(obj.factor))
    floor = float(_scalar(obj.min_loss_scale))
    config = ScalerConfig(scale, factor, 1.0 / factor, int(obj.period),
                          min_scale=floor if floor > 0 else None)
    return "jax", config, ScalerState(scale, int(_scalar(obj.counter)), 0), {}
