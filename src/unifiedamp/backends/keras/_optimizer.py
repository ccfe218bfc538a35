"""The wrapper every Keras backend shares: :class:`SpecLossScaleOptimizer`, a
``keras.optimizers.LossScaleOptimizer`` whose variables hold the scale and both trackers and
whose update is the spec's rule written in ``keras.ops`` (``_rule.py``).

What differs per Keras backend is in ``_tensorflow.py``, ``_jax.py`` and ``_torch.py``; the
wrapper picks its backend's paths once, when it is made (:func:`paths_for`). Keras's private
API is reached through ``_compat.py`` only; the diagnostics' variables and reports are
``_diagnostics.py``'s.

Length: one class, Keras's ``LossScaleOptimizer`` API (its constructor arguments, config,
``apply``/``stateless_apply``, scaling) over the spec's state, kept whole as Keras keeps it.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from functools import partial
from typing import Any, cast

import keras
import numpy as np
from keras import ops

from unifiedamp.backends._float32_bits import reciprocal_factors
from unifiedamp.backends._imperative import diagnostics_options
from unifiedamp.diagnostics import OverflowReport
from unifiedamp.spec import MIN_UNSCALABLE, ScalerConfig, ScalerState, f32, f32_bits

from ._compat import no_automatic_dependency_tracking
from ._diagnostics import OptimizerDiagnostics
from ._jax import JaxPaths
from ._paths import F32, BackendPaths, multiply, read_float, read_int, select
from ._rule import next_state, rule_values
from ._tensorflow import TensorFlowPaths
from ._torch import TorchPaths

#: The paths of each Keras backend that has its own; any other takes Keras's generic ones.
PATHS: dict[str, type[BackendPaths]] = {
    "tensorflow": TensorFlowPaths, "jax": JaxPaths, "torch": TorchPaths}


def paths_for(backend: str) -> type[BackendPaths]:
    """The paths of the Keras backend ``backend`` (``keras.backend.backend()``)."""
    return PATHS.get(backend, BackendPaths)


def _exactly(value: Any) -> Any:
    """An initializer that gives ``value`` bit for bit (Keras's ``Constant`` multiplies by
    ones, which flushes a subnormal scale to 0 on TensorFlow)."""

    def initializer(shape: Any, dtype: Any = None) -> Any:
        return ops.convert_to_tensor(np.asarray(value, dtype=dtype).reshape(shape))

    return initializer


# ------------------------------------------------------------ the optimizer

#: The live SpecLossScaleOptimizer of each inner optimizer, by the inner one's id (the
#: wrapper holds its inner optimizer, so the id stays its own while the entry lives).
_WRAPPERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _wrapper_of(inner: Any) -> Any:
    """The live SpecLossScaleOptimizer around ``inner``, or None."""
    if _WRAPPERS.get(id(inner)) is not None:
        # A dropped wrapper of a built optimizer lives on in reference cycles until the
        # collector runs: it trains nothing, so it does not count.
        gc.collect()
    return _WRAPPERS.get(id(inner))


#: Keras's LossScaleOptimizer arguments and the ScalerConfig fields they set.
KERAS_ARGUMENTS = {"initial_scale": "init_scale", "dynamic_growth_steps": "growth_interval"}


def _merged_config(scaler_config: dict[str, Any] | None, kwargs: dict[str, Any]) -> ScalerConfig:
    """The config of ``scaler_config`` with Keras's arguments taken out of ``kwargs``
    (``initial_scale``, ``dynamic_growth_steps``); one that disagrees with ``scaler_config``
    is an error (a config Keras's own class saved has no ``scaler_config``)."""
    fields = dict(scaler_config or {})
    for argument, field in KERAS_ARGUMENTS.items():
        if argument not in kwargs:
            continue
        # Each value checked and rounded as the config does, then compared.
        try:
            value = getattr(ScalerConfig(**{field: kwargs.pop(argument)}), field)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{argument}: {error}") from None
        if field in fields and getattr(ScalerConfig(**{field: fields[field]}), field) != value:
            raise ValueError(
                f"{argument}={value!r} disagrees with scaler_config's {field}="
                f"{fields[field]!r}: give one of them (or the same value to both)")
        fields[field] = value
    return ScalerConfig(**fields)


@keras.saving.register_keras_serializable(package="unifiedamp")
class SpecLossScaleOptimizer(OptimizerDiagnostics):
    """``keras.optimizers.LossScaleOptimizer`` with the unifiedamp spec.

    Built by :meth:`KerasGradScaler.wrap`. Variables: ``dynamic_scale`` (the
    scale), ``step_counter`` (the growth tracker, as in Keras) and
    ``hysteresis_counter``. Works in ``model.fit`` and in custom loops on every
    Keras backend: ``apply(scaled_grads)`` (TensorFlow, torch, and JAX too) and
    ``stateless_apply`` (JAX).

    The rule's parameters are in the variable ``scaler_rule`` (see
    :meth:`set_scaler_config`), so every compiled step follows a change of the config;
    it is not state: ``model.save`` leaves it out (``get_config`` holds the config).
    Nor are the int32 counters every update writes on the device (no host read):
    ``update_count`` (the updates since the optimizer was built or loaded),
    ``skipped_count`` (those that skipped) and ``last_skipped`` (1 if the last one
    did), which ``KerasGradScaler``'s ``num_steps``, ``num_skipped_steps`` and
    ``last_step_skipped`` read; nor ``unscale_factors``, ``f32(1 / scale)`` as the two
    normal factors the gradients are multiplied by, recomputed only when the scale moves
    (and set again when the scale is set or loaded).

    Diagnostics (``diagnose``, ``history``) add variables of their own, only when
    on: the history ring ``history_iteration``, ``history_scale``,
    ``history_skipped`` (``history`` slots each), and with ``diagnose`` on
    TensorFlow and JAX ``overflow_step``,
    ``overflow_scale``, ``overflow_checked``, ``overflow_counts`` (inf and NaN count
    per trainable variable) and ``overflow_max`` (largest finite magnitude per
    trainable variable), written in the skipped branch only. They are not state:
    ``model.save`` leaves them out (the file holds the variables an optimizer
    without diagnostics holds, so either kind loads it), and a loaded optimizer
    starts them afresh. ``get_config`` keeps ``diagnose`` and ``history`` when they
    are set, so ``keras.models.load_model`` rebuilds an optimizer that diagnoses
    as the saved one did.

    Args:
        inner_optimizer: The Keras optimizer to wrap.
        scaler_config: The canonical config, a dict (``ScalerConfig.to_dict()``).
        name: The optimizer's name.
        diagnose: Record, in each skipped step, which gradients held inf/NaN
            (:meth:`overflow_report`).
        history: Keep the last ``history`` updates' scale and skip flag on the
            device (:meth:`history`); 0 keeps none.
        **kwargs: Keras's ``LossScaleOptimizer`` arguments: ``initial_scale`` and
            ``dynamic_growth_steps`` set ``init_scale`` and ``growth_interval`` (a
            ``ValueError`` if ``scaler_config`` says otherwise); the others as in Keras.
    """

    # Made by build: the growth tracker and the scale (Keras's names), the hysteresis
    # tracker, the rule, and the counters behind KerasGradScaler's num_steps,
    # num_skipped_steps and last_step_skipped.
    step_counter: Any
    dynamic_scale: Any
    hysteresis_counter: Any
    scaler_rule: Any
    update_count: Any
    skipped_count: Any
    last_skipped: Any
    unscale_factors: Any

    def __init__(self, inner_optimizer: Any, scaler_config: dict[str, Any] | None = None,
                 name: str | None = None, diagnose: bool = False, history: int = 0,
                 **kwargs: Any):
        history = diagnostics_options(diagnose, history)
        config = _merged_config(scaler_config, kwargs)
        if _wrapper_of(inner_optimizer) is not None:
            # Each wrapper would step it with its own scale and skips: one optimizer's
            # moments and iterations, two rules.
            raise RuntimeError(
                f"{type(inner_optimizer).__name__} optimizer {inner_optimizer.name!r} is "
                "wrapped already, by another scaler: one optimizer takes one scaler. Train "
                "with the optimizer that scaler's wrap() returned (KerasGradScaler.of(it) "
                "gives that scaler back), or give this scaler an optimizer of its own, e.g. "
                "type(opt).from_config(opt.get_config())")
        super().__init__(inner_optimizer, initial_scale=f32(config.init_scale),
                         dynamic_growth_steps=config.growth_interval, name=name, **kwargs)
        _WRAPPERS[id(inner_optimizer)] = self
        self._config = config
        # A state given before the build: the variables' start values.
        self._pending_state: ScalerState | None = None
        self._diagnose = diagnose
        self._history_size = history
        # What differs on the Keras backend this process runs.
        self._backend_paths = paths_for(keras.backend.backend())()
        # The variables model.save leaves out: the rule (the config is saved), the
        # counters and the diagnostics.
        self._unsaved_ids: frozenset[int] = frozenset()

    @property
    def scaler_config(self) -> ScalerConfig:
        """The canonical config this optimizer follows."""
        return self._config

    @property
    def diagnose(self) -> bool:
        """Whether skipped steps record which gradients held inf/NaN."""
        return self._diagnose

    @property
    def history_size(self) -> int:
        """How many updates the history ring keeps (0: none)."""
        return self._history_size

    # Keras's LossScaleOptimizer.build, its variables made with their start values (a
    # state loaded before the build, and the rule) as initializers: model.fit on
    # TensorFlow builds the optimizer inside the train step it traces, a trace
    # tf.function discards once it has made the variables, so an assignment after the
    # build would be lost; initializers run outside it. As Keras's own build, the
    # optimizer tracks its variables itself.
    @no_automatic_dependency_tracking
    def build(self, var_list: Any) -> None:
        if self.built:
            return
        start = self._pending_state or ScalerState.initial(self._config)
        self._pending_state = None

        def add(name: str, dtype: str, value: Any) -> Any:
            return self.add_variable(shape=np.shape(value), dtype=dtype, aggregation="none",
                                     name=name, initializer=_exactly(value))

        self.step_counter = add("step_counter", "int", start.growth_tracker)
        self.dynamic_scale = add("dynamic_scale", "float32", start.scale)
        self.inner_optimizer.build(var_list)
        self._build_optimizer(var_list)
        self.hysteresis_counter = add("hysteresis_counter", "int", start.hysteresis_tracker)
        self.scaler_rule = add("scaler_rule", "int32", rule_values(self._config))
        # Not state, so model.save leaves them out, like the rule.
        self.update_count = add("update_count", "int32", 0)
        self.skipped_count = add("skipped_count", "int32", 0)
        self.last_skipped = add("last_skipped", "int32", 0)
        self.unscale_factors = add("unscale_factors", "float32",
                                   np.array(reciprocal_factors(start.scale), np.float32))
        self._unsaved_ids = frozenset([
            id(self.scaler_rule), id(self.update_count), id(self.skipped_count),
            id(self.last_skipped), id(self.unscale_factors),
            *self._build_diagnostics(len(var_list), self._backend_paths.counts_on_device)])

    # ------------------------------------------------------------ state

    def read_state(self) -> ScalerState:
        """Scale and trackers as Python numbers (reads the variables)."""
        if not self.built:
            return self._pending_state or ScalerState.initial(self._config)
        return ScalerState(read_float(self.dynamic_scale), read_int(self.step_counter),
                           read_int(self.hysteresis_counter))

    def write_state(self, config: ScalerConfig, state: ScalerState) -> None:
        """Sets the config and the state (on the variables once they exist)."""
        self.set_scaler_config(config)
        if self.built:
            self._assign_state(state)
        else:
            self._pending_state = state

    def set_scaler_config(self, config: ScalerConfig) -> None:
        """Changes the config; the state stays. Steps traced before follow at their next
        run: ``model.fit``'s, and a loop's own ``tf.function`` or ``jax.jit``.

        The rule is data, not code: its parameters are in the variable ``scaler_rule``,
        which the step reads at run time like the scale. Retracing instead would need
        every function that traced the step (``model.train_function`` of each model the
        optimizer trains, a loop's own ``tf.function`` or ``jax.jit``), which the
        optimizer cannot reach, and could not reach a ``fit`` already running; the
        variable costs a few scalar ops a step. A stateless step (``stateless_apply``
        under ``jax.jit``) reads the values it is given: pass it ``opt.variables``'
        values again after a change, as after any assignment to them.
        """
        self._config = config
        self.initial_scale = f32(config.init_scale)
        self.dynamic_growth_steps = config.growth_interval
        if self.built:
            self.scaler_rule.assign(ops.convert_to_tensor(rule_values(config), "int32"))

    def _assign_state(self, state: ScalerState) -> None:
        self.dynamic_scale.assign(ops.convert_to_tensor(state.scale, "float32"))
        self.unscale_factors.assign(np.array(reciprocal_factors(state.scale), np.float32))
        self.step_counter.assign(ops.cast(state.growth_tracker, self.step_counter.dtype))
        self.hysteresis_counter.assign(ops.cast(state.hysteresis_tracker,
                                                self.hysteresis_counter.dtype))

    # ------------------------------------------------------------ the rule

    def _next(self, finite: Any) -> tuple[Any, Any, Any, Any]:
        """(scale bits, unscale factors, growth_tracker, hysteresis_tracker) after an update
        with ``finite`` (a Python bool or a bool tensor), by the rule in ``scaler_rule``."""
        return self._backend_paths.compiled(next_state)(
            self.dynamic_scale, self.step_counter, self.hysteresis_counter, self.scaler_rule,
            ops.convert_to_tensor(finite, "bool"), self.unscale_factors)

    def _assign_next(self, finite: Any) -> None:
        """Writes and records the state after an update with ``finite`` (bool or tensor)."""
        bits, factors, growth, hyst = self._next(finite)
        scale = F32.from_bits(bits)
        self._record(not finite if isinstance(finite, bool) else ops.logical_not(finite), scale)
        self.unscale_factors.assign(factors)
        self.dynamic_scale.assign(scale)
        self.step_counter.assign(ops.cast(growth, self.step_counter.dtype))
        self.hysteresis_counter.assign(ops.cast(hyst, self.hysteresis_counter.dtype))

    def unscale_gradients(self, grads: list[Any]) -> list[Any]:
        """The gradients of the scaled loss times ``f32(1 / scale)`` (each keeps its dtype)."""
        hi, lo = cast("list[Any]", ops.unstack(ops.convert_to_tensor(self.unscale_factors)))
        return self._backend_paths.unscale(grads, hi, lo)

    def get_unscaled_gradients(self, grads: list[Any]) -> list[Any]:
        """Keras 2's name for :meth:`unscale_gradients` (removed from Keras 3's class)."""
        return self.unscale_gradients(grads)

    def scale_loss(self, loss: Any) -> Any:
        """The loss times the scale, in the loss's dtype (what ``model.fit`` calls). A Python
        number or a NumPy array is made a tensor first, as Keras's class does (an integer
        one a float32 tensor)."""
        if not ops.is_tensor(loss):
            loss = ops.convert_to_tensor(loss)
            if "float" not in keras.backend.standardize_dtype(loss.dtype):
                loss = ops.cast(loss, "float32")
        self._note_loss(loss)
        if not self.built:
            return multiply(loss, *F32.split(F32.int32(f32_bits(self._config.init_scale))))
        return multiply(loss, *F32.split(F32.bits(self.dynamic_scale)))

    def get_scaled_loss(self, loss: Any) -> Any:
        """Keras 2's name for :meth:`scale_loss` (removed from Keras 3's class)."""
        return self.scale_loss(loss)

    def _note_loss(self, loss: Any) -> None:
        self._backend_paths.note_loss(loss)

    # ------------------------------------------------------------ applying

    def check_finite(self, grads: list[Any]) -> Any:
        # spec.unscale_overflows: below MIN_UNSCALABLE 1/scale is inf and every
        # unscaled gradient inf or NaN. Compared on bits: subnormals are flushed.
        unscalable = F32.bits(self.dynamic_scale) >= f32_bits(MIN_UNSCALABLE)
        return ops.logical_and(
            self._backend_paths.all_finite([g for g in grads if g is not None]), unscalable)

    def _apply_checked(self, grads: list[Any], trainable_variables: Any) -> None:
        self._backend_paths.apply(self, grads, trainable_variables)

    def _apply_across_replicas(self, grads: list[Any], trainable_variables: Any) -> None:
        self._backend_paths.apply_across_replicas(self, grads, trainable_variables)

    def _apply_finite(self, grads: list[Any], trainable_variables: Any) -> None:
        """The finite branch: the inner optimizer steps with the unscaled gradients."""
        tvs = trainable_variables or self._optimized_variables
        unscaled = [g if g is None or self._overwritten_by_gradient(v) else u
                    for g, u, v in zip(grads, self.unscale_gradients(grads), tvs, strict=True)]
        self.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)

    def _apply_skipped(self, grads: list[Any] | None, trainable_variables: Any,
                       replicas: list[list[Any]] | None) -> None:
        """The skipped branch: with ``diagnose``, the gradients' counts first (of ``grads``,
        or summed over the local replicas' gradient lists ``replicas``)."""
        if self._diagnose and self._backend_paths.counts_on_device:
            tvs = trainable_variables or self._optimized_variables
            if replicas is None and grads is not None:
                replicas = [list(grads)]
            self._record_overflow(replicas, self._indices(tvs))

    def stateless_apply(self, optimizer_variables: Any, grads: Any,
                        trainable_variables: Any) -> Any:
        if not self.built:
            raise ValueError(f"To call `stateless_apply`, {type(self).__name__} must be built: "
                             "call optimizer.build(trainable_variables) first")
        # The scale is read from optimizer_variables: under JAX's jitted fit the
        # variables themselves hold no value.
        mapping = list(zip(self.variables, optimizer_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping):
            finite = self.check_finite(grads)
        if (not self._diagnose and self._backend_paths.selects_outcomes
                and all(len(v.shape) == 0 for v in self.inner_optimizer.variables)):
            # An inner optimizer without per-variable state (plain SGD: iterations and
            # learning rate): both outcomes computed and selected, which XLA fuses into
            # the update's own pass; a cond's branches write fresh buffers, which glibc's
            # default allocator maps and unmaps at every step. With moments (Adam) the
            # select would copy them, so the cond stays there. diagnose takes the cond
            # too: its counts are computed in the skipped branch only.
            new_tvs, new_ovs = self._stateless_finite(
                optimizer_variables, grads, trainable_variables)
            old_tvs, old_ovs = self._stateless_skipped(
                optimizer_variables, trainable_variables, None)
            pick = partial(select, finite)
            tvs, ovs = list(map(pick, new_tvs, old_tvs)), list(map(pick, new_ovs, old_ovs))
        else:
            tvs, ovs = cast("tuple[Any, Any]", ops.cond(
                finite,
                lambda: self._stateless_finite(optimizer_variables, grads, trainable_variables),
                lambda: self._stateless_skipped(optimizer_variables, trainable_variables, grads)))
        return tvs, self._stateless_next(ovs, finite)

    def _stateless_next(self, optimizer_variables: Any, finite: Any) -> list[Any]:
        """``optimizer_variables`` with the state after an update with ``finite``."""
        mapping = list(zip(self.variables, optimizer_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            self._assign_next(finite)
            return [scope.get_current_value(v) for v in self.variables]

    def _stateless_finite(self, optimizer_variables: Any, grads: Any,
                          trainable_variables: Any) -> Any:
        mapping = list(zip(self.variables, optimizer_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            unscaled = [g if g is None or self._overwritten_by_gradient(v) else u
                        for g, u, v in zip(grads, self.unscale_gradients(grads),
                                           self._optimized_variables, strict=True)]
            new_tvs, new_inner = self.inner_optimizer.stateless_apply(
                self.inner_optimizer.variables, unscaled, trainable_variables)
            own = self._own_values(scope)
        return new_tvs, own + list(new_inner)

    def _stateless_skipped(self, optimizer_variables: Any, trainable_variables: Any,
                           grads: Any) -> Any:
        mapping = list(zip(self.variables, optimizer_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            if self._diagnose and grads is not None:
                # The gradients are in the order of the optimizer's variables.
                self._record_overflow([list(grads)], list(range(len(grads))))
            new = [scope.get_current_value(v) for v in self.variables]
        return trainable_variables, new

    # ------------------------------------------------------------ diagnostics

    def overflow_report(self, names: dict[int, tuple[str, Any]] | None = None
                        ) -> OverflowReport | None:
        """Which gradients held inf/NaN at the last update, if it skipped; else None.

        Each gradient is named by its variable's ``.path`` (``names``, from
        :meth:`KerasGradScaler.watch`, renames). ``step`` counts this optimizer's
        updates since it was built (or loaded); ``max_finite`` is of the unscaled
        gradient (the scaled one's largest finite magnitude times ``f32(1 / scale)``).

        - TensorFlow and JAX: with ``diagnose=True``, from the record the skipped branch
          of the compiled step wrote; ``loss_finite`` is None (the loss stays in the
          step). With ``diagnose=False`` and ``history=N``, the last update's step and
          scale from the history, no gradient listed, and a note to use diagnose=True.
          With neither, nothing is recorded: RuntimeError.
        - torch: with ``diagnose=True`` computed during the skipped ``apply`` (from the
          gradients, unscaled in place by then); without, computed on the first call
          from the gradients as they are now (``model.fit`` keeps them until the next
          step; once freed the report lists none and says so). ``loss_finite``: whether
          the last loss given to ``scale_loss`` was finite.
        - Under ``tf.distribute``, the counts are summed over the worker's replicas
          (replicas that each run the update, XLA on GPUs, record no counts: a note says so).

        Raises:
            RuntimeError: TensorFlow or JAX, built with neither ``diagnose`` nor ``history``.
        """
        return self._backend_paths.overflow_report(self, names)

    # ------------------------------------------------------------ serialisation

    def _saved_variables(self) -> list[Any]:
        return [v for v in self.variables if id(v) not in self._unsaved_ids]

    def save_own_variables(self, store: Any) -> None:
        """As Keras's, without the rule's and the diagnostics' variables."""
        for i, variable in enumerate(self._saved_variables()):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        """As Keras's, into the variables :meth:`save_own_variables` writes: a file saved
        with or without diagnostics loads into an optimizer with or without them."""
        variables = self._saved_variables()
        scale: float | None = None
        if len(store.keys()) != len(variables):
            # What Keras's own does: a warning, and nothing loaded.
            warnings.warn(f"Skipping variable loading for optimizer '{self.name}', because it "
                          f"has {len(variables)} variables whereas the saved optimizer has "
                          f"{len(store.keys())} variables. ", stacklevel=2)
            return
        for i, variable in enumerate(variables):
            value = store[str(i)]
            variable.assign(value)
            if variable is self.dynamic_scale:
                # Read from the file's value ([()]: an h5py dataset or an array): a
                # variable's own conversion warns under NumPy 2 (no copy argument), which
                # loading turns into an error.
                scale = float(value[()])
        assert scale is not None  # dynamic_scale is one of the saved variables
        self.unscale_factors.assign(np.array(reciprocal_factors(scale), np.float32))

    def get_config(self) -> dict[str, Any]:
        """Keras's config and ``scaler_config``; ``diagnose`` and ``history`` when set (so a
        loaded model diagnoses as the saved one did; its records start afresh)."""
        config = super().get_config()
        config["scaler_config"] = self._config.to_dict()
        if self._diagnose:
            config["diagnose"] = True
        if self._history_size:
            config["history"] = self._history_size
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any],
                    custom_objects: Any = None) -> SpecLossScaleOptimizer:
        """As Keras's, with a clear error for a config that is not :meth:`get_config`'s
        (Keras's own raises ``KeyError: 'inner_optimizer'``).

        Example:
            >>> import keras, unifiedamp as ua
            >>> opt = ua.GradScaler(1024.0, backend="keras").wrap(keras.optimizers.SGD(0.1))
            >>> type(opt).from_config(opt.get_config()).scaler_config.init_scale
            1024.0
        """
        if not isinstance(config, dict) or "inner_optimizer" not in config:
            keys = sorted(config) if isinstance(config, dict) else type(config).__name__
            raise ValueError(f"{cls.__name__}.from_config: the config has no "
                             f"'inner_optimizer' (got {keys}): pass the dict get_config() "
                             "returns, which holds the wrapped optimizer's config")
        return super().from_config(config, custom_objects=custom_objects)
