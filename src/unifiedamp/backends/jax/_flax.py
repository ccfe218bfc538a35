"""Flax serialization of the scaler: ``flax.serialization.to_bytes``/``from_bytes`` and
``to_state_dict``/``from_state_dict`` take a :class:`JaxGradScaler`, alone, in a dict, in an
optax state (``loss_scaled``) or in a Flax ``TrainState``.

Flax's msgpack writes only the types registered with ``register_serialization_state``. The
scaler's state dict is its canonical ``state_dict()`` (config, scale, trackers: readable, and
what every backend's ``restore`` and ``unifiedamp.porting`` read) with the skip counters
beside it, so a resumed run's ``num_skipped_steps`` and ``consecutive_skips`` go on from the
saved ones, as with an array checkpoint. Restoring takes the saved config, as ``restore``
does (``enabled`` stays the template's).

When to register: importing ``flax.serialization`` imports all of Flax, about 0.15 s after
JAX, which a user of the JAX backend who never uses Flax should not pay. A check in the
scaler's own code would miss a ``from flax import serialization`` inside a save function
followed at once by ``to_bytes``, so the first checkpoint would fail and later ones pass.
Hence: registered at once if ``flax.serialization`` is imported already, else by a finder on
``sys.meta_path`` that answers only for ``flax.serialization`` and registers the scaler right
after that module has run (also after a reload, which empties Flax's registry).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import numbers
import sys
from types import ModuleType
from typing import Any

import jax.numpy as jnp

from unifiedamp.backends._functional import LEAVES
from unifiedamp.backends.jax._scaler import JaxGradScaler
from unifiedamp.spec import INT32_MAX

_MODULE = "flax.serialization"

#: The leaves a Flax state dict keeps beside the canonical ``state_dict()``.
COUNTERS = LEAVES[3:]


def scaler_state_dict(scaler: JaxGradScaler) -> dict[str, Any]:
    """The scaler's Flax state dict: ``state_dict()`` and the skip counters (reads the device).

    Example:
        >>> d = scaler_state_dict(JaxGradScaler(8.0).update(False))
        >>> d["format"], d["scale"], d["config"]["init_scale"], d["skipped_steps"]
        ('unifiedamp.GradScaler', 4.0, 8.0, 1)
    """
    return {**scaler.state_dict(),
            **{name: int(getattr(scaler, name).item()) for name in COUNTERS}}


def scaler_from_state_dict(target: JaxGradScaler, state: Any) -> JaxGradScaler:
    """The scaler of a Flax state dict (:func:`scaler_state_dict`): its config (``enabled``
    the target's, as in ``restore``), scale, trackers and, where given, the skip counters
    (else the target's).

    Raises:
        ValueError: The dict is not a scaler state, or a field is out of range (named);
            nothing is loaded.

    Example:
        >>> saved = scaler_state_dict(JaxGradScaler(8.0, growth_interval=5).update(False))
        >>> restored = scaler_from_state_dict(JaxGradScaler(), saved)
        >>> restored.get_scale(), restored.config.growth_interval, restored.num_skipped_steps
        (4.0, 5, 1)
    """
    restored = target.restore(state)  # validates everything else first
    counters = [_counter(state, name) if name in state else getattr(target, name)
                for name in COUNTERS]
    return JaxGradScaler._make(restored.config, *restored._leaves()[:3], *counters)


def _counter(state: Any, name: str) -> Any:
    value = state[name]
    if hasattr(value, "item") and getattr(value, "size", None) == 1:  # a 0-d array
        value = value.item()
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
            or not 0 <= int(value) <= INT32_MAX):
        raise ValueError(f"Invalid scaler state_dict: {name} must be an int from 0 to "
                         f"{INT32_MAX} (an int32 counter), got {value!r}; nothing was loaded")
    return jnp.asarray(int(value), jnp.int32)


def register(serialization: ModuleType) -> None:
    """Registers :class:`JaxGradScaler` with the module ``flax.serialization``; a handler
    registered before (the user's own) stays."""
    try:
        serialization.register_serialization_state(
            JaxGradScaler, scaler_state_dict, scaler_from_state_dict)
    except ValueError:  # already registered
        pass


class _RegisteringLoader(importlib.abc.Loader):
    """Runs ``flax.serialization`` with its own loader, then registers the scaler."""

    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its own loader (get_source, resources), as if this one were absent.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        register(module)


class RegisterOnImport(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder for ``flax.serialization`` alone: it asks the other finders
    for the module's spec and wraps its loader so that the scaler is registered right after
    the module has run. ``None`` (no say) for every other module."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _MODULE or self._finding:
            return None
        self._finding = True  # the search below asks this finder too
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None  # the import goes on as if this finder were absent
        spec.loader = _RegisteringLoader(spec.loader)
        return spec


def register_with_flax() -> None:
    """Registers the scaler with ``flax.serialization`` now if it is imported, and whenever
    it is (re)imported: installs :class:`RegisterOnImport` once."""
    if not any(isinstance(finder, RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, RegisterOnImport())
    module = sys.modules.get(_MODULE)
    if module is not None and hasattr(module, "register_serialization_state"):
        register(module)
