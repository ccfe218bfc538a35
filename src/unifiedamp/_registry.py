"""Which backends exist, how to load them, and how to pick one without importing a framework.

Built-in backends are a table of name -> ``"module:Class"`` of the scaler and
``"module:Class"`` of the adapter that drives it in the conformance suite.
Third-party backends register their scaler the same way through the entry-point
group ``unifiedamp.backends`` (their class provides its own adapter through
``conformance_adapter()``). Detection reads ``sys.modules`` and the types of the
objects it is given; it never imports a framework to decide. Everything here is
named by strings, so the table points at backends and at the conformance suite
without importing either.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections import namedtuple

from unifiedamp._isolation import ensure_importable
from unifiedamp.errors import AmbiguousBackendError, MissingBackendError, UnknownBackendError

# typing.TYPE_CHECKING without importing typing, which (with re and enum) a bare ``import
# unifiedamp`` must not load (tests/core/test_import.py); type checkers know this idiom.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ENTRY_POINT_GROUP = "unifiedamp.backends"


# collections.namedtuple, not typing.NamedTuple: see TYPE_CHECKING above.
class BackendInfo(namedtuple("BackendInfo", ["name", "target", "framework", "modules",
                                             "install", "adapter"], defaults=[""])):
    """One row of the backend table.

    Attributes:
        name: What ``backend=`` accepts.
        target: ``"module:Class"`` of the scaler class.
        framework: The distribution whose version ``unifiedamp backends`` reports.
        modules: Top-level modules that identify the framework in ``sys.modules``
            and in an object's type.
        install: What to run when the framework is missing.
        adapter: ``"module:Class"`` of the conformance adapter, built as
            ``Class(scaler_cls, **options)`` (empty: the class brings its own).
    """

    __slots__ = ()


_ADAPTERS = "unifiedamp.conformance.adapters"

BUILTIN: dict[str, BackendInfo] = {
    "numpy": BackendInfo("numpy", "unifiedamp.backends.numpy:NumpyGradScaler", "numpy",
                         ("numpy",), "pip install numpy", f"{_ADAPTERS}.numpy:NumpyAdapter"),
    "torch": BackendInfo("torch", "unifiedamp.backends.torch:TorchGradScaler", "torch",
                         ("torch",), "pip install 'unifiedamp[torch]'",
                         f"{_ADAPTERS}.torch:TorchAdapter"),
    "paddle": BackendInfo("paddle", "unifiedamp.backends.paddle:PaddleGradScaler", "paddlepaddle",
                          ("paddle",), "pip install 'unifiedamp[paddle]'",
                          f"{_ADAPTERS}.paddle:PaddleAdapter"),
    "keras": BackendInfo("keras", "unifiedamp.backends.keras:KerasGradScaler", "keras",
                         ("keras", "tensorflow"), "pip install 'unifiedamp[keras]'",
                         f"{_ADAPTERS}.keras:KerasAdapter"),
    "jax": BackendInfo("jax", "unifiedamp.backends.jax:JaxGradScaler", "jax",
                       ("jax", "jaxlib", "optax", "flax"), "pip install 'unifiedamp[jax]'",
                       f"{_ADAPTERS}.jax:JaxAdapter"),
    "mlx": BackendInfo("mlx", "unifiedamp.backends.mlx:MlxGradScaler", "mlx", ("mlx",),
                       "pip install 'unifiedamp[mlx]'", f"{_ADAPTERS}.mlx:MlxAdapter"),
}

#: Other names ``backend=`` takes for a built-in backend: the framework's package or its
#: common name (matched without regard to case: ``"PyTorch"`` is torch).
BACKEND_ALIASES = {"pytorch": "torch", "tensorflow": "keras", "tf": "keras", "tf.keras": "keras",
                   "paddlepaddle": "paddle", "flax": "jax", "optax": "jax", "praxis": "jax",
                   "paxml": "jax", "np": "numpy"}

# Every framework's top-level modules -> its backend name (tensorflow objects are
# Keras's), so that detection never silently falls back to NumPy.
_KNOWN_FRAMEWORKS = {
    "keras": "keras", "tensorflow": "keras", "torch": "torch", "paddle": "paddle",
    "jax": "jax", "jaxlib": "jax", "optax": "jax", "flax": "jax", "praxis": "jax", "paxml": "jax",
    "mlx": "mlx",
}





def entry_points() -> dict[str, str]:
    """Third-party backends: entry-point name -> ``"module:Class"``."""
    # Imported here, not at the top: importlib.metadata (and the email package it
    # pulls in) alone costs more than the rest of ``import unifiedamp``.
    import importlib.metadata

    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available() -> dict[str, BackendInfo]:
    """Every known backend, built-in first, then entry points (built-in names win)."""
    rows = dict(BUILTIN)
    for name, target in entry_points().items():
        module = target.partition(":")[0].split(".")[0]
        rows.setdefault(name, BackendInfo(name, target, module, (module,),
                                          f"pip install the package that provides {target}"))
    return rows


def _roots_of(obj: Any) -> list[str]:
    # The MRO, so that a user's subclass of torch.optim.Optimizer defined in
    # __main__ still identifies torch.
    return [(klass.__module__ or "").split(".")[0] for klass in type(obj).__mro__]


def _backend_for_roots(roots: list[str], rows: dict[str, BackendInfo]) -> str | None:
    # Keras first: a Keras-on-torch gradient is a torch.Tensor, but a Keras
    # optimizer or variable always has keras in its MRO.
    if "keras" in roots:
        return "keras"
    for root in roots:
        for row in rows.values():
            if root in row.modules:
                return row.name
        if root in _KNOWN_FRAMEWORKS:
            return _KNOWN_FRAMEWORKS[root]
    return None


def _imported_frameworks() -> list[str]:
    found = []
    for module, backend in _KNOWN_FRAMEWORKS.items():
        if module in sys.modules and backend not in found:
            found.append(backend)
    if "keras" in found:
        # Keras imports its own backend framework; that one is Keras's, not the user's.
        keras_backend = os.environ.get("KERAS_BACKEND", "tensorflow")
        config = getattr(sys.modules["keras"], "config", None)
        if config is not None and hasattr(config, "backend"):
            keras_backend = config.backend()
        found = [b for b in found if b != _KNOWN_FRAMEWORKS.get(keras_backend)]
    return found


def detect(obj: Any = None) -> str:
    """Picks a backend name from an object's type, or else from what is imported.

    With ``obj`` (an optimizer, tensor, model...), its type decides. Without,
    exactly one imported framework decides; none means NumPy; several is an
    error that asks for ``backend=``.

    Example:
        >>> import numpy as np
        >>> detect(np.zeros(3))
        'numpy'
    """
    rows = available()
    if obj is not None:
        name = _backend_for_roots(_roots_of(obj), rows)
        if name is None:
            raise UnknownBackendError(
                f"Cannot tell the framework of {type(obj).__module__}.{type(obj).__qualname__}; "
                f"pass backend= one of {sorted(rows)}"
            )
        return name
    imported = _imported_frameworks()
    if len(imported) > 1:
        raise AmbiguousBackendError(
            f"Several frameworks are imported ({', '.join(imported)}); pass backend= "
            f"(one of {sorted(rows)}) or an optimizer/tensor as backend= to choose"
        )
    return imported[0] if imported else "numpy"


#: ``"module:Class"`` of the class every scaler derives from, named by a string
#: because the facade sits above this module (imports run one way).
SCALER_BASE = "unifiedamp._scaler:GradScaler"


def resolve(name: str) -> BackendInfo:
    """The table row of a backend name or ``"module:Class"``, checked without importing it.

    Raises:
        UnknownBackendError: No such backend, or a malformed ``"module:Class"``.

    Example:
        >>> resolve("numpy").target
        'unifiedamp.backends.numpy:NumpyGradScaler'
        >>> resolve("PyTorch").name, resolve("tf").name, resolve("flax").name
        ('torch', 'keras', 'jax')
        >>> resolve("pytroch")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unifiedamp.errors.UnknownBackendError: Unknown backend 'pytroch' (did you mean ...
        >>> resolve("mypackage.amp:MyScaler").modules
        ('mypackage',)
    """
    rows = available()
    if name not in rows:
        name = BACKEND_ALIASES.get(name.lower(), name.lower() if name.lower() in rows else name)
    if name in rows:
        return rows[name]
    if ":" in name:
        _check_target(name)
        module = name.partition(":")[0].split(".")[0]
        return BackendInfo(name, name, module, (module,), f"install the package providing {name}")
    raise UnknownBackendError(
        f"Unknown backend {name!r}{_did_you_mean(name, rows)}; available: {sorted(rows)} "
        f"(also {', '.join(sorted(BACKEND_ALIASES))}), or 'module:Class'"
    )


def _did_you_mean(name: str, rows: dict[str, BackendInfo]) -> str:
    # difflib is imported only here, for an error message (import time).
    import difflib

    known = {**{n: n for n in rows}, **BACKEND_ALIASES}
    close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.6)
    if not close:
        return ""
    target = known[close[0]]
    return f" (did you mean {target!r}?)" if close[0] == target else \
        f" (did you mean {close[0]!r}, that is {target!r}?)"


def _check_target(target: str) -> None:
    module_name, _, attr = target.partition(":")
    parts = [*module_name.split("."), attr]
    if not all(part.isidentifier() for part in parts):
        raise UnknownBackendError(
            f"backend {target!r} is not a 'module:Class' target: expected an importable dotted "
            "module name, one colon, then a class name, as in 'mypackage.amp:MyScaler'"
        )


def load(name: str) -> type[Any]:
    """Imports and returns the scaler class of a backend name or ``"module:Class"``.

    Raises:
        UnknownBackendError: No such backend, or the target is not a subclass
            of ``unifiedamp.GradScaler``.
        MissingBackendError: Its framework is not installed or its import
            fails (the message says what to install).

    Example:
        >>> load("numpy").__name__
        'NumpyGradScaler'
    """
    row = resolve(name)
    ensure_importable(row.modules[0])
    try:
        cls = import_target(row.target)
    # A framework found on disk whose shared libraries are missing or broken
    # raises OSError from its import (torch does), not ImportError.
    except (ImportError, OSError) as exc:
        detail = str(exc) if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
        raise MissingBackendError(
            f"backend {row.name!r} cannot be imported ({detail}); to use it: {row.install}"
        ) from exc
    _check_scaler(row.name, cls)
    return cls


def _check_scaler(name: str, obj: Any) -> None:
    # Any callable would otherwise be called with the scaler's arguments
    # ('builtins:print' printed them).
    mro = getattr(obj, "__mro__", ())
    if SCALER_BASE not in {f"{klass.__module__}:{klass.__qualname__}" for klass in mro}:
        what = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"
        raise UnknownBackendError(
            f"backend {name!r} is {what}, not a subclass of unifiedamp.GradScaler; point "
            "backend= at a scaler class that subclasses unifiedamp.GradScaler "
            "(docs/backends.md, 'Third-party backends')"
        )


def import_target(target: str) -> Any:
    """The object a ``"module:attribute"`` target names, its module imported.

    Raises:
        UnknownBackendError: The module has no such attribute.

    Example:
        >>> import_target("unifiedamp.spec:f32")(0.1)
        0.10000000149011612
    """
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownBackendError(f"{module_name} has no attribute {attr!r}") from None


def conformance_adapter(cls: type, **options: Any) -> Any:
    """The conformance adapter of a scaler class from the table: that of the built-in
    backend it is or derives from, so a subclass is driven like its base.

    Raises:
        NotImplementedError: ``cls`` derives from no built-in backend.

    Example:
        >>> from unifiedamp.backends.numpy import NumpyGradScaler
        >>> conformance_adapter(NumpyGradScaler).name
        'numpy'
    """
    targets = {f"{klass.__module__}:{klass.__qualname__}" for klass in cls.__mro__}
    for row in BUILTIN.values():
        if row.target in targets:
            return import_target(row.adapter)(cls, **options)
    raise NotImplementedError(
        f"{cls.__module__}.{cls.__qualname__} derives from no built-in backend, so the "
        "conformance suite does not know how to drive it: give it a conformance_adapter() "
        "class method (docs/conformance.md), or subclass unifiedamp.conformance.ScalerContract "
        "with your own 'adapter' fixture")
