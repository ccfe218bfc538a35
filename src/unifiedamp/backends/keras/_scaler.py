"""The Keras backend's scaler, :class:`KerasGradScaler`: ``wrap(optimizer)`` returns the wrapper
(``_optimizer.py``), whose variables the scaler reads and writes; without ``wrap`` an eager
custom loop drives the scaler itself with the protocol every backend shares.
"""

from __future__ import annotations

import sys
from typing import Any, cast

import keras
import numpy as np
from keras import ops

from unifiedamp import spec
from unifiedamp._scaler import GradScaler, is_flag, new_scale_value
from unifiedamp._tree import leaves, refuse_foreign, tree_map
from unifiedamp.backends._imperative import (
    HostCounters,
    diagnostics_options,
    update_arguments,
    watched_pairs,
)
from unifiedamp.diagnostics import OverflowReport, ScaleHistory
from unifiedamp.errors import NoInfChecksError
from unifiedamp.spec import MIN_UNSCALABLE, ScalerConfig, ScalerState, f32_bits

from ._optimizer import SpecLossScaleOptimizer, paths_for
from ._paths import F32, multiply, read_int, select, unscale_factors

# ------------------------------------------------------------ the protocol's flag


#: Keras's backend -> the modules of the tensors ``keras.ops`` takes as they are.
_BACKEND_MODULES = {"tensorflow": ("tensorflow",), "jax": ("jax", "jaxlib"), "torch": ("torch",)}


def _refuse_foreign(tree: Any, what: str) -> None:
    backend = keras.backend.backend()
    refuse_foreign(tree, what=what, own=("keras", "numpy", *_BACKEND_MODULES.get(backend, ())),
                   expected=f"Keras tensors ({backend}), NumPy arrays or numbers",
                   convert="keras.ops.convert_to_tensor (another framework's tensor: "
                           "through NumPy)")


def _traced(value: Any) -> bool:
    """Whether ``value`` is a symbolic value the host cannot read: a KerasTensor, a tensor
    of a ``tf.function`` graph, a JAX tracer (frameworks looked up only when imported)."""
    if isinstance(value, keras.KerasTensor):
        return True
    tf = sys.modules.get("tensorflow")
    if tf is not None and tf.is_tensor(value):
        return bool(tf.is_symbolic_tensor(value))
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.core.Tracer)


def _host_flag(finite: Any) -> bool:
    """The flag as a Python bool (a host read); a symbolic flag is refused."""
    if isinstance(finite, (bool, np.bool_)):
        return bool(finite)
    if _traced(finite):
        raise TypeError(
            f"update(finite) got a symbolic flag ({type(finite).__name__}) inside a compiled "
            "function (tf.function, jax.jit): update() reads the flag on the host, in an "
            "eager loop. Inside a compiled step, use the optimizer scaler.wrap(optimizer) "
            "returns: its apply(grads) checks, skips and updates on the device")
    return bool(ops.convert_to_numpy(finite))


# ------------------------------------------------------------ the scaler


class KerasGradScaler(HostCounters, GradScaler):
    """A dynamic loss scaler for Keras 3 on any Keras backend; ``wrap(optimizer)`` applies it.

    The scaler and the optimizer it wraps are two objects: ``wrap`` returns the Keras
    optimizer (a :class:`SpecLossScaleOptimizer`), and the scaler reads and writes that
    optimizer's variables (``get_scale``, ``state``, ``state_dict``, ``load_state_dict``,
    the setters, ``num_steps``...). The optimizer's ``apply()`` (and ``model.fit``)
    checks, steps or skips, and updates the scale, inside the compiled step.

    Without ``wrap``, an eager custom loop drives the scaler itself with the protocol
    every backend shares: ``scaled = scaler.scale(loss)``, the gradients of ``scaled``,
    ``grads, finite = scaler.unscale(grads)``, the step where ``finite``, then
    ``scaler = scaler.update(finite)``, which reads the flag (a host read) and applies
    the spec's rule to the scale the scaler holds.

    Args:
        *args: ``init_scale, growth_factor, backoff_factor, growth_interval, enabled``.
        diagnose: The wrapped optimizer records, in each skipped step, which gradients
            held inf/NaN (:meth:`overflow_report`); on TensorFlow and JAX only in the
            compiled step's skipped branch, so a step that does not skip costs nothing more.
        history: The wrapped optimizer keeps the last ``history`` updates' scale and skip
            flag in device variables (:meth:`history`); 0 keeps none.
        **kwargs: The other config parameters, by canonical name or alias (Keras's
            ``initial_scale``, ``dynamic_growth_steps``).

    Example:
        >>> import keras, numpy as np
        >>> import unifiedamp as ua
        >>> scaler = ua.GradScaler(1024.0, growth_interval=2, backend="keras")
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer=scaler.wrap(keras.optimizers.SGD(0.1)), loss="mse")
        >>> _ = model.fit(np.ones((4, 3)), np.ones((4, 1)), epochs=2, verbose=0)
        >>> scaler.get_scale(), scaler.state.growth_tracker
        (2048.0, 0)
        >>> scaler.num_steps, scaler.num_skipped_steps, scaler.last_step_skipped
        (2, 0, False)

        Without ``wrap``, the protocol every backend shares (eager):

        >>> scaler = ua.GradScaler(1024.0, backend="keras")
        >>> grads, finite = scaler.unscale([np.array([2048.0, np.inf], np.float32)])
        >>> scaler.update(finite).get_scale(), scaler.last_step_skipped
        (512.0, True)
    """

    backend = "keras"
    capabilities = frozenset({"wrap", "watch", "overflow_report", "history"})

    def __init__(self, *args: Any, diagnose: bool = False, history: int = 0, **kwargs: Any):
        self._history_size = diagnostics_options(diagnose, history)
        self._diagnose = diagnose
        self._config = spec.config_from_args(args, kwargs,
                                             extra_names=("backend", "diagnose", "history"))
        self._state = ScalerState.initial(self._config)
        self._optimizer: SpecLossScaleOptimizer | None = None
        # What differs on the Keras backend this process runs (the finiteness test).
        self._backend_paths = paths_for(keras.backend.backend())
        # watch(): id of a variable (or of the torch tensor it holds) -> (name, variable).
        self._watched: dict[int, tuple[str, Any]] = {}
        # The history of the updates update(finite) makes (a loop without wrap); they are
        # counted by HostCounters' _count.
        self._host_history: list[tuple[int, float, bool]] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.state}, {self.config})"

    def wrap(self, optimizer: Any) -> Any:
        """The Keras optimizer that applies this scaler around ``optimizer``.

        A :class:`SpecLossScaleOptimizer` (a ``keras.optimizers.LossScaleOptimizer``, so
        ``model.compile`` keeps it as it is); with ``enabled=False``, ``optimizer`` itself.
        A scaler wraps one optimizer, and an optimizer takes one scaler: wrapping it
        again (by this scaler or another) raises, naming the optimizer to use instead.
        """
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"wrap() takes a keras.optimizers.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise TypeError("the optimizer is a LossScaleOptimizer already: wrap its "
                            "inner_optimizer")
        if self._optimizer is not None:
            if optimizer is self._optimizer.inner_optimizer:
                raise RuntimeError("this scaler wraps this optimizer already: train with the "
                                   "optimizer the first wrap() returned (scaler.optimizer)")
            raise RuntimeError("this scaler wraps an optimizer already: make one scaler per "
                               "optimizer (each holds its own scale)")
        if not self._config.enabled:
            return optimizer
        wrapped = SpecLossScaleOptimizer(optimizer, scaler_config=self._config.to_dict(),
                                         diagnose=self._diagnose, history=self._history_size)
        wrapped.write_state(self._config, self._state)
        self._optimizer = wrapped
        return wrapped

    @classmethod
    def of(cls, optimizer: SpecLossScaleOptimizer) -> KerasGradScaler:
        """The scaler of an optimizer built by ``wrap`` (e.g. after ``keras.models.load_model``).

        Example:
            >>> import keras
            >>> opt = KerasGradScaler(8.0).wrap(keras.optimizers.SGD())
            >>> KerasGradScaler.of(opt).get_scale()
            8.0
        """
        if not isinstance(optimizer, SpecLossScaleOptimizer):
            raise TypeError(f"KerasGradScaler.of takes an optimizer made by "
                            f"KerasGradScaler.wrap, got {type(optimizer).__name__}")
        scaler = cls(**optimizer.scaler_config.to_dict(), diagnose=optimizer.diagnose,
                     history=optimizer.history_size)
        scaler._optimizer = optimizer
        return scaler

    @property
    def optimizer(self) -> SpecLossScaleOptimizer | None:
        """The optimizer ``wrap`` returned (None before, and when disabled)."""
        return self._optimizer

    # ------------------------------------------------------------ config and state

    @property
    def config(self) -> ScalerConfig:
        return self._optimizer.scaler_config if self._optimizer is not None else self._config

    @property
    def state(self) -> ScalerState:
        return self._optimizer.read_state() if self._optimizer is not None else self._state

    def is_enabled(self) -> bool:
        return self._config.enabled

    def get_scale(self) -> float:
        """The current scale (reads the optimizer's variable); 1.0 when disabled."""
        return self.state.scale if self._config.enabled else 1.0

    def _reconfigure(self, config: ScalerConfig) -> KerasGradScaler:
        """Sets the config (in the wrapped optimizer's ``scaler_rule`` too); returns self.

        What the setters (``set_growth_factor``...) call. Steps compiled before follow
        from their next run (``fit``'s, a loop's ``tf.function`` or ``jax.jit``: see
        :meth:`SpecLossScaleOptimizer.set_scaler_config`); so does
        :meth:`load_state_dict`.

        Example:
            >>> import keras, numpy as np
            >>> scaler = KerasGradScaler(8.0, growth_interval=1)
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
            >>> x, y = np.ones((1, 2)), np.ones((1, 1))
            >>> _ = model.train_on_batch(x, y)
            >>> scaler.set_growth_factor(4.0) is scaler
            True
            >>> _ = model.train_on_batch(x, y)
            >>> scaler.get_scale()
            64.0
        """
        if self._optimizer is not None:
            self._optimizer.set_scaler_config(config)
        self._config = config
        return self

    # ------------------------------------------------------------ the counters

    def _counter(self, name: str) -> int:
        # The wrapped optimizer's int32 variable (a host read); 0 before it is built.
        opt = self._optimizer
        if opt is None or not opt.built:
            return 0
        return read_int(getattr(opt, name))

    @property
    def num_steps(self) -> int:
        """Updates made since the scaler was made: the wrapped optimizer's (counted on the
        device in each ``apply``, read here; they restart at 0 in a loaded optimizer) and
        those ``update(finite)`` made before a wrap. A disabled scaler makes none, nor
        does ``update(new_scale=...)``."""
        return self._updates + self._counter("update_count")

    @property
    def num_skipped_steps(self) -> int:
        """Of :attr:`num_steps`, the updates whose gradients were not all finite."""
        return self._skipped + self._counter("skipped_count")

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last update's gradients were not all finite (its step skipped);
        False before the first."""
        if self._counter("update_count"):
            return bool(self._counter("last_skipped"))
        return self._last_skipped

    def state_dict(self) -> dict[str, Any]:
        """The canonical dict, from the wrapped optimizer's variables."""
        return spec.to_state_dict(self.config, self.state, self.backend)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a canonical dict of any backend (or a native torch/Paddle dict) into the
        wrapped optimizer's variables; validated before anything is written."""
        config, state = spec.parse_state_dict(state_dict, base=self.config)
        config = config.replace(enabled=self._config.enabled)
        self._write(config, state)

    def _write(self, config: ScalerConfig, state: ScalerState) -> None:
        if self._optimizer is not None:
            self._optimizer.write_state(config, state)
        self._config, self._state = config, state

    # ------------------------------------------------------------ the verbs

    def _scale_bits(self) -> Any:
        # The optimizer's variable once it exists (no host read), else the held state.
        if self._optimizer is not None and self._optimizer.built:
            return F32.bits(self._optimizer.dynamic_scale)
        return F32.int32(f32_bits(self.state.scale))

    def scale(self, outputs: Any) -> Any:
        """Multiplies a tensor (or a list/tuple/dict of them) by the scale, dtypes kept."""
        _refuse_foreign(outputs, "scale()")
        if not self._config.enabled:
            return outputs
        if self._optimizer is not None:
            self._optimizer._note_loss(outputs)  # torch: for the report's loss_finite
        bits = self._scale_bits()
        return tree_map(lambda x: multiply(ops.convert_to_tensor(x), *F32.split(bits)), outputs)

    def unscale(self, grads: Any) -> tuple[Any, Any]:
        """``(grads times f32(1 / scale), all finite)``; the check decides nothing by itself:
        the wrapped optimizer's ``apply`` checks and updates."""
        _refuse_foreign(grads, "unscale()")
        if not self._config.enabled:
            return grads, ops.convert_to_tensor(True)
        bits = self._scale_bits()
        tensors = tree_map(ops.convert_to_tensor, grads)
        finite = ops.logical_and(self._backend_paths.all_finite(leaves(tensors)),
                                 bits >= f32_bits(MIN_UNSCALABLE))
        hi, lo = cast("list[Any]", ops.unstack(self._backend_paths.compiled(unscale_factors)(bits)))
        return tree_map(lambda g: multiply(g, hi, lo), tensors), finite

    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` where ``finite``, else ``old``, leaf by leaf with ``keras.ops.where`` (no
        host read, so it runs inside a compiled step too): two trees of the same structure,
        e.g. the variables' values after and before a step. Each result has ``old``'s
        dtype; ``None`` leaves stay None.

        Example:
            >>> import numpy as np
            >>> from keras import ops
            >>> s = KerasGradScaler()
            >>> new = [np.float32(1.0), np.ones(2, np.float32)]
            >>> old = [np.float32(0.0), np.zeros(2, np.float32)]
            >>> out = s.where_finite(ops.convert_to_tensor(False), new, old)
            >>> [ops.convert_to_numpy(x).tolist() for x in out]
            [0.0, [0.0, 0.0]]
            >>> ops.convert_to_numpy(s.where_finite(True, new, old)[1]).tolist()
            [1.0, 1.0]
        """
        if not is_flag(finite) or tuple(getattr(finite, "shape", ())) != ():
            raise TypeError(f"where_finite(finite, new, old) takes the one flag unscale() "
                            f"returns (a bool or a 0-d bool tensor), got {finite!r:.80}")
        _refuse_foreign((new, old), "where_finite()")

        def leaf(n: Any, o: Any) -> Any:
            if n is None and o is None:
                return None
            return select(finite, ops.convert_to_tensor(n), o)

        return tree_map(leaf, new, old)

    def update(self, finite: Any = None, *, new_scale: Any = None) -> KerasGradScaler:
        """The protocol's update, for a loop that does not ``wrap`` an optimizer: applies the
        spec's rule to the scale this scaler holds, from ``finite`` (the flag
        :meth:`unscale` returned: a bool or a 0-d bool tensor, read on the host), counts the
        update and returns the scaler itself.

        ``new_scale`` (a number or a one-element tensor; a number as the first argument, as
        in torch) sets the scale instead, the trackers kept, not counted as an update; also
        with a wrapped optimizer (its variable is written).

        Raises:
            RuntimeError: The scaler wraps an optimizer: its ``apply()`` (and
                ``model.fit``) updates the scale at each step already.
            NoInfChecksError: No flag: the Keras backend records no checks.
            TypeError: A flag inside a compiled function (``tf.function``, ``jax.jit``),
                which the host cannot read: compile the step with ``wrap()`` instead.

        Example:
            >>> import numpy as np
            >>> s = KerasGradScaler(8.0)
            >>> s.update(np.bool_(False)) is s, s.get_scale(), s.update(2.0).get_scale()
            (True, 4.0, 2.0)
        """
        finite, new_scale = update_arguments(finite, new_scale)
        if not self._config.enabled:
            return self
        if new_scale is not None:
            if ops.is_tensor(new_scale):
                new_scale = ops.convert_to_numpy(new_scale)
            state = self.state._replace(scale=new_scale_value(new_scale))
            self._write(self.config, state)
            return self
        if self._optimizer is not None:
            raise RuntimeError(
                "update() was called on a scaler that wraps an optimizer: the wrapped "
                "optimizer's apply() (and model.fit) checks the gradients and updates the "
                "scale at every step, so update() would apply the rule a second time. Drop "
                "the update() call (scaler.last_step_skipped and num_skipped_steps tell what "
                "apply() decided), or drive a scaler that wraps nothing: scale(loss), "
                "unscale(grads), update(finite)")
        if finite is None:
            raise NoInfChecksError(
                "No inf checks were recorded prior to update(): the keras backend records "
                "none. Pass the flag unscale() returned: grads, finite = scaler.unscale(grads); "
                "scaler.update(finite) (or let a wrapped optimizer's apply() update)")
        found_inf = not _host_flag(finite)
        self._state = spec.update(self._config, self._state, found_inf)
        self._count(found_inf)
        if self._history_size:  # the scale the update left
            self._host_history.append((self._updates, self._state.scale, found_inf))
            del self._host_history[:-self._history_size]
        return self

    # ------------------------------------------------------------ diagnostics

    def watch(self, model: Any) -> None:
        """Names the variables in :meth:`overflow_report`.

        Without it each gradient is named by its variable's ``.path``
        (``"sequential/dense/kernel"``), the name the model gives it, so ``watch`` is
        optional here. ``model`` may be a Keras model or layer (its variables keep their
        paths: nothing changes), a dict ``name -> variable``, an iterable of
        ``(name, variable)`` pairs, or an object with ``named_parameters()`` (on the torch
        Keras backend, the torch parameters a Keras variable holds match too). Matched
        by identity; calls add up (a later name wins); every pair is checked first.

        Example:
            >>> import keras
            >>> scaler = KerasGradScaler(8.0, diagnose=True)
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> scaler.watch({"w": model.layers[0].kernel})
            >>> scaler.watch(model)  # the paths: changes nothing
        """
        if isinstance(model, keras.layers.Layer):
            pairs = [(v.path, v) for v in model.variables]
        else:
            pairs = watched_pairs(model, lambda v: True, "variable")
        for name, variable in pairs:
            self._watched[id(variable)] = (name, variable)

    def overflow_report(self) -> OverflowReport | None:
        """After a skipped update, which gradients held inf/NaN; None when the last update
        skipped nothing, before the first, and when the scaler is disabled.

        Read from the wrapped optimizer (see
        :meth:`SpecLossScaleOptimizer.overflow_report` for what each Keras backend
        records); names from :meth:`watch`, else each variable's ``.path``.

        Raises:
            RuntimeError: TensorFlow or JAX, with neither ``diagnose`` nor ``history``.

        Example:
            >>> import keras, numpy as np
            >>> scaler = KerasGradScaler(1024.0, diagnose=True)
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="fc")],
            ...                          name="net")
            >>> model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
            >>> _ = model.train_on_batch(np.array([[1.0, np.inf]]), np.ones((1, 1)))
            >>> report = scaler.overflow_report()
            >>> report.step, report.scale, report.names
            (1, 1024.0, ['net/fc/kernel', 'net/fc/bias'])
            >>> _ = model.train_on_batch(np.ones((1, 2)), np.ones((1, 1)))
            >>> scaler.overflow_report() is None
            True
        """
        if self._optimizer is None:
            return None
        return self._optimizer.overflow_report(self._watched)

    def history(self) -> ScaleHistory:
        """The last ``history`` updates (oldest first), a
        :class:`unifiedamp.diagnostics.ScaleHistory`: iteration (the wrapped optimizer's
        updates since it was built, from 1), the scale that update left (what
        :meth:`get_scale` returns after it), whether it skipped. Empty before the optimizer
        is built (and when disabled).

        Raises:
            ValueError: Built with ``history=0`` (the default).

        Example:
            >>> import keras, numpy as np
            >>> scaler = KerasGradScaler(8.0, growth_interval=1, history=2)
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
            >>> for x in ([[1.0, 1.0]], [[np.inf, 1.0]], [[1.0, 1.0]]):
            ...     _ = model.train_on_batch(np.array(x), np.ones((1, 1)))
            >>> scaler.history().as_list()  # 8 -> 16, backed off to 8, -> 16
            [(2, 8.0, True), (3, 16.0, False)]
        """
        if not self._history_size:
            raise ValueError("this scaler keeps no history: build it with history=N (e.g. "
                             "KerasGradScaler(..., history=1000)) to keep the last N updates")
        if self._optimizer is None:
            records = self._host_history
            return ScaleHistory([r[0] for r in records], [r[1] for r in records],
                                [r[2] for r in records])
        return self._optimizer.history()

    @classmethod
    def devices(cls) -> list[str]:
        """The devices of the framework Keras computes with (``keras.backend.backend()``:
        tensorflow, jax or torch), where the scale and the train step run: ``cpu:0``,
        ``gpu:0`` as Keras names them; torch's own names (``cpu``, ``cuda:0``) under torch,
        which Keras's distribution API does not cover."""
        backend = keras.backend.backend()
        if backend == "torch":
            import torch

            return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        if backend in ("tensorflow", "jax"):
            return list(keras.distribution.list_devices())
        return ["cpu"]  # Keras's numpy and openvino backends compute on the host
