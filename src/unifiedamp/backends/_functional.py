"""The immutable scaler shared by the functional backends (JAX, MLX).

A scaler is a value: six 0-d arrays (:data:`LEAVES`: the float32 ``loss_scale``,
the int32 trackers and skip counters) and a static :class:`ScalerConfig`. Every verb
returns a new value; nothing waits for the device, and a scaler an eager verb replaced
refuses the verbs (:meth:`FunctionalGradScaler._check_current`): torch's habit,
``scaler.update(finite)`` with the result dropped, would never change the scale. The
rule, validation, state handling and the tree of arrays are written here once. A
backend names its array namespace (``xp``) and how its arrays are made, and may change
how the scale is multiplied: JAX keeps exact float32 products under XLA's flush-to-zero
by working on bit patterns (:meth:`FunctionalGradScaler._encode` and friends).

The diagnostics these scalers share (overflow counts, the history ring, the collapse
message) are in :mod:`unifiedamp.backends._functional_diagnostics`.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any, ClassVar

from unifiedamp import spec
from unifiedamp._scaler import GradScaler, check_flag, new_scale_value
from unifiedamp.spec import ScalerConfig, ScalerState

#: The arrays of a scaler, in pytree order: the state, then the skip counters.
LEAVES = ("loss_scale", "growth_tracker", "hysteresis_tracker", "skipped_steps",
          "consecutive_skips", "updates")


class FunctionalGradScaler(GradScaler):
    """Base of the immutable scalers; a subclass sets ``backend`` and ``xp`` and implements
    ``_array``, ``scale`` and ``unscale``.

    Attributes:
        loss_scale: The scale, a float32 0-d array.
        growth_tracker: Consecutive finite updates, an int32 0-d array.
        hysteresis_tracker: Consecutive non-finite updates, an int32 0-d array.
        skipped_steps: Updates whose gradients were not all finite (the skipped
            steps), an int32 0-d array; not part of a state dict, as in torch.
        consecutive_skips: Such updates in a row up to the last one, an int32 0-d array.
        updates: Updates made, an int32 0-d array; not part of a state dict either.
    """

    functional = True
    capabilities = frozenset({"tree", "with_tree", "with_config"})

    #: The array namespace: ``jax.numpy`` or ``mlx.core``.
    xp: ClassVar[Any]
    #: The verb that replaced this scaler eagerly ('' while current): :meth:`_check_current`.
    #: A class default, so a scaler pickled before it existed loads as current.
    _superseded_by: str = ""
    # Set by _set_arrays (through object.__setattr__: the scaler is immutable).
    _config: ScalerConfig
    loss_scale: Any
    growth_tracker: Any
    hysteresis_tracker: Any
    skipped_steps: Any
    consecutive_skips: Any
    updates: Any

    def __init__(self, *args: Any, **kwargs: Any):
        config = spec.config_from_args(args, kwargs, extra_names=("backend",))
        # One array per leaf: a jitted step that donates the scaler's buffers may not
        # meet the same buffer twice.
        self._set_arrays(config, *self._arrays(ScalerState.initial(config)),
                         *(self._array(0, self.xp.int32) for _ in LEAVES[3:]))

    @classmethod
    def _array(cls, value: Any, dtype: Any) -> Any:
        """A 0-d array of ``dtype`` (``xp.float32``, ``xp.int32``, ``xp.bool_``) from ``value``."""
        raise NotImplementedError

    @classmethod
    def _arrays(cls, state: ScalerState) -> tuple[Any, Any, Any]:
        xp = cls.xp
        return (cls._array(state.scale, xp.float32), cls._array(state.growth_tracker, xp.int32),
                cls._array(state.hysteresis_tracker, xp.int32))

    @classmethod
    def _overflow_reductions(cls, grad: Any) -> tuple[Any, ...]:
        """``(inf count, NaN count, largest finite |g|)`` of a non-empty float array, 0-d
        arrays, traceable. Sums of bool arrays (MLX sums them into int32): a cast first
        makes ``mx.compile`` write an int32 copy of each gradient."""
        xp = cls.xp
        return (xp.sum(xp.isinf(grad)), xp.sum(xp.isnan(grad)),
                xp.max(xp.where(xp.isfinite(grad), xp.abs(grad), 0)))

    def _set_arrays(self, config: ScalerConfig, *arrays: Any) -> None:
        object.__setattr__(self, "_config", config)
        for name, array in zip(LEAVES, arrays, strict=True):
            object.__setattr__(self, name, array)

    @classmethod
    def _make(cls, config: ScalerConfig, *arrays: Any) -> Any:
        """A scaler from a config and one array per name of :data:`LEAVES`."""
        new = object.__new__(cls)
        new._set_arrays(config, *arrays)
        return new

    def _leaves(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in LEAVES)

    def _replaced(self, new: Any, by: str) -> Any:
        """``new``, marking ``self`` as replaced by ``by`` (a verb's name) where ``new``
        holds values (an eager call): a traced result is a placeholder, and ``lax.cond``
        branches may each update the same scaler, so traced calls mark nothing."""
        if new is not self and not any(self._traced(a) for a in new._leaves()):
            object.__setattr__(self, "_superseded_by", by)
        return new

    def _check_current(self, verb: str) -> None:
        """Refuses ``verb`` on a scaler that an eager ``update``, ``restore`` or setter
        replaced: its state is from before, so a result left unassigned would silently
        change nothing (the scale never backs off, no skip is counted). ``restore``
        itself is not refused: it keeps none of the replaced scale or trackers."""
        if self._superseded_by:
            raise RuntimeError(
                f"{verb}() refused: {self._superseded_by} already replaced this "
                f"{type(self).__name__}. A functional scaler is a value: "
                f"{self._superseded_by} returned a new scaler and left this one as it was, "
                "so a result not kept changes nothing (the scale never backs off, no skip is "
                "counted). Keep the result: scaler = scaler.update(finite) (likewise "
                "scaler = scaler.restore(d), scaler = scaler.set_growth_factor(x))")

    def _traced(self, array: Any) -> bool:
        """Whether ``array`` is a placeholder of a traced function, with no value to read."""
        return False

    def _host(self, array: Any, cast: Any) -> Any:
        # Outside a traced function, a Python value; inside, the array itself, which
        # the traced function can return or log.
        return array if self._traced(array) else cast(self._item(array))

    def _item(self, array: Any) -> Any:
        """``array.item()``, or an error saying why this scaler's array holds no one value."""
        problem = self._unreadable(array)
        if problem:
            raise ValueError(f"this {type(self).__name__} cannot be read: {problem}")
        return array.item()

    def _unreadable(self, array: Any) -> str:
        """Why a leaf has no host value ('' when it has one): a backend's own cases."""
        return ""

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(
            f"cannot set {name!r}: {type(self).__name__} is an immutable value (a pytree "
            "that jit and scan pass around); update(), restore() and with_config() return "
            "a new scaler: scaler = scaler.update(finite)")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(loss_scale={self.loss_scale!r}, growth_tracker="
                f"{self.growth_tracker!r}, hysteresis_tracker={self.hysteresis_tracker!r}, "
                f"{self._config})")

    def tree(self) -> dict[str, Any]:
        """The arrays, as a dict (what ``mx.compile`` takes; a JAX scaler is a pytree itself).

        Example:
            >>> import unifiedamp as ua
            >>> s = ua.GradScaler(8.0, backend="mlx")
            >>> list(s.tree())  # doctest: +NORMALIZE_WHITESPACE
            ['loss_scale', 'growth_tracker', 'hysteresis_tracker', 'skipped_steps',
             'consecutive_skips', 'updates']
            >>> s.with_tree(s.tree()).get_scale()
            8.0
        """
        return {name: getattr(self, name) for name in LEAVES}

    def with_tree(self, tree: dict[str, Any]) -> Any:
        """This scaler's config with the arrays of ``tree`` (from :meth:`tree`)."""
        return self._make(self._config, *(tree[name] for name in LEAVES))

    # ------------------------------------------------------------ config and state

    @property
    def config(self) -> ScalerConfig:
        return self._config

    @property
    def state(self) -> ScalerState:
        """Scale and trackers as Python numbers (reads the device)."""
        if any(self._traced(a) for a in self._leaves()[:3]):
            raise TypeError(
                f"{type(self).__name__}.state and state_dict() read the device, and inside a "
                "traced function (jax.jit, lax.scan, shard_map, mx.compile) the scaler's "
                "arrays have no value yet: return the scaler from the traced function and "
                "read them outside, or use the arrays loss_scale, growth_tracker and "
                "hysteresis_tracker (get_scale() returns loss_scale there)")
        return ScalerState(float(self._item(self.loss_scale)),
                           int(self._item(self.growth_tracker)),
                           int(self._item(self.hysteresis_tracker)))

    def is_enabled(self) -> bool:
        return self._config.enabled

    def get_scale(self) -> Any:
        """The scale: a Python float (reads the device), or, while traced (inside
        ``jax.jit``, ``lax.scan``, ``shard_map``...), the float32 0-d array
        ``loss_scale``, which can be returned or logged from the traced function.
        1.0 when disabled, in both cases.

        Example:
            >>> import jax, unifiedamp as ua
            >>> s = ua.GradScaler(8.0, backend="jax")
            >>> s.get_scale(), jax.jit(lambda s: s.get_scale())(s)
            (8.0, Array(8., dtype=float32))
        """
        return self._host(self.loss_scale, float) if self._config.enabled else 1.0

    @property
    def num_skipped_steps(self) -> Any:
        """Updates whose gradients were not all finite: the steps ``where_finite`` (or
        ``step_if_finite``, ``apply``) skipped. An int, or the int32 array while traced.

        Example:
            >>> import unifiedamp as ua
            >>> s = ua.GradScaler(8.0, backend="jax").update(False).update(True).update(False)
            >>> s.num_skipped_steps, s.last_step_skipped, s.num_steps
            (2, True, 3)
        """
        return self._host(self.skipped_steps, int)

    @property
    def last_step_skipped(self) -> Any:
        """Whether the last update's gradients were not all finite (a bool, or a 0-d bool
        array while traced); ``consecutive_skips`` counts them in a row."""
        return self._host(self.consecutive_skips > 0, bool)

    @property
    def num_steps(self) -> Any:
        """Updates made (an int, or the int32 array while traced); ``update(new_scale=...)``
        and a disabled scaler count none."""
        return self._host(self.updates, int)

    def _reconfigure(self, config: ScalerConfig) -> Any:
        self._check_current("with_config/set_*")
        return self._replaced(self._make(config, *self._leaves()), "with_config()/set_*()")

    def with_config(self, **changes: Any) -> Any:
        """A scaler with the same state and some parameters changed (validated).

        Example:
            >>> import unifiedamp as ua
            >>> s = ua.GradScaler(8.0, backend="jax").with_config(growth_interval=5)
            >>> s.config.growth_interval, s.get_scale()
            (5, 8.0)
        """
        return self._reconfigure(self._config.replace(**changes))

    def state_dict(self) -> dict[str, Any]:
        """The canonical dict (reads the device)."""
        return spec.to_state_dict(self._config, self.state, self.backend)

    def restore(self, state_dict: dict[str, Any]) -> Any:
        """A new scaler from a canonical dict of any backend, or a native torch/paddle dict.

        The scaler is a value: this returns the loaded one and leaves ``self`` as it
        was, so write ``scaler = scaler.restore(d)``. ``enabled`` stays as ``self``
        was built. A bad dict raises ``ValueError``.

        Example:
            >>> import unifiedamp as ua
            >>> a = ua.GradScaler(8.0, backend="jax")
            >>> ua.GradScaler(backend="jax").restore(a.state_dict()).get_scale()
            8.0
        """
        config, state = spec.parse_state_dict(state_dict, base=self._config)
        # The skip counters are this run's, not the checkpoint's (as in torch).
        return self._replaced(self._make(config.replace(enabled=self._config.enabled),
                                         *self._arrays(state), *self._leaves()[3:]), "restore()")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refused: torch's in-place habit would silently keep the old state here.

        Example:
            >>> import unifiedamp as ua
            >>> s = ua.GradScaler(backend="jax")
            >>> s.load_state_dict(s.state_dict())
            Traceback (most recent call last):
            ...
            TypeError: JaxGradScaler is an immutable value: load_state_dict() cannot change it ...
        """
        raise TypeError(
            f"{type(self).__name__} is an immutable value: load_state_dict() cannot change it "
            "in place, and a call whose result is not kept would silently resume from the old "
            "state. Write: scaler = scaler.restore(state_dict)")

    # ------------------------------------------------------------ the rule

    # How the rule multiplies and compares scales. It works on an "encoded" scale
    # whose order is the scale's order; by default the float32 array itself,
    # multiplied in float32 (JAX overrides all five to work on bit patterns).

    def _encode(self, scale: Any) -> Any:
        """The float32 scale array in the encoded form the rule compares and selects."""
        return scale

    def _decode(self, encoded: Any) -> Any:
        """The float32 scale array of an encoded scale."""
        return encoded

    def _constant(self, value: float) -> Any:
        """A float32 value (a bound), encoded."""
        return self._array(value, self.xp.float32)

    def _multiply(self, scale: Any, factor: float) -> Any:
        """``f32(scale * factor)`` for the float32 scale array, encoded."""
        return scale * self._constant(factor)

    def _is_finite(self, encoded: Any) -> Any:
        """Whether an encoded scale is finite."""
        return self.xp.isfinite(encoded)

    def _materialised(self, *arrays: Any) -> tuple[Any, ...]:
        """``arrays``, computed before what reads them (JAX: through an optimization
        barrier, so that the new scale reads the new trackers instead of the old ones
        that their update overwrites in place)."""
        return arrays

    def update(self, finite: Any = None, *, new_scale: Any = None) -> Any:
        """The scaler after one iteration whose gradients were all ``finite`` (or not).

        Args:
            finite: One flag: the 0-d bool array ``unscale`` returns, a Python bool
                or a 0-d NumPy bool. Anything else (a string, a float, an array of
                flags) raises ``TypeError``/``ValueError`` rather than being read as
                true or reshaping the scaler's arrays; the check reads only static
                type, dtype and shape, so it costs nothing under jit.
            new_scale: Instead, a scaler whose scale is this host number (finite
                and > 0 in float32), trackers and counters kept, as torch's
                ``update(new_scale)``; not counted as an update.

        Raises:
            RuntimeError: This scaler was already replaced by an eager ``update``,
                ``restore`` or setter (``scaler.update(finite)`` without ``scaler =``).

        Example:
            >>> import unifiedamp as ua
            >>> ua.GradScaler(8.0, backend="jax").update(False).get_scale()
            4.0
        """
        self._check_current("update")
        return self._replaced(self._updated(finite, new_scale), "update()")

    def _updated(self, finite: Any, new_scale: Any) -> Any:
        config, xp = self._config, self.xp
        if new_scale is not None:
            if finite is not None:
                raise TypeError("update() takes a finite flag or new_scale, not both: "
                                "update(finite) applies the rule, update(new_scale=x) sets "
                                "the scale")
            if not config.enabled:
                return self
            value = self._array(new_scale_value(new_scale), xp.float32)
            return self._make(config, value, *self._leaves()[1:])
        if finite is None:
            raise TypeError("update() needs the flag unscale() returned: grads, finite = "
                            "scaler.unscale(grads); scaler = scaler.update(finite) (a "
                            "functional scaler records no checks of its own)")
        check_flag(finite)
        if not config.enabled:
            return self
        inf = xp.logical_not(self._array(finite, xp.bool_))
        skipped = (self.skipped_steps + inf.astype(xp.int32)).astype(xp.int32)
        in_a_row = xp.where(inf, self.consecutive_skips + 1, 0).astype(xp.int32)
        updates = (self.updates + 1).astype(xp.int32)
        if not config.dynamic:
            return self._make(config, self.loss_scale, xp.zeros_like(self.growth_tracker),
                              xp.zeros_like(self.hysteresis_tracker), skipped, in_a_row,
                              updates)
        hyst = xp.where(inf, self.hysteresis_tracker + 1, 0).astype(xp.int32)
        growth = xp.where(inf, 0, self.growth_tracker + 1).astype(xp.int32)
        back_off = inf & (hyst >= config.hysteresis)
        grow = xp.logical_not(inf) & (growth >= config.growth_interval)
        new_growth = xp.where(grow, 0, growth).astype(xp.int32)
        new_hyst = xp.where(back_off, 0, hyst).astype(xp.int32)
        new_growth, new_hyst = self._materialised(new_growth, new_hyst)
        # The new trackers tell when the scale moves: a finite step whose tracker went to 0
        # grew, a non-finite one whose tracker went to 0 backed off (both count from 1).
        grow = xp.logical_not(inf) & xp.equal(new_growth, 0)
        back_off = inf & xp.equal(new_hyst, 0)
        scale = self._encode(self.loss_scale)
        backed = self._multiply(self.loss_scale, spec.f32(config.backoff_factor))
        if config.min_scale is not None:
            backed = xp.maximum(backed, self._constant(spec.f32(config.min_scale)))
        grown = self._multiply(self.loss_scale, spec.f32(config.growth_factor))
        if config.max_scale is not None:
            grown = xp.minimum(grown, self._constant(spec.f32(config.max_scale)))
        grown = xp.where(self._is_finite(grown), grown, scale)  # an overflow keeps the scale
        new = xp.where(back_off, backed, xp.where(grow, grown, scale))
        return self._make(config, self._decode(new), new_growth, new_hyst, skipped, in_a_row,
                          updates)
