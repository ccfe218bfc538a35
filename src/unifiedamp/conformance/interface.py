"""How the conformance suite drives a scaler: the adapter interface.

An adapter turns the suite's framework-neutral requests (a config, a step
whose gradients are finite or not, a tree of NumPy arrays) into calls on one
framework's scaler. Methods a backend cannot support are left out and the
capability is not declared; the tests that need it are skipped with a reason.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from unifiedamp import spec
from unifiedamp._tree import tree_map
from unifiedamp.spec import ScalerConfig, ScalerState

#: The value a step of each kind plants in one gradient element: all finite
#: (``F``), an inf (``I``) or a NaN (``N``). Finite values stay <= 0.5 in
#: magnitude, so a finite step stays finite at every float32 scale.
STEP_KINDS: dict[str, float] = {"F": 0.5, "I": math.inf, "N": math.nan}

#: Every capability the suite knows, with what declaring it promises.
CAPABILITIES: dict[str, str] = {
    "multi_optimizer": "new(config, optimizers=2) and iterate(handle, 'IF') step two optimizers",
    "inplace_unscale": "the scaler unscales optimizer gradients in place (unscale_)",
    "functional_unscale": "unscale_tree(handle, tree) -> (tree, finite)",
    "scale_tree": "scale_tree(handle, tree) scales a nested tree of arrays",
    "set_config": "reconfigure(handle, changes) changes the config at run time",
    "disable": "enabled=False makes every verb a pass-through",
    "state_dict": "save(handle) / load(handle, state_dict) with the canonical format",
    "jit": "compiled_iterate(handle, kinds) runs the step under the framework's compiler",
    "distributed": "distributed_iterate(handle, kinds_per_rank) -> one ScalerState per rank",
}


class Problem(NamedTuple):
    """One optimizer to train: fill its gradients, and read everything a step changes.

    Attributes:
        optimizer: What ``scaler.step`` receives.
        set_grads: ``set_grads(kind, scaler)`` fills the gradients as backpropagated
            from a scaled loss (``scaler.scale(loss).backward()`` where the framework
            has autodiff): all finite (``"F"``), one inf (``"I"``) or one NaN (``"N"``).
        snapshot: Returns parameters and optimizer state (moments, step counts)
            as NumPy arrays.
    """

    optimizer: Any
    set_grads: Callable[[str, Any], None]
    snapshot: Callable[[], list[np.ndarray]]


class Adapter:
    """The interface the suite calls. Subclass it, or write any object with these methods.

    Attributes:
        name: The backend's name in reports.
        capabilities: Names from :data:`CAPABILITIES` this backend supports.
        dtypes: Floating dtypes (NumPy names) the scale/unscale checks use.
    """

    name: str = "?"
    capabilities: frozenset[str] = frozenset()
    dtypes: tuple[str, ...] = ("float16", "float32", "float64")
    #: Config fields the scaler cannot set, with the one value it behaves as: a value,
    #: or a function of the rest of the config (jmp backs off by ``1 / factor``:
    #: ``{"backoff_factor": lambda c: 1 / c.growth_factor}``). Generated configs and
    #: vectors come only from that space; a vector outside it is skipped, with the field.
    fixed: dict[str, Any] = {}
    #: ``"full"``: the scale and both trackers after every step. ``"scale_and_skip"``:
    #: the scale and whether the step was skipped; a tracker is compared only where
    #: :meth:`read` returns it (``None``: the scaler has no such counter).
    compare: str = "full"

    def expresses(self, config: ScalerConfig) -> str | None:
        """``None`` when the scaler can run ``config``; otherwise why not (a skip reason).

        The default checks :attr:`fixed`; override it (calling ``super()``) for other
        limits, such as factors that must be powers of two.
        """
        for field, value in self.fixed.items():
            wanted = value(config) if callable(value) else value
            if getattr(config, field) != wanted:
                return (f"{self.name} has no {field}={getattr(config, field)!r} "
                        f"(it behaves as {field}={wanted!r})")
        return None

    def info(self) -> dict[str, Any]:
        """``framework``, ``version`` and ``device`` for the report header."""
        return {}

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        """A fresh scaler for ``config`` and ``optimizers`` problems to train; returns a handle."""
        raise NotImplementedError

    def iterate(self, handle: Any, kinds: str) -> Any:
        """One iteration: optimizer ``i`` gets gradients of kind ``kinds[i]``; step all, update."""
        raise NotImplementedError

    def read(self, handle: Any) -> ScalerState:
        """The scale and both trackers now."""
        raise NotImplementedError

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        """Every parameter and optimizer-state value a step could change."""
        raise NotImplementedError

    def reconfigure(self, handle: Any, changes: dict[str, Any]) -> Any:
        """Changes the config mid-run (``set_config``): here through the scaler's
        ``set_<name>`` setters, in place, on a handle whose first item is the scaler."""
        for name, value in changes.items():
            getattr(handle[0], f"set_{name}")(value)
        return handle


class FunctionalAdapter(Adapter):
    """Shared by adapters of immutable scalers (JAX, MLX): handles are ``(scaler, rest)``
    and the scaler's ``with_config``/``restore`` return new scalers."""

    def reconfigure(self, handle: Any, changes: dict[str, Any]) -> Any:
        return handle[0].with_config(**changes), handle[1]

    def read(self, handle: Any) -> ScalerState:
        return handle[0].state

    def save(self, handle: Any) -> dict[str, Any]:
        return handle[0].state_dict()

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        return handle[0].restore(state_dict), handle[1]


class ImperativeAdapter(Adapter):
    """The adapter of any scaler with torch's verbs (``scale``, ``step``, ``update``,
    ``state_dict``...): ``torch.amp.GradScaler`` itself, this project's imperative
    backends, or a scaler of your own.

    The constructor's signature says what the scaler can express: a canonical
    parameter it does not take is fixed at the spec's default (native torch has no
    ``hysteresis``, ``min_scale``, ``max_scale`` or ``dynamic``). Capabilities are
    those of the scaler's methods unless given. The state is read from
    ``state_dict()`` in the canonical form or in any native one the spec knows
    (torch's, Paddle's...), and saved as the canonical dict.

    Args:
        scaler_cls: Builds the scaler from canonical keyword arguments (bind a
            positional device first: ``functools.partial(torch.amp.GradScaler, "cpu")``).
        make_problem: Returns a fresh :class:`Problem`.
        to_native: Converts a NumPy array to the framework's array type.
        to_numpy: Converts back.
        capabilities: What the scaler supports (default: found from its methods).
        info: Report header fields.

    Example:
        >>> import functools, torch
        >>> from unifiedamp.conformance.adapters.torch import make_problem
        >>> native = ImperativeAdapter(functools.partial(torch.amp.GradScaler, "cpu"),
        ...                            lambda: make_problem("adam", "cpu")[0], name="torch")
        >>> sorted(native.fixed), sorted(native.capabilities)
        (['dynamic', 'hysteresis', 'max_scale', 'min_scale'], ['disable', 'inplace_unscale', \
'multi_optimizer', 'set_config', 'state_dict'])
        >>> handle = native.iterate(native.new(ScalerConfig(1024.0)), "I")
        >>> native.read(handle)
        ScalerState(scale=512.0, growth_tracker=0, hysteresis_tracker=0)
    """

    def __init__(
        self,
        scaler_cls: Callable[..., Any],
        make_problem: Callable[[], Problem],
        *,
        name: str | None = None,
        to_native: Callable[[np.ndarray], Any] = lambda a: a,
        to_numpy: Callable[[Any], np.ndarray] = np.asarray,
        capabilities: frozenset[str] | None = None,
        dtypes: tuple[str, ...] = ("float16", "float32", "float64"),
        info: dict[str, Any] | None = None,
    ):
        self.scaler_cls = scaler_cls
        self.make_problem = make_problem
        self.name = str(name or getattr(scaler_cls, "backend", None) or getattr(
            scaler_cls, "__name__", type(scaler_cls).__name__))
        self.to_native = to_native
        self.to_numpy = to_numpy
        self._parameters = _parameters(scaler_cls)
        self.fixed = {k: v for k, v in _DEFAULTS.items()
                      if self._parameters is not None and k not in self._parameters}
        self.capabilities = capabilities if capabilities is not None else _capabilities(
            scaler_cls, self._parameters)
        self.dtypes = dtypes
        self._info = info or {}
        self._configs: dict[int, ScalerConfig] = {}

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        kwargs = config.to_dict()
        if self._parameters is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self._parameters}
        scaler = self.scaler_cls(**kwargs)
        self._configs[id(scaler)] = config
        return scaler, [self.make_problem() for _ in range(optimizers)]

    def iterate(self, handle: Any, kinds: str) -> Any:
        scaler, problems = handle
        if len(kinds) != len(problems):
            raise ValueError(f"{len(kinds)} kinds for {len(problems)} optimizers")
        for kind, problem in zip(kinds, problems, strict=True):
            problem.set_grads(kind, scaler)
            scaler.step(problem.optimizer)
        scaler.update()
        return handle

    def reconfigure(self, handle: Any, changes: dict[str, Any]) -> Any:
        scaler = handle[0]
        if id(scaler) in self._configs:
            self._configs[id(scaler)] = self._configs[id(scaler)].replace(**changes)
        return super().reconfigure(handle, changes)

    def read(self, handle: Any) -> ScalerState:
        return self._canonical(handle[0])[1]

    def save(self, handle: Any) -> dict[str, Any]:
        config, state = self._canonical(handle[0])
        return spec.to_state_dict(config, state, self.name)

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        scaler = handle[0]
        own = scaler.state_dict()
        if state_dict.get("format") == spec.STATE_FORMAT and own and \
                own.get("format") != spec.STATE_FORMAT:
            config, state = spec.parse_state_dict(state_dict)
            form = spec.detect_form(own)
            self._configs[id(scaler)] = config.replace(
                enabled=self._configs.get(id(scaler), config).enabled)
            state_dict = spec.native_dict(config, state, form)
        scaler.load_state_dict(state_dict)
        return handle

    def _canonical(self, scaler: Any) -> tuple[ScalerConfig, ScalerState]:
        d = scaler.state_dict()
        config = self._configs.get(id(scaler), ScalerConfig())
        if d.get("format") == spec.STATE_FORMAT:
            return spec.parse_state_dict(d)
        if not d:  # torch and Paddle save nothing for a disabled scaler
            return config, ScalerState(float(scaler.get_scale()), 0, 0)
        read_config, state, _ = spec.read_form(d, config)
        return read_config.replace(enabled=config.enabled), state

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        return [a.copy() for problem in handle[1] for a in problem.snapshot()]

    def scale_tree(self, handle: Any, tree: Any) -> Any:
        return tree_map(self.to_numpy, handle[0].scale(tree_map(self.to_native, tree)))

    def unscale_tree(self, handle: Any, tree: Any) -> tuple[Any, bool]:
        out, finite = handle[0].unscale(tree_map(self.to_native, tree))
        return tree_map(self.to_numpy, out), bool(finite)


#: The canonical parameters a scaler may lack, and the value it then behaves as: the spec's
#: default.
_DEFAULTS = {k: getattr(ScalerConfig(), k)
             for k in ("hysteresis", "min_scale", "max_scale", "dynamic")}


def _parameters(scaler_cls: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword parameters ``scaler_cls`` takes; ``None`` when it takes ``**kwargs``."""
    try:
        parameters = inspect.signature(scaler_cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters)


def _capabilities(scaler_cls: Any, parameters: frozenset[str] | None) -> frozenset[str]:
    cls = getattr(scaler_cls, "func", scaler_cls)  # a functools.partial
    has = {name for name in dir(cls) if callable(getattr(cls, name, None))}
    found = {"multi_optimizer"}
    if "unscale_" in has:
        found.add("inplace_unscale")
    if {"unscale", "scale"} <= has:  # this project's tree verbs
        found |= {"functional_unscale", "scale_tree"}
    if {"set_growth_factor", "set_backoff_factor", "set_growth_interval"} <= has:
        found.add("set_config")
    if {"state_dict", "load_state_dict"} <= has:
        found.add("state_dict")
    if parameters is None or "enabled" in parameters:
        found.add("disable")
    return frozenset(found)

