"""The NumPy backend: the reference imperative scaler, with torch's verbs.

NumPy has no optimizers, so the backend defines a small protocol. An
optimizer is any object with:

- ``params``: a list of NumPy arrays;
- ``grads``: a list of the same length, each a floating-point NumPy array or
  ``None``, read and unscaled in place by ``unscale_``;
- ``step()``: applies ``grads`` to ``params``.

:class:`SGD` below is such an optimizer, in a few lines.

After a skipped step, ``scaler.overflow_report()`` names the gradients that held
inf/NaN: by the names given to ``scaler.watch(...)`` (matched to
``optimizer.params`` by identity), else ``params[i]``, the index in
``optimizer.params`` (``optimizers[k].params[i]`` when several optimizers were
checked in that iteration, ``k`` counting them in the order they were unscaled).
"""

from __future__ import annotations

import enum
import functools
import numbers
from typing import Any

import numpy as np

from unifiedamp import spec
from unifiedamp._monitor import CollapseMonitor
from unifiedamp._scaler import GradScaler, new_scale_value
from unifiedamp._tree import refuse_foreign, tree_map
from unifiedamp.backends._imperative import (
    Flags,
    HostState,
    ImperativeDiagnostics,
    LastUpdate,
    diagnostics_options,
    mid_iteration_load_error,
    report_note,
    update_arguments,
)
from unifiedamp.diagnostics import OverflowReport, count_overflow
from unifiedamp.errors import NoInfChecksError
from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["NumpyGradScaler", "SGD"]


class SGD:
    """Stochastic gradient descent with optional momentum, over NumPy arrays.

    The reference optimizer of the NumPy optimizer protocol.

    Example:
        >>> import numpy as np
        >>> w = np.ones(2, np.float32)
        >>> opt = SGD([w], lr=0.5)
        >>> opt.grads = [np.array([1.0, 2.0], np.float32)]
        >>> opt.step(); w
        array([0.5, 0. ], dtype=float32)
    """

    def __init__(self, params: list[np.ndarray], lr: float = 0.01, momentum: float = 0.0):
        self.params = list(params)
        self.grads: list[np.ndarray | None] = [None] * len(self.params)
        self.lr = lr
        self.momentum = momentum
        self.velocity = [np.zeros_like(p) for p in self.params]
        self.step_count = 0

    def zero_grad(self) -> None:
        self.grads = [None] * len(self.params)

    def step(self) -> None:
        for param, grad, velocity in zip(self.params, self.grads, self.velocity, strict=True):
            if grad is None:
                continue
            if self.momentum:
                velocity *= self.momentum
                velocity += grad
                grad = velocity
            param -= (self.lr * grad).astype(param.dtype)
        self.step_count += 1


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _as_float_array(x: Any, what: str) -> np.ndarray:
    # np.asarray would quietly copy another framework's tensor (a torch tensor, a JAX
    # array) to the host: refused, as every backend refuses another framework's arrays.
    _refuse_foreign(x, what=what)
    if not isinstance(x, (np.ndarray, np.generic, numbers.Number)):
        raise TypeError(
            f"{what} takes NumPy arrays or numbers or a list/tuple/dict of them, got a "
            f"{type(x).__name__} leaf ({x!r:.80}); convert it with np.asarray")
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{what} must hold floating-point values, got dtype {a.dtype}")
    return a


#: Names in pickles of the previous release -> their names now.
_PICKLED_NAMES = {"_last_output": "_scale_input"}


#: The flags update() takes: the bool unscale() returns, a NumPy bool.
_FLAGS = Flags((bool, np.bool_, np.ndarray), "numpy", "(a bool or a NumPy bool)", "np.asarray")
#: The error for another framework's arrays, in the words every backend uses.
_refuse_foreign = functools.partial(
    refuse_foreign, own=("numpy",), expected="NumPy arrays or numbers",
    convert="np.asarray (a torch tensor: t.detach().cpu().numpy())")


class NumpyGradScaler(ImperativeDiagnostics, HostState, GradScaler):
    """A dynamic loss scaler for NumPy training loops, with ``torch.amp.GradScaler``'s verbs.

    Takes every :class:`unifiedamp.spec.ScalerConfig` parameter (aliases too)
    plus two collapse-monitoring options.

    Args:
        *args: ``init_scale, growth_factor, backoff_factor, growth_interval, enabled``.
        max_consecutive_skips: After this many consecutive skipped iterations,
            warn once (``None``: only warn when the scale drops below float32's
            smallest normal number).
        on_collapse: ``"warn"`` or ``"raise"`` when the scale collapses.
        diagnose: Compute the :meth:`overflow_report` of every skipped update when it
            happens (its gradients are still there), so that it survives ``zero_grad()``.
            Non-skipped updates cost nothing either way.
        history: Keep the last ``history`` updates' ``(iteration, scale, skipped)`` in a
            ring, read by :meth:`history` (0: none).
        **kwargs: The other config parameters, by canonical name or alias.

    Example:
        >>> import numpy as np
        >>> from unifiedamp.backends.numpy import NumpyGradScaler, SGD
        >>> w = np.zeros(3, np.float32)
        >>> opt = SGD([w], lr=0.1)
        >>> scaler = NumpyGradScaler(1024.0, growth_interval=2)
        >>> loss_grad = np.ones(3, np.float32)           # d(loss)/dw
        >>> opt.grads = [scaler.scale(loss_grad)]        # as if backpropagated from scale(loss)
        >>> scaler.step(opt); _ = scaler.update()
        >>> w, scaler.get_scale(), scaler.last_step_skipped
        (array([-0.1, -0.1, -0.1], dtype=float32), 1024.0, False)
        >>> opt.grads = [np.array([np.inf, 0, 0], np.float32)]
        >>> scaler.step(opt); _ = scaler.update()
        >>> w, scaler.get_scale(), scaler.last_step_skipped
        (array([-0.1, -0.1, -0.1], dtype=float32), 512.0, True)
    """

    backend = "numpy"
    capabilities = frozenset({"unscale_", "step", "watch", "overflow_report", "history"})
    _parameter_type = np.ndarray
    _parameter_kind = "numpy array"

    def __init__(
        self,
        *args: Any,
        max_consecutive_skips: int | None = 100,
        on_collapse: str = "warn",
        diagnose: bool = False,
        history: int = 0,
        **kwargs: Any,
    ):
        history_size = diagnostics_options(diagnose, history)
        self._config = spec.config_from_args(
            args, kwargs, extra_names=("max_consecutive_skips", "on_collapse", "backend",
                                       "diagnose", "history")
        )
        self._monitor = CollapseMonitor(max_consecutive_skips, on_collapse)
        self._state = ScalerState.initial(self._config)
        self._stages: dict[int, _Stage] = {}
        # Every unscale check since the last update: optimizer id -> found_inf,
        # plus the checks of the functional unscale().
        self._found_inf: dict[int, bool] = {}
        self._functional_found_inf: list[bool] = []
        self._updates = 0
        self._init_diagnostics(diagnose, history_size)

    # ------------------------------------------------------------ state and config

    def _reconfigure(self, config: ScalerConfig) -> NumpyGradScaler:
        self._config = config
        return self

    def state_dict(self) -> dict[str, Any]:
        """The canonical dict; a disabled scaler returns it too, with ``enabled`` False.

        Example:
            >>> NumpyGradScaler(8.0).state_dict()["scale"]
            8.0
        """
        return spec.to_state_dict(self._config, self._state, self.backend)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores config and state from a canonical dict of any backend or a native one.

        ``enabled`` stays as this scaler was built: whether to scale at all is a
        property of the run (device, dtype), not of the checkpoint. A dict that
        fails validation raises and leaves the scaler unchanged.

        Example:
            >>> a, b = NumpyGradScaler(8.0), NumpyGradScaler()
            >>> b.load_state_dict(a.state_dict()); b.get_scale()
            8.0
        """
        if self._found_inf or self._functional_found_inf:
            raise mid_iteration_load_error()
        config, state = spec.parse_state_dict(state_dict, base=self._config)
        self._config = config.replace(enabled=self._config.enabled)
        self._state = state

    # ------------------------------------------------------------ the verbs

    def scale(self, outputs: Any) -> Any:
        """Multiplies outputs (an array, a float, or a list/tuple/dict of them) by the scale.

        Each array keeps its dtype: the product is taken in at least float32 and
        cast back, so a float16 loss that overflows when scaled becomes inf.

        Example:
            >>> import numpy as np
            >>> NumpyGradScaler(4.0).scale({"loss": np.float16(0.5)})
            {'loss': np.float16(2.0)}
        """
        if not self._config.enabled:
            return outputs
        factor = np.float32(self._state.scale)

        def scale_one(x: Any) -> Any:
            if isinstance(x, float):
                return x * float(factor)
            a = _as_float_array(x, "scale()")
            # Overflow to inf is what loss scaling detects, not an error.
            with np.errstate(over="ignore"):
                out = (a * factor).astype(a.dtype, copy=False)
            return out if isinstance(x, np.ndarray) else out[()]

        scaled = tree_map(scale_one, outputs)
        # For overflow_report().loss_finite, read only after a skipped update.
        single = isinstance(outputs, (np.ndarray, np.generic, float))
        self._scale_input = outputs if single else None
        return scaled

    def _inv_scale(self) -> np.float32:
        # The reciprocal in float64, rounded once: what torch does, so that
        # unscaled gradients match torch's bit for bit (inf for a scale below ~2.9e-39,
        # where every check finds inf: spec.unscale_overflows).
        with np.errstate(over="ignore", divide="ignore"):
            return np.float32(np.float64(1.0) / self._state.scale)

    def unscale(self, grads: Any) -> tuple[Any, bool]:
        """Functional unscale: returns ``(unscaled copy of grads, all finite)``.

        The check counts towards the next ``update()`` like an ``unscale_`` call.

        Example:
            >>> import numpy as np
            >>> s = NumpyGradScaler(4.0)
            >>> s.unscale([np.array([8.0], np.float32)])
            ([array([2.], dtype=float32)], True)
        """
        if not self._config.enabled:
            return grads, True
        inv = self._inv_scale()
        finite = not spec.unscale_overflows(self._state.scale)

        def unscale_one(g: Any) -> Any:
            nonlocal finite
            a = _as_float_array(g, "unscale()")
            finite = finite and bool(np.isfinite(a).all())
            with np.errstate(over="ignore", invalid="ignore"):
                out = (a * inv).astype(a.dtype, copy=False)
            return out if isinstance(g, np.ndarray) else out[()]

        out = tree_map(unscale_one, grads)
        self._functional_found_inf.append(not finite)
        return out, finite

    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` if ``finite`` (a bool: what :meth:`unscale` returns), else ``old``.

        Example:
            >>> s = NumpyGradScaler()
            >>> s.where_finite(False, [1.0, 2.0], [0.0, 0.0])
            [0.0, 0.0]
        """
        _refuse_foreign((finite, new, old), what="where_finite()")
        keep = bool(finite)
        return tree_map(lambda n, o: n if keep else o, new, old)

    def _grads_of(self, optimizer: Any) -> list[np.ndarray]:
        missing = [a for a in ("params", "grads", "step") if not hasattr(optimizer, a)]
        if missing:
            raise TypeError(
                f"the numpy backend needs an optimizer with .params, .grads (lists of numpy "
                f"arrays) and .step(); {type(optimizer).__name__} has no {', '.join(missing)}"
            )
        grads = []
        for i, g in enumerate(optimizer.grads):
            if g is None:
                continue
            if not isinstance(g, np.ndarray) or not np.issubdtype(g.dtype, np.floating):
                raise TypeError(
                    f"optimizer.grads[{i}] must be a floating-point numpy array (it is "
                    f"unscaled in place), got {type(g).__name__}"
                )
            # Checked for every gradient before any is divided: a failure half-way
            # would leave some unscaled, and a retry would divide them twice.
            if not g.flags.writeable:
                raise ValueError(
                    f"optimizer.grads[{i}] is read-only, and unscale_ divides the gradients in "
                    "place: give the optimizer writable arrays (np.array(g) copies one)"
                )
            grads.append(g)
        return grads

    def unscale_(self, optimizer: Any) -> None:
        """Divides the optimizer's gradients by the scale in place and records inf/NaN.

        Call it before clipping gradients; ``step`` then does not unscale again.
        """
        if not self._config.enabled:
            return
        stage = self._stages.get(id(optimizer), _Stage.READY)
        if stage is _Stage.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if stage is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = self._grads_of(optimizer)
        inv = self._inv_scale()
        found_inf = spec.unscale_overflows(self._state.scale)
        for g in grads:
            # Checked before unscaling, as torch's kernel does: the spec's
            # found_inf is about the gradients backpropagated from the scaled loss.
            found_inf = found_inf or not bool(np.isfinite(g).all())
            with np.errstate(over="ignore", invalid="ignore"):
                np.multiply(g, inv, out=g, casting="same_kind")
        if grads:
            self._found_inf[id(optimizer)] = found_inf
        self._checked[id(optimizer)] = optimizer
        self._stages[id(optimizer)] = _Stage.UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscales (unless ``unscale_`` was called) and steps unless a gradient is inf/NaN.

        Returns what ``optimizer.step`` returned, or ``None`` when skipped (after
        ``update()``, ``last_step_skipped`` tells which).
        """
        if not self._config.enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        stage = self._stages.get(id(optimizer), _Stage.READY)
        if stage is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if stage is _Stage.READY:
            self.unscale_(optimizer)
        if id(optimizer) not in self._found_inf:
            raise NoInfChecksError.for_optimizer(
                "set optimizer.grads to the gradients of scaler.scale(loss)")
        skipped = self._found_inf[id(optimizer)]
        retval = None if skipped else optimizer.step(*args, **kwargs)
        self._stages[id(optimizer)] = _Stage.STEPPED
        return retval

    def update(self, finite: Any = None, *,
               new_scale: float | np.ndarray | None = None) -> NumpyGradScaler:
        """Adapts the scale from every check since the last update, per the spec; returns
        the scaler itself.

        ``finite`` (the flag :meth:`unscale` returned, or any bool) counts as one more
        check; ``update()`` uses the checks alone. ``new_scale`` (a float or a one-element
        array, finite and > 0; a number as the first argument, as in torch) sets the scale
        instead, leaving the trackers as they are, as torch does; such a manual set is not
        counted as an update: it is not recorded in :meth:`history`, and
        :meth:`overflow_report` is None after it (as on torch).

        Example:
            >>> s = NumpyGradScaler(8.0)
            >>> s.update(False) is s, s.get_scale(), s.update(2.0).get_scale()
            (True, 4.0, 2.0)
        """
        finite, new_scale = update_arguments(finite, new_scale, _FLAGS)
        if not self._config.enabled:
            return self
        found_inf: bool | None = None  # set (a bool) exactly when new_scale is None
        if new_scale is not None:
            self._state = self._state._replace(scale=new_scale_value(new_scale))
            self._remember_update(None)
        else:
            # A flag stands for the functional unscale() checks it was made from, as on
            # the functional backends, which record none: the optimizers' checks stay.
            checks = list(self._found_inf.values())
            if finite is None:
                checks += self._functional_found_inf
            else:
                checks.append(not bool(finite))
            if not checks:
                raise NoInfChecksError.prior_to_update()
            found_inf = any(checks)
            scale = self._state.scale
            self._state = self._next_state(found_inf)
            self._count(found_inf)
            self._record(self._state.scale, found_inf)  # the scale the update left
            self._remember_update(LastUpdate(
                self._updates, scale, list(self._checked.values()), self._scale_input,
                not any(self._found_inf.values())) if found_inf else None)
        self._stages.clear()
        self._found_inf.clear()
        self._functional_found_inf.clear()
        self._forget_iteration()
        if found_inf is not None:
            self._monitor.observe(self._updates, self._state.scale, found_inf,
                                  detail=self._collapse_detail if found_inf else None)
        return self

    def __getstate__(self) -> dict[str, Any]:
        # A copy (pickle, deepcopy) keeps every attribute, a subclass's too, but of the
        # diagnostics only what _diagnostics_state() says a copy keeps.
        return {**self.__dict__, **self._diagnostics_state()}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        saved = {_PICKLED_NAMES.get(name, name): value for name, value in saved.items()}
        if "_ring" in saved:  # the previous release's ring: one tuple of three arrays
            iterations, scales, skipped = saved.pop("_ring")
            saved.update(_ring_iterations=iterations, _ring_scales=scales,
                         _ring_skipped=skipped)
        vars(self).update(saved)

    # ------------------------------------------------------------ diagnostics

    def _compute_report(self, last: LastUpdate, at_update: bool) -> OverflowReport:
        several = len(last.optimizers) > 1
        overflows = []
        checked = 0
        for k, optimizer in enumerate(last.optimizers):
            for i, (param, grad) in enumerate(zip(optimizer.params, optimizer.grads,
                                                  strict=False)):
                if grad is None:
                    continue
                checked += 1
                name = self._gradient_name(param, f"params[{i}]", k, several)
                # One pass over a finite gradient; only a non-finite one is counted.
                overflow = count_overflow(name, grad)
                if overflow is not None:
                    overflows.append(overflow)
        loss_finite = (None if last.loss is None
                       else bool(np.isfinite(np.asarray(last.loss)).all()))
        note = report_note(last, bool(overflows), checked, at_update, items="arrays",
                           clear="zero_grad")
        return OverflowReport(last.step, last.scale, overflows, checked, loss_finite, note)

    def _next_state(self, found_inf: bool) -> ScalerState:
        # The one place the rule is applied, so that a variant (or a deliberately
        # broken scaler in the conformance meta-tests) changes only this.
        return spec.update(self._config, self._state, found_inf)
