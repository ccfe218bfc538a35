"""The ``GradScaler`` facade, and the interface every backend implements.

``unifiedamp.GradScaler(...)`` returns the scaler of one backend; every
backend's scaler class derives from :class:`GradScaler`, which lists every
member a backend provides or may provide. A third-party backend author reads
this one class. With it, what the interface's arguments are on every backend, functional
and imperative: a finite-flag (:func:`is_flag`, :func:`check_flag`), a ``new_scale``
(:func:`new_scale_value`), the largest ``history`` (:data:`MAX_HISTORY`), and the errors
users catch (:class:`NoInfChecksError`, :class:`ScaleNotCalledError`). What only the
imperative backends share is in ``unifiedamp.backends._imperative``.

Length: one class is most of this module: the interface, with a docstring for each member,
and the typed constructor's overloads that name each backend's options. Split, a backend
author would read the interface in pieces.
"""

from __future__ import annotations

import abc
import math
import numbers

from unifiedamp import _registry
from unifiedamp.spec import ScalerConfig, ScalerState, f32

# typing.TYPE_CHECKING without importing typing: a bare ``import unifiedamp`` loads
# neither typing nor the re and enum it brings (tests/core/test_import.py); type checkers know
# this idiom.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Literal, overload

    from typing_extensions import Self

    from unifiedamp.backends.jax import JaxGradScaler
    from unifiedamp.backends.keras import KerasGradScaler
    from unifiedamp.backends.mlx import MlxGradScaler
    from unifiedamp.backends.numpy import NumpyGradScaler
    from unifiedamp.backends.paddle import PaddleGradScaler
    from unifiedamp.backends.torch import TorchGradScaler




def new_scale_value(new_scale: Any) -> float:
    """The float32 value of ``update(new_scale=...)`` on an imperative backend.

    A Python or NumPy number, or a 1-element array (NumPy's, or any with ``size``
    and ``item()``); finite and > 0 in float32. Bools, lists and strings are
    refused. (A torch tensor is the torch backend's own case: it stays on the device.)

    Example:
        >>> import numpy as np
        >>> new_scale_value(8), new_scale_value(np.array([0.1]))
        (8.0, 0.10000000149011612)
        >>> new_scale_value([8.0])
        Traceback (most recent call last):
        ...
        TypeError: new_scale must be a float or a 1-element array/tensor, got [8.0]
    """
    refused = f"new_scale must be a float or a 1-element array/tensor, got {new_scale!r}"
    value = new_scale
    size = getattr(value, "size", None)
    if size is not None and not callable(size) and hasattr(value, "item"):
        if size != 1:
            raise TypeError(f"{refused} (it has {size} elements)")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(refused)
    scale = f32(float(value))
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"new_scale must be finite and > 0 in float32, got {new_scale!r}")
    return scale


def is_flag(value: Any) -> bool:
    """Whether ``value`` is one finite-flag: a bool, or a bool array/tensor of one element
    (NumPy's, torch's, Paddle's, JAX's, MLX's: read from its dtype, no host sync).

    Example:
        >>> import numpy as np
        >>> is_flag(True), is_flag(np.array(True)), is_flag(np.float32(8.0)), is_flag(8)
        (True, True, False, False)
    """
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and _is_bool_dtype(dtype)


def _is_bool_dtype(dtype: Any) -> bool:
    # NumPy and JAX print "bool", torch "torch.bool", Paddle "paddle.bool", MLX
    # "mlx.core.bool", TensorFlow "<dtype: 'bool'>".
    text = str(dtype).rsplit(".", 1)[-1]
    return text.strip("<>' ").removeprefix("dtype: '") in ("bool", "bool_")


def check_flag(finite: Any) -> None:
    """Checks ``update(finite)``'s flag from static facts only (type, dtype, shape), so
    the check is free under tracing: a bool or a 0-d bool array/tensor."""
    hint = ("pass the flag unscale() returns (or all_finite(grads)): a Python bool or a 0-d "
            "bool array")
    if isinstance(finite, bool):
        return
    dtype = getattr(finite, "dtype", None)
    if dtype is None:
        raise TypeError(f"update(finite) got {type(finite).__name__} {finite!r}; {hint}")
    if not _is_bool_dtype(dtype):
        raise TypeError(f"update(finite) got an array of dtype {dtype} ({finite!r}); {hint}")
    if tuple(getattr(finite, "shape", ())) != ():
        raise ValueError(f"update(finite) got a bool array of shape {tuple(finite.shape)} "
                         f"({finite!r}); one flag for the whole step is needed: pass the "
                         "one unscale() returns, or reduce it (jnp.all, mx.all, torch.all, "
                         "keras.ops.all)")


#: The most records a history ring keeps, on every backend: 2**24 records take about
#: 150 MB of device memory (int32 iteration, float32 scale, bool skipped), and a ring's
#: indices stay far inside int32.
MAX_HISTORY = 2**24


#: What an optional member of :class:`GradScaler` is for; ``capabilities`` lists those a
#: backend implements (``GradScaler.supports(name)`` asks).
OPTIONAL_MEMBERS = {
    "unscale_": "imperative: unscale an optimizer's gradients in place (torch's verb)",
    "step": "imperative: unscale, check and step an optimizer (torch's verb)",
    "minimize": "Paddle's verb: step and update in one call",
    "wrap": "Keras: the optimizer that scales, checks and updates inside apply()",
    "watch": "name the parameters the overflow report lists",
    "overflow_report": "which gradients held inf/NaN at the last skipped update",
    "history": "the last updates' scales and skips",
    "native_state_dict": "the framework's own scaler state dict (torch, Paddle)",
    "tree": "functional: the scaler's arrays as a dict (for mx.compile, checkpoints)",
    "with_tree": "functional: the scaler with the arrays of a tree()",
    "with_config": "functional: the scaler with some parameters changed, state kept",
}


def _constructor_signature(cls: type) -> Any:
    """The signature ``inspect``/``help()`` show for a scaler class: the design's five
    parameters, the spec's keyword-only ones, then the class's own options."""
    import inspect

    from unifiedamp.spec._config import CANONICAL, POSITIONAL, ScalerConfig

    kind = inspect.Parameter
    defaults = ScalerConfig()
    params = [kind(name, kind.POSITIONAL_OR_KEYWORD, default=getattr(defaults, name),
                   annotation=ScalerConfig.__annotations__[name]) for name in POSITIONAL]
    params += [kind(name, kind.KEYWORD_ONLY, default=getattr(defaults, name),
                    annotation=ScalerConfig.__annotations__[name])
               for name in CANONICAL if name not in POSITIONAL]
    if cls is GradScaler:
        params.append(kind("backend", kind.KEYWORD_ONLY, default=None, annotation="str | Any"))
        params.append(kind("options", kind.VAR_KEYWORD, annotation="Any"))
    else:
        # The class's own __init__, not an instance's (mypy's [misc] is about instances).
        own = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
        params += [p for p in own if p.kind is kind.KEYWORD_ONLY and p.name not in CANONICAL]
        params.append(kind("aliases", kind.VAR_KEYWORD, annotation="Any"))
    return inspect.Signature(params, return_annotation=cls.__name__)


if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    _F = TypeVar("_F", bound=Callable[..., Any])

    # Type checkers see no abstract members: GradScaler(...) is built through its
    # metaclass, which returns a backend's class (the overloads of __new__ below), and
    # would otherwise be an error for instantiating an abstract class. At run time
    # they are abstract: a backend that leaves one out cannot be built.
    def _abstract(function: _F) -> _F:
        return function
else:
    _abstract = abc.abstractmethod


class _FacadeMeta(abc.ABCMeta):
    # Dispatch in the metaclass, not in __new__: a __new__ that returns a
    # GradScaler subclass would have Python call its __init__ a second time.
    # The framework classes backends derive from (torch.amp.GradScaler,
    # paddle.amp.GradScaler, keras's LossScaleOptimizer) all have the metaclass
    # `type`, so no backend meets a metaclass conflict
    # (test_framework_assumptions.py in each framework's test folder).
    # Hidden from type checkers: a metaclass __call__ returning Any makes pyright type every
    # GradScaler(...) as Any; without it, mypy and pyright both read the overloads of
    # GradScaler.__new__ below (tests/core/test_types.py).
    if not TYPE_CHECKING:
        def __call__(cls, *args, backend=None, **kwargs):
            if cls is not GradScaler:
                if backend is not None:
                    raise TypeError(
                        f"{cls.__name__} is the {getattr(cls, 'backend', '?')!r} backend "
                        "already; backend= goes to unifiedamp.GradScaler"
                    )
                return super().__call__(*args, **kwargs)
            name = backend if isinstance(backend, str) else _registry.detect(backend)
            return _registry.load(name)(*args, **kwargs)

    # A data descriptor of the metaclass wins over the class's own attributes, so
    # inspect.signature(cls) and help(cls) read this, not __call__'s (*args, **kwargs).
    @property
    def __signature__(cls) -> Any:
        return _constructor_signature(cls)


class GradScaler(metaclass=_FacadeMeta):
    """A dynamic loss scaler for mixed-precision training, for any framework.

    ``GradScaler(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, enabled=True, *, hysteresis=1, min_scale=None,
    max_scale=None, dynamic=True, backend=None, **options)`` returns the scaler
    of one backend, configured by :class:`unifiedamp.spec.ScalerConfig` (aliases
    such as ``initScale`` or ``init_loss_scaling`` are accepted); ``options`` are
    the backend's own (``device`` on torch, ``diagnose``, ``history``...).

    ``backend`` is a name (``"numpy"``, ``"torch"``, ``"paddle"``, ``"keras"``,
    ``"jax"``, ``"mlx"``, or a name users type for one: ``"pytorch"``, ``"tf"``,
    ``"flax"``...), a ``"module:Class"`` string, an object of the framework
    (optimizer, tensor, model) whose type decides, or ``None``: the one
    framework imported decides, NumPy if none is.

    Every backend's scaler is an instance of this class, which declares every
    public member a user may rely on. The members every backend has make one
    protocol, the same on every framework::

        grads, finite = scaler.unscale(grads)             # unscaled copies, all finite?
        params = scaler.where_finite(finite, new, params) # keep params on a skipped step
        scaler = scaler.update(finite)                    # the spec's rule, once

    ``update``, ``restore`` and the ``set_*`` accessors return the scaler: the
    imperative backends (numpy, torch, paddle, keras) change themselves and return
    themselves, the functional ones (jax, mlx: ``functional`` is True) are immutable
    values and return a new one, so ``scaler = scaler.update(finite)`` is right on
    both. Members only some backends have (torch's ``unscale_``/``step``, Paddle's
    ``minimize``, Keras's ``wrap``, the diagnostics) are listed in ``capabilities``;
    ``supports(name)`` asks, and the others raise ``NotImplementedError`` saying what
    to use.

    Example:
        >>> import unifiedamp as ua
        >>> scaler = ua.GradScaler(1024.0, growth_interval=100, backend="numpy")
        >>> isinstance(scaler, ua.GradScaler), scaler.get_scale()
        (True, 1024.0)
        >>> scaler = scaler.update(False)
        >>> scaler.get_scale(), scaler.last_step_skipped, scaler.num_steps
        (512.0, True, 1)
        >>> scaler.functional, scaler.supports("step"), ua.GradScaler.supports("step")
        (False, True, False)
    """

    if TYPE_CHECKING:
        # What type checkers see of the constructor (the metaclass dispatches at run
        # time): the design's signature, and for a literal backend name that backend's
        # class and options (tests/cross/test_interface.py checks them against the classes).
        @overload
        def __new__(cls, init_scale: float = ..., growth_factor: float = ...,
                    backoff_factor: float = ..., growth_interval: int = ...,
                    enabled: bool = ..., *, hysteresis: int = ...,
                    min_scale: float | None = ..., max_scale: float | None = ...,
                    dynamic: bool = ...,
                    backend: Literal["numpy", "np"],
                    max_consecutive_skips: int | None = ...,
                    on_collapse: str = ..., diagnose: bool = ..., history: int = ...,
                    **aliases: Any) -> NumpyGradScaler: ...
        @overload
        def __new__(cls, init_scale: float = ..., growth_factor: float = ...,
                    backoff_factor: float = ..., growth_interval: int = ...,
                    enabled: bool = ..., *, hysteresis: int = ...,
                    min_scale: float | None = ..., max_scale: float | None = ...,
                    dynamic: bool = ...,
                    backend: Literal["torch", "pytorch"],
                    device: Any = ..., process_group: Any = ...,
                    distributed: bool | None = ..., max_consecutive_skips: int | None = ...,
                    on_collapse: str = ..., diagnose: bool = ..., history: int = ...,
                    **aliases: Any) -> TorchGradScaler: ...
        @overload
        def __new__(cls, init_scale: float = ..., growth_factor: float = ...,
                    backoff_factor: float = ..., growth_interval: int = ...,
                    enabled: bool = ..., *, hysteresis: int = ...,
                    min_scale: float | None = ..., max_scale: float | None = ...,
                    dynamic: bool = ...,
                    backend: Literal["paddle", "paddlepaddle"],
                    device: Any = ..., process_group: Any = ...,
                    distributed: bool | None = ..., max_consecutive_skips: int | None = ...,
                    on_collapse: str = ..., diagnose: bool = ..., history: int = ...,
                    **aliases: Any) -> PaddleGradScaler: ...
        @overload
        def __new__(cls, init_scale: float = ..., growth_factor: float = ...,
                    backoff_factor: float = ..., growth_interval: int = ...,
                    enabled: bool = ..., *, hysteresis: int = ...,
                    min_scale: float | None = ..., max_scale: float | None = ...,
                    dynamic: bool = ...,
                    backend: Literal["keras", "tensorflow", "tf", "tf.keras"],
                    diagnose: bool = ..., history: int = ...,
                    **aliases: Any) -> KerasGradScaler: ...
        @overload
        def __new__(cls, init_scale: float = ..., growth_factor: float = ...,
                    backoff_factor: float = ..., growth_interval: int = ...,
                    enabled: bool = ..., *, hysteresis: int = ...,
                    min_scale: float | None = ..., max_scale: float | None = ...,
                    dynamic: bool = ...,
                    backend: Literal["jax", "flax", "optax"],
                    **aliases: Any) -> JaxGradScaler: ...
        @overload
        def __new__(cls, init_scale: float = ..., growth_factor: float = ...,
                    backoff_factor: float = ..., growth_interval: int = ...,
                    enabled: bool = ..., *, hysteresis: int = ...,
                    min_scale: float | None = ..., max_scale: float | None = ...,
                    dynamic: bool = ...,
                    backend: Literal["mlx"],
                    **aliases: Any) -> MlxGradScaler: ...
        @overload  # torch's habit: the device first
        def __new__(cls, device: str, init_scale: float = ..., growth_factor: float = ...,
                    backoff_factor: float = ..., growth_interval: int = ...,
                    enabled: bool = ..., *, hysteresis: int = ...,
                    min_scale: float | None = ..., max_scale: float | None = ...,
                    dynamic: bool = ..., backend: Literal["torch", "pytorch"] | None = ...,
                    process_group: Any = ..., distributed: bool | None = ...,
                    max_consecutive_skips: int | None = ...,
                    on_collapse: str = ..., diagnose: bool = ..., history: int = ...,
                    **aliases: Any) -> TorchGradScaler: ...
        @overload
        def __new__(cls, init_scale: float = ..., growth_factor: float = ...,
                    backoff_factor: float = ..., growth_interval: int = ...,
                    enabled: bool = ..., *, hysteresis: int = ...,
                    min_scale: float | None = ..., max_scale: float | None = ...,
                    dynamic: bool = ...,
                    backend: Any = None, **options: Any) -> Self: ...
        def __new__(cls, *args: Any, **kwargs: Any) -> Any: ...

    #: The backend's name: what ``backend=`` takes and ``state_dict()["backend"]`` holds.
    backend: str = ""

    #: True when the scaler is an immutable value (jax, mlx): ``update``, ``restore`` and
    #: the setters return a new scaler and leave this one as it was. False when they
    #: change the scaler and return it.
    functional: bool = False

    #: The optional members (:data:`OPTIONAL_MEMBERS`) this backend implements.
    capabilities: frozenset[str] = frozenset()

    @classmethod
    def supports(cls, member: str) -> bool:
        """Whether this backend implements the optional member ``member`` (e.g. ``"step"``).

        Example:
            >>> from unifiedamp.backends.numpy import NumpyGradScaler
            >>> NumpyGradScaler.supports("step"), NumpyGradScaler.supports("wrap")
            (True, False)
        """
        if member not in OPTIONAL_MEMBERS:
            raise ValueError(f"{member!r} is not an optional member of GradScaler; the optional "
                             f"ones are {sorted(OPTIONAL_MEMBERS)} (every backend has the rest)")
        return member in cls.capabilities

    # ------------------------------------------------------------ config and state

    @property
    @_abstract
    def config(self) -> ScalerConfig:
        """The validated configuration."""
        raise NotImplementedError

    @property
    @_abstract
    def state(self) -> ScalerState:
        """The scale and both trackers, as Python numbers (may read the device)."""
        raise NotImplementedError

    @_abstract
    def is_enabled(self) -> bool:
        """Whether the scaler scales at all (``enabled=False`` makes every verb a pass-through)."""
        raise NotImplementedError

    @_abstract
    def get_scale(self) -> Any:
        """The current scale as a Python float (inside a traced function, the 0-d array);
        1.0 when disabled."""
        raise NotImplementedError

    @property
    @_abstract
    def last_step_skipped(self) -> Any:
        """Whether the last update's gradients were not all finite (its step skipped)."""
        raise NotImplementedError

    @property
    @_abstract
    def num_skipped_steps(self) -> Any:
        """Updates whose gradients were not all finite, since the scaler was made."""
        raise NotImplementedError

    @property
    @_abstract
    def num_steps(self) -> Any:
        """Updates made since the scaler was made (a disabled scaler makes none)."""
        raise NotImplementedError

    @_abstract
    def _reconfigure(self, config: ScalerConfig) -> Any:
        """The scaler with ``config`` (validated) and its state: imperative backends set
        it and return ``self``, functional ones return a new scaler."""
        raise NotImplementedError

    def get_growth_factor(self) -> float:
        """The factor the scale grows by."""
        return self.config.growth_factor

    def set_growth_factor(self, new_factor: float) -> Self:
        """Sets ``growth_factor`` (validated); returns the scaler (a new one if functional)."""
        return self._reconfigure(self.config.replace(growth_factor=new_factor))

    def get_backoff_factor(self) -> float:
        """The factor the scale backs off by."""
        return self.config.backoff_factor

    def set_backoff_factor(self, new_factor: float) -> Self:
        """Sets ``backoff_factor`` (validated); returns the scaler (a new one if functional)."""
        return self._reconfigure(self.config.replace(backoff_factor=new_factor))

    def get_growth_interval(self) -> int:
        """Consecutive finite updates before the scale grows."""
        return self.config.growth_interval

    def set_growth_interval(self, new_interval: int) -> Self:
        """Sets ``growth_interval``; a tracker already past it grows at the next finite
        update. Returns the scaler (a new one if functional)."""
        return self._reconfigure(self.config.replace(growth_interval=new_interval))

    def get_hysteresis(self) -> int:
        """Consecutive non-finite updates before the scale backs off."""
        return self.config.hysteresis

    def set_hysteresis(self, new_hysteresis: int) -> Self:
        """Sets ``hysteresis`` (validated); returns the scaler (a new one if functional)."""
        return self._reconfigure(self.config.replace(hysteresis=new_hysteresis))

    @_abstract
    def state_dict(self) -> dict[str, Any]:
        """The canonical, JSON-serialisable state (see :func:`unifiedamp.spec.to_state_dict`)."""
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Imperative: loads a canonical dict of any backend or a native torch/Paddle dict in
        place, validated before anything is written; returns None, as torch's. Functional:
        raises, naming :meth:`restore`."""
        raise NotImplementedError

    def restore(self, state_dict: dict[str, Any]) -> Self:
        """The scaler holding a state dict's config and state: :meth:`load_state_dict`
        and ``self`` on imperative backends, a new scaler on functional ones."""
        self.load_state_dict(state_dict)
        return self

    # ------------------------------------------------------------ the verbs

    @_abstract
    def scale(self, outputs: Any) -> Any:
        """The loss (or a tree of outputs) multiplied by the scale, each keeping its dtype."""
        raise NotImplementedError

    @_abstract
    def unscale(self, grads: Any) -> tuple[Any, Any]:
        """``(grads divided by the scale, all finite)``: unscaled copies and one flag (a bool,
        or a 0-d bool array/tensor that stays on the device). The check counts towards the
        next :meth:`update` on imperative backends; pass the flag to it on every backend."""
        raise NotImplementedError

    @_abstract
    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` where ``finite``, else ``old``: two trees of the same structure (the
        parameters after and before a step), selected leaf by leaf without a host sync."""
        raise NotImplementedError

    @_abstract
    def update(self, finite: Any = None, *, new_scale: Any = None) -> Self:
        """Applies the spec's rule once and returns the scaler (a new one if functional).

        ``finite`` is the flag :meth:`unscale` returned; imperative backends also take
        the checks ``unscale``/``unscale_``/``step`` recorded since the last update,
        and ``update()`` with no flag uses those alone (torch's habit). ``new_scale``
        sets the scale instead (trackers kept, not counted as an update); on imperative
        backends a number as the first argument is ``new_scale``, as in torch.
        """
        raise NotImplementedError

    # ------------------------------------------------------------ optional members

    def unscale_(self, optimizer: Any) -> None:
        """Imperative: divides the optimizer's gradients by the scale in place, records inf/NaN."""
        raise NotImplementedError(self._unsupported("unscale_"))

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Imperative: unscales if needed and steps the optimizer unless a gradient was inf/NaN."""
        raise NotImplementedError(self._unsupported("step"))

    def minimize(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Paddle: ``step(optimizer)`` then ``update()`` in one call."""
        raise NotImplementedError(self._unsupported("minimize"))

    def wrap(self, optimizer: Any) -> Any:
        """Keras: the optimizer that scales, checks and updates inside ``apply``."""
        raise NotImplementedError(self._unsupported("wrap"))

    def watch(self, model: Any) -> None:
        """Names the parameters in :meth:`overflow_report`: a model (``named_parameters()``)
        or an iterable of ``(name, parameter)`` pairs; without it, optimizer indices."""
        raise NotImplementedError(self._unsupported("watch"))

    def overflow_report(self) -> Any:
        """After a skipped step, a :class:`unifiedamp.diagnostics.OverflowReport` naming the
        gradients that held inf/NaN; None when the last update skipped nothing."""
        raise NotImplementedError(self._unsupported("overflow_report"))

    def history(self) -> Any:
        """The last updates' scales and skips, a :class:`unifiedamp.diagnostics.ScaleHistory`
        (built with ``history=N``)."""
        raise NotImplementedError(self._unsupported("history"))

    def native_state_dict(self) -> dict[str, Any]:
        """torch, Paddle: the state dict the framework's own scaler writes and reads."""
        raise NotImplementedError(self._unsupported("native_state_dict"))

    def tree(self) -> dict[str, Any]:
        """Functional: the scaler's arrays as a dict (what ``mx.compile`` takes)."""
        raise NotImplementedError(self._unsupported("tree"))

    def with_tree(self, tree: dict[str, Any]) -> Self:
        """Functional: this scaler's config with the arrays of ``tree`` (from :meth:`tree`)."""
        raise NotImplementedError(self._unsupported("with_tree"))

    def with_config(self, **changes: Any) -> Self:
        """Functional: a scaler with the same state and some parameters changed."""
        raise NotImplementedError(self._unsupported("with_config"))

    def _unsupported(self, member: str) -> str:
        if member in ("watch", "overflow_report", "history") and self.functional:
            return (f"the {self.backend!r} backend has no {member}(): the functional backends "
                    "return per-gradient counts from the jitted step instead "
                    "(overflow_counts / overflow_report in its module, docs/diagnostics.md)")
        return (f"the {self.backend!r} backend has no {member}() ({OPTIONAL_MEMBERS[member]}); "
                f"it has {sorted(self.capabilities) or 'none of the optional members'}, and on "
                "every backend: grads, finite = scaler.unscale(grads); scaler = "
                "scaler.update(finite) (GradScaler.supports(name) tells which a backend has)")

    # ------------------------------------------------------------ tooling

    @classmethod
    def devices(cls) -> list[str]:
        """Where this backend computes, for ``unifiedamp backends`` (default: the CPU)."""
        return ["cpu"]

    @classmethod
    def conformance_adapter(cls, **options: Any) -> Any:
        """How the conformance suite drives this class (``docs/conformance.md``).

        The hook for third-party backends: override it to return an adapter. By
        default, the adapter of the built-in backend this class is or derives
        from, from the backend table, built with ``options``.

        Example:
            >>> from unifiedamp.backends.numpy import NumpyGradScaler
            >>> NumpyGradScaler.conformance_adapter().name
            'numpy'
        """
        return _registry.conformance_adapter(cls, **options)
