"""The ``GradScaler`` facade: one constructor that returns the right backend's scaler."""

from __future__ import annotations

import abc
from typing import Any

from unifiedamp import _registry
from unifiedamp.spec import ScalerConfig, ScalerState


class NoInfChecksError(RuntimeError, AssertionError):
    """``update()``/``step()`` found no inf check to act on.

    torch raises an AssertionError here; this is also a RuntimeError, like the
    other call-order errors, so either except clause catches it.
    """


class _FacadeMeta(abc.ABCMeta):
    # Dispatch in the metaclass, not in __new__: a __new__ that returns a
    # GradScaler subclass would have Python call its __init__ a second time.
    def __call__(cls, *args: Any, backend: Any = None, **kwargs: Any) -> Any:
        if cls is not GradScaler:
            if backend is not None:
                raise TypeError(
                    f"{cls.__name__} is the {getattr(cls, 'backend', '?')!r} backend already; "
                    "backend= goes to unifiedamp.GradScaler"
                )
            return super().__call__(*args, **kwargs)
        name = backend if isinstance(backend, str) else _registry.detect(backend)
        return _registry.load(name)(*args, **kwargs)


class GradScaler(metaclass=_FacadeMeta):
    """A dynamic loss scaler for mixed-precision training, for any framework.

    ``GradScaler(init_scale, growth_factor, backoff_factor, growth_interval,
    enabled, *, hysteresis, min_scale, max_scale, dynamic, backend)`` returns
    the scaler of one backend, configured by :class:`unifiedamp.spec.ScalerConfig`
    (aliases such as ``initScale`` or ``init_loss_scaling`` are accepted).

    ``backend`` is a name (``"numpy"``...), a ``"module:Class"`` string, an
    object of the framework (optimizer, tensor, model) whose type decides, or
    ``None``: the one framework imported decides, NumPy if none is.

    Every backend's scaler is an instance of this class and offers
    ``get_scale()``, ``is_enabled()``, ``config``, ``state_dict()`` and
    ``load_state_dict()``; the other verbs depend on the backend's style
    (imperative, torch-like; or functional).

    Example:
        >>> import unifiedamp as ua
        >>> scaler = ua.GradScaler(1024.0, growth_interval=100, backend="numpy")
        >>> isinstance(scaler, ua.GradScaler), scaler.get_scale()
        (True, 1024.0)
    """

    backend: str = ""

    @property
    @abc.abstractmethod
    def config(self) -> ScalerConfig:
        """The validated configuration."""

    @property
    @abc.abstractmethod
    def state(self) -> ScalerState:
        """The scale and both trackers, as Python numbers."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The canonical, JSON-serialisable state (see :func:`unifiedamp.spec.to_state_dict`)."""

    @abc.abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a canonical dict from any backend, or a native torch/paddle dict."""
