"""``TorchGradScaler``: ``torch.amp.GradScaler`` with the spec's config, state and verbs.

The update runs torch's own kernel where torch can express the config, else the rule of
``_rule``; ``unscale_`` and ``update`` never wait for the device, and the plain ``step``
reads one flag, as torch's does (the package's docstring says more).

Length: about 900 lines, one class. Its verbs share one iteration's state (each
optimizer's checks, which ``update()`` reads and clears), the scale's tensors and what the
config derives (the rule's constants, the unscalable bound); split into mixins, each part
would read attributes assigned in another file. What stands apart lives beside it: the
rule (``_rule``), the diagnostics (``_diagnostics``, a mixin with its own attributes),
devices and ranks (``_devices``), and torch's private API (``_compat``).
"""

from __future__ import annotations

import functools
import math
import warnings
import weakref
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from unifiedamp import spec
from unifiedamp._monitor import CollapseMonitor
from unifiedamp._scaler import GradScaler, new_scale_value
from unifiedamp._tree import leaves, refuse_foreign, tree_map
from unifiedamp.backends._imperative import (
    Flags,
    diagnostics_options,
    mid_iteration_load_error,
    update_arguments,
)
from unifiedamp.backends.torch._compat import (
    STEPS_ON_DEVICE,
    OptState,
    distributed_initialized,
    empty_optimizer_state,
    fused_step,
    takes_grad_scaler,
    unscale_and_check_,
    unscale_grads_,
    update_scale_,
)
from unifiedamp.backends.torch._devices import (
    DIST_AVAILABLE,
    agree_across_ranks,
    check_process_group,
    device_of,
    devices,
    explicit_device,
    split_device,
    unusable_device,
)
from unifiedamp.backends.torch._diagnostics import DIAGNOSTICS_ATTRIBUTES, TorchDiagnostics
from unifiedamp.backends.torch._rule import (
    capture_rule,
    not_finite,
    rule_constants,
    rule_for,
    spec_update_,
    torch_expressible,
    traced,
    updates_before_unscalable,
)
from unifiedamp.errors import NoInfChecksError, ScaleNotCalledError
from unifiedamp.spec import ScalerConfig, ScalerState, native_dict

__all__ = ["TorchGradScaler"]

_EXTRA_NAMES = ("device", "process_group", "distributed", "max_consecutive_skips",
                "on_collapse", "backend", "diagnose", "history")


#: The skip counters' names in pickles of the previous release -> their names now.
_PICKLED_NAMES = {"_skipped_on_host": "_skip_count_host", "_host_skips": "_consecutive_skips_host",
                  "_skips_on_device": "_device_holds_consecutive_skips",
                  "_skipped_on_device": "_skip_count_device",
                  "_consecutive_skips": "_consecutive_skips_device"}

#: torch's assertion in step() when none of the optimizer's parameters had a gradient.
_NO_CHECKS_FOR_OPTIMIZER = "No inf checks were recorded for this optimizer."
#: torch's words for an update() before the scale exists, and the fix.
_UPDATE_BEFORE_SCALE = (
    "Attempted update but _scale is None.  This may indicate your script did not use "
    "scaler.scale(loss or outputs) earlier in the iteration. Fix: call "
    "scaler.scale(loss).backward() and scaler.step(optimizer) before scaler.update()")

#: The flags update() takes: the 0-d bool tensor unscale() returns, a bool, a NumPy bool.
_FLAGS = Flags((torch.Tensor, bool, np.bool_, np.ndarray), "torch",
               "(a 0-d bool tensor) or a bool", "torch.as_tensor")
#: The error for another framework's arrays, in the words every backend uses.
_refuse_foreign = functools.partial(
    refuse_foreign, own=("torch",), expected="torch tensors",
    convert="torch.as_tensor")


# TorchDiagnostics declares torch's _scale (Optional[Tensor]) for its methods' sake.
class TorchGradScaler(torch.amp.GradScaler, TorchDiagnostics, GradScaler):  # pyright: ignore[reportIncompatibleVariableOverride]
    """``torch.amp.GradScaler`` with the unifiedamp spec, config, state and reporting.

    It is a real ``torch.amp.GradScaler``: code and tools that take one take it.
    Unlike ``torch.amp.GradScaler()``, it is never silently disabled on a CPU.

    Args:
        *args: ``init_scale, growth_factor, backoff_factor, growth_interval, enabled``,
            or torch's order with the device first: ``TorchGradScaler("cuda", 1024.0)``
            is ``TorchGradScaler(1024.0, device="cuda")``.
        device: Where the scale lives (a string such as ``"cpu"``, ``"cuda"``,
            ``"cuda:1"``, or a ``torch.device``). By default, the device of the first
            tensor scaled. A CUDA device on a machine without CUDA raises
            ``RuntimeError`` (torch warns and disables its scaler there).
        process_group: With ``torch.distributed`` initialised, the group whose
            ranks must agree on found_inf (default: the world).
        distributed: ``None`` (default) all-reduces found_inf whenever
            ``torch.distributed`` is initialised with more than one rank; ``False`` never.
        max_consecutive_skips: Warn once after this many skipped iterations in a
            row (``None``: only when the scale drops below float32's smallest normal).
        on_collapse: ``"warn"`` or ``"raise"``.
        diagnose: Build the :meth:`overflow_report` inside ``update()`` when it skips,
            while the gradients are still there (it survives ``zero_grad()``). Free on
            the other steps with plain optimizers (``step()`` has read found_inf
            already); with a fused optimizer ``update()`` reads found_inf once (the one
            host sync it adds). Default False: the report is built when asked, from
            the gradients as they are then.
        history: Keep the last ``history`` updates' (iteration, scale, skipped) in a
            ring on the scale's device, read by :meth:`history` (default 0: none). One
            small op per update, no host sync.
        **kwargs: The other config parameters (canonical names or aliases).

    Example:
        >>> import torch
        >>> import unifiedamp as ua
        >>> model = torch.nn.Linear(3, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
        >>> isinstance(scaler, torch.amp.GradScaler)
        True
        >>> scaler.scale(model(torch.ones(2, 3)).sum()).backward()
        >>> scaler.step(opt); _ = scaler.update()
        >>> scaler.get_scale(), scaler.last_step_skipped
        (1024.0, False)
    """

    backend = "torch"
    capabilities = frozenset({"unscale_", "step", "watch", "overflow_report", "history",
                              "native_state_dict"})

    def __init__(
        self,
        *args: Any,
        device: str | torch.device | None = None,
        process_group: Any = None,
        distributed: bool | None = None,
        max_consecutive_skips: int | None = 100,
        on_collapse: str = "warn",
        diagnose: bool = False,
        history: int = 0,
        **kwargs: Any,
    ):
        diagnostics_options(diagnose, history)
        args, device = split_device(args, device)
        config = spec.config_from_args(args, kwargs, extra_names=_EXTRA_NAMES)
        monitor = CollapseMonitor(max_consecutive_skips, on_collapse)
        check_process_group(process_group)
        explicit = explicit_device(device, config.enabled)
        # torch's own checks refuse factors of 1 and its default device "cuda"
        # disables itself on a CPU-only machine: give it values it accepts and
        # keep the real config here.
        super().__init__(
            device=explicit.type if explicit is not None else "cpu",
            init_scale=spec.f32(config.init_scale), growth_factor=2.0, backoff_factor=0.5,
            growth_interval=config.growth_interval, enabled=config.enabled,
        )
        if not config.enabled:
            # torch leaves these unset on a disabled scaler; state_dict() still reads them.
            self._scale = self._growth_tracker = None
            self._per_optimizer_states = defaultdict(empty_optimizer_state)
        self._config = config
        self._monitor = monitor
        self._process_group = process_group
        self._distributed = distributed
        self._init_scale = spec.f32(config.init_scale)
        self._init_growth_tracker = 0
        self._init_hysteresis_tracker = 0
        # Made with the scale (_lazy_init_scale_growth_tracker), on its device.
        self._hysteresis_tracker: torch.Tensor | None = None
        # The checks of unscale(grads) since the last update, flags on the scale's device.
        self._functional_found_inf: list[torch.Tensor] = []
        self._sync_torch_attributes()
        # Whether the next update clamps torch's growth tracker below the interval.
        self._clamp_tracker = False
        # Whether the hysteresis tracker may be above 0 (torch's kernel leaves it alone).
        self._hysteresis_may_be_set = False
        self._updates = 0
        # The device check for an unscalable scale runs from this update on (see
        # updates_before_unscalable); moved on whenever the host learns the scale.
        self._check_unscalable_from = updates_before_unscalable(config, self._init_scale)
        # The flags a plain step() read on the host since the last update (it reads them
        # anyway): how many, and whether one found inf/NaN.
        self._host_reads = 0
        self._host_found = False
        # Skipped updates: counted on the host while every check of an update was read by
        # a plain step(), else on the device (a tensor, made with the scale).
        self._skip_count_host = 0
        self._skip_count_device: torch.Tensor | None = None
        # The run of consecutive skipped updates, for the collapse warning: on the host or
        # on the device by the same rule; the flag says which of the two holds it.
        self._consecutive_skips_host = 0
        self._consecutive_skips_device: torch.Tensor | None = None
        self._device_holds_consecutive_skips = False
        # The last update's found_inf: a bool when a plain step() read it, else the flag.
        self._last_skipped: bool | torch.Tensor = False
        self._bf16_checked = False
        # torch lets step()/unscale_() run only once scale() has created the scale;
        # here device= creates it at once, so a flag tells whether scale() ran.
        self._scale_called = False
        self._init_diagnostics(diagnose, history)
        if explicit is not None and config.enabled:
            try:
                self._lazy_init_scale_growth_tracker(explicit)
            except (RuntimeError, AssertionError) as exc:
                raise unusable_device(explicit, exc) from exc

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.state}, {self._config})"

    def _sync_torch_attributes(self) -> None:
        # The compiled rule captured as a CUDA graph, and its flag (capture_rule): made
        # with one config's constants, so remade when the config changes.
        self._rule_graph: tuple[torch.cuda.CUDAGraph, torch.Tensor] | None = None
        self._native_update = torch_expressible(self._config)  # asked at every update
        # Made here, where the config changes, not in update(): spec.f32 does not
        # trace under torch.compile.
        self._constants = (None if self._scale is None
                           else rule_constants(self._config, self._scale.device))
        # torch's kernel takes the factors as doubles: rounded to float32 it computes
        # the spec's bits. Rounded here once (in update() it would be a graph break
        # under torch.compile, and host work at every step).
        self._float32_factors = (spec.f32(self._config.growth_factor),
                                 spec.f32(self._config.backoff_factor))
        # torch's own names, for tools that read them.
        self._growth_factor = self._config.growth_factor
        self._backoff_factor = self._config.backoff_factor
        self._growth_interval = self._config.growth_interval

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        super()._lazy_init_scale_growth_tracker(dev)
        self._constants = rule_constants(self._config, dev)
        self._rule_graph = None  # captured with the old tensors
        self._hysteresis_tracker = torch.full((), self._init_hysteresis_tracker,
                                              dtype=torch.int32, device=dev)
        self._consecutive_skips_device = torch.zeros((), dtype=torch.float32, device=dev)
        self._skip_count_device = torch.zeros((), dtype=torch.float32, device=dev)
        self._hysteresis_may_be_set = self._init_hysteresis_tracker > 0
        self._device = dev.type
        self._make_ring(dev)

    def _make_scale(self, dev: torch.device) -> torch.Tensor:
        """Makes the scale, and every tensor made with it, on ``dev``; returns the scale."""
        self._lazy_init_scale_growth_tracker(dev)
        assert self._scale is not None
        return self._scale

    # ------------------------------------------------------------ config and state

    @property
    def config(self) -> ScalerConfig:
        return self._config

    @property
    def state(self) -> ScalerState:
        """Scale and trackers as Python numbers (reads the device)."""
        if self._scale is None:
            return ScalerState(self._init_scale, self._init_growth_tracker,
                               self._init_hysteresis_tracker)
        growth, hyst = self._growth_tracker, self._hysteresis_tracker
        assert growth is not None and hyst is not None  # made with the scale
        return ScalerState(float(self._scale.item()), int(growth.item()), int(hyst.item()))

    @property
    def uses_native_update(self) -> bool:
        """Whether ``update`` runs torch's own update kernel (else the spec in tensor ops)."""
        return torch_expressible(self._config)

    def _reconfigure(self, config: ScalerConfig) -> TorchGradScaler:
        self._config = config
        self._sync_torch_attributes()
        # A smaller backoff factor shortens the bound: check until the next read.
        self._check_unscalable_from = self._updates
        # torch's kernel grows on tracker + 1 == interval: a lowered interval below the
        # tracker would never grow again; the next update clamps the tracker.
        self._clamp_tracker = True
        return self

    def _scale_known(self, scale: float) -> None:
        """The host has just learnt the scale (set, loaded or read): move the bound."""
        self._check_unscalable_from = self._updates + updates_before_unscalable(
            self._config, scale)

    # torch.amp.GradScaler's own accessors come first in the MRO; these are the
    # interface's, over _reconfigure (validated, one config). Its setters return the
    # scaler (for chaining) where torch's return None.
    def get_growth_factor(self) -> float:
        """The factor the scale grows by.

        Example:
            >>> TorchGradScaler(device="cpu").set_growth_factor(4.0).get_growth_factor()
            4.0
        """
        return GradScaler.get_growth_factor(self)

    def set_growth_factor(self, new_factor: float) -> TorchGradScaler:  # type: ignore[override]
        """Sets ``growth_factor`` (validated); returns the scaler, where torch's returns None."""
        GradScaler.set_growth_factor(self, new_factor)
        return self

    def get_backoff_factor(self) -> float:
        """The factor the scale backs off by."""
        return GradScaler.get_backoff_factor(self)

    def set_backoff_factor(self, new_factor: float) -> TorchGradScaler:  # type: ignore[override]
        """Sets ``backoff_factor`` (validated); returns the scaler, where torch's returns None."""
        GradScaler.set_backoff_factor(self, new_factor)
        return self

    def get_growth_interval(self) -> int:
        """Consecutive finite updates before the scale grows."""
        return GradScaler.get_growth_interval(self)

    def set_growth_interval(self, new_interval: int) -> TorchGradScaler:  # type: ignore[override]
        """Sets ``growth_interval``; a tracker already past it grows at the next finite
        update. Returns the scaler, where torch's returns None."""
        GradScaler.set_growth_interval(self, new_interval)
        return self

    def _get_hysteresis_tracker(self) -> int:
        if self._hysteresis_tracker is None:
            return self._init_hysteresis_tracker
        return int(self._hysteresis_tracker.item())

    def state_dict(self) -> dict[str, Any]:
        """The canonical dict, plus torch's own keys when torch can run the config.

        A disabled scaler returns it too, with ``enabled`` False. When
        ``torch_expressible(config)``, the dict also carries ``growth_factor``,
        ``backoff_factor``, ``growth_interval`` and ``_growth_tracker`` (``scale``
        is shared), so ``torch.amp.GradScaler.load_state_dict`` reads it: a
        checkpoint resumes with torch's own scaler (Lightning's default). Every
        unifiedamp backend reads it as the canonical dict (it has ``format``).
        ``native_state_dict()`` gives torch's format alone.

        Example:
            >>> import torch
            >>> d = TorchGradScaler(1024.0).state_dict()
            >>> d["format"], d["scale"], d["_growth_tracker"]
            ('unifiedamp.GradScaler', 1024.0, 0)
            >>> native = torch.amp.GradScaler("cpu")
            >>> native.load_state_dict(d)
            >>> native.get_scale()
            1024.0
        """
        state = self.state
        if not (math.isfinite(state.scale) and state.scale >= 0):
            raise ValueError(
                f"the scale is {state.scale!r}, a state no scaler can load: it was set by "
                "update(new_scale=tensor) on an accelerator, whose value is not checked "
                "there; set a finite scale > 0 with update(new_scale=...) before saving")
        canonical = spec.to_state_dict(self._config, state, self.backend)
        if not torch_expressible(self._config):
            # torch would load the keys and run another rule (no hysteresis, no
            # clamp): its KeyError is the better outcome.
            return canonical
        return {**canonical, **native_dict(self._config, state, "torch")}

    def native_state_dict(self) -> dict[str, Any]:
        """``torch.amp.GradScaler``'s own state dict, for tools that expect one.

        Raises:
            ValueError: The config uses options torch's format cannot carry.
        """
        if not torch_expressible(self._config):
            raise ValueError(
                f"torch.amp.GradScaler's state dict cannot carry this config ({self._config}: "
                "torch has no hysteresis, min/max scale or static mode, and refuses factors "
                "of 1); use state_dict(), which every unifiedamp backend loads")
        return native_dict(self._config, self.state, "torch")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a canonical dict of any backend, or a native torch or paddle dict.

        ``enabled`` stays as this scaler was built. A dict that fails validation
        raises ``ValueError`` and changes nothing.
        """
        if self._functional_found_inf or any(s["found_inf_per_device"]
                                             for s in self._per_optimizer_states.values()):
            raise mid_iteration_load_error()
        config, state = spec.parse_state_dict(state_dict, base=self._config)
        if (self._diag_found is not None and not self._diag_report_ready
                and not self._ring_holds_scale_before() and self._scale is not None
                and self._diag_loads == self._loads):
            # A skip not reported yet: its scale is inferred from the state the update
            # left, which the load replaces; infer it now (one read, at load time only).
            self._diag_scale = self._scale_of_last_update()
        self._config = config.replace(enabled=self._config.enabled)
        self._sync_torch_attributes()
        self._init_scale = state.scale
        self._init_growth_tracker = state.growth_tracker
        self._init_hysteresis_tracker = state.hysteresis_tracker
        if self._scale is not None:
            growth, hyst = self._growth_tracker, self._hysteresis_tracker
            assert growth is not None and hyst is not None  # made with the scale
            self._scale.fill_(state.scale)
            growth.fill_(state.growth_tracker)
            hyst.fill_(state.hysteresis_tracker)
        self._clamp_tracker = True
        self._hysteresis_may_be_set = state.hysteresis_tracker > 0
        self._scale_known(state.scale)
        self._loads += 1
        self._scale_set = True

    def __getstate__(self) -> dict[str, Any]:
        if self._enabled and (self._per_optimizer_states or self._functional_found_inf):
            # torch's own refusal is an AssertionError without the fix.
            raise RuntimeError(
                "this GradScaler is in the middle of an iteration (unscale_() or step() ran, "
                "update() has not): its inf checks would be lost in a copy. Pickle or copy "
                "it before the iteration's first unscale_()/step() or after update(); to "
                "checkpoint, save scaler.state_dict()")
        d = super().__getstate__()
        # Device tensors and process groups do not pickle well; carry numbers.
        d["_init_hysteresis_tracker"] = self._get_hysteresis_tracker()
        d["_skip_count_host"] = self.num_skipped_steps
        d["_last_skipped"] = self.last_step_skipped
        # torch's copy re-creates its scale lazily, so its step() needs a scale() first.
        d["_scale_called"] = False
        for name in ("_hysteresis_tracker", "_consecutive_skips_device", "_skip_count_device",
                     "_process_group", "_constants", "_rule_graph"):
            d[name] = None
        # History and reports are not state: the copy starts them afresh (__setstate__).
        # Weak references and autograd graphs among them would not pickle either.
        return {name: value for name, value in d.items() if name not in DIAGNOSTICS_ATTRIBUTES}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A scaler pickled by the previous release names its skip counters the old way.
        state = {_PICKLED_NAMES.get(name, name): value for name, value in state.items()}
        super().__setstate__(state)
        self._reset_diagnostics()

    # ------------------------------------------------------------ skipped-step reporting

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last update's gradients were not all finite, so its ``step()``
        skipped the optimizer (reads the device unless a plain ``step()`` read the flag)."""
        skipped = self._last_skipped
        return bool(skipped.item()) if isinstance(skipped, torch.Tensor) else skipped

    @property
    def num_skipped_steps(self) -> int:
        """Updates whose gradients were not all finite (reads the device unless every
        flag was read by a plain ``step()``)."""
        on_device = self._skip_count_device
        extra = int(on_device.item()) if on_device is not None else 0
        return self._skip_count_host + extra

    @property
    def num_steps(self) -> int:
        """Updates made (``update(new_scale=...)`` and a disabled scaler count none)."""
        return self._updates

    # ------------------------------------------------------------ the verbs

    def scale(self, outputs: Any) -> Any:
        """Multiplies a tensor, or a list/tuple/dict of them, by the scale (dtype kept)."""
        if not self._enabled:
            return outputs
        if not self._scale_called:
            self._scale_called = True
        if not self._bf16_checked:
            self._warn_if_bf16(outputs)
        if not isinstance(outputs, torch.Tensor):
            self._scaled_input = None
            # torch's scale() takes a tensor or an iterable of them; dicts (named
            # losses) and nesting are mapped here too.
            return tree_map(self._scale_one, outputs)
        # A reference (no op): overflow_report() checks it for inf/NaN after a skip.
        self._scaled_input = outputs
        scale = self._scale
        if scale is None or outputs.device != scale.device:
            return self._scale_one(outputs)
        # The usual loss: _scale_one's multiply written out, with no tree walk and no call
        # (host time, tests/torch/test_call_counts.py).
        out = outputs * scale
        return out if out.dtype == outputs.dtype else out.to(outputs.dtype)

    def _scale_one(self, tensor: Any) -> torch.Tensor:
        # The multiply is written here rather than through torch.amp.GradScaler.scale,
        # which torch.compile refuses to trace (a graph break in a compiled train step).
        if not isinstance(tensor, torch.Tensor):
            _refuse_foreign(tensor, what="scale()")
            raise ValueError(f"outputs must be a Tensor or a list/tuple/dict of Tensors, got "
                             f"{type(tensor).__name__}")
        scale = self._scale
        if scale is None:
            scale = self._make_scale(tensor.device)
        if tensor.device != scale.device:  # a call less on the usual path (host time)
            scale = scale.to(device=tensor.device, non_blocking=True)
        out = tensor * scale
        # A 0-dim float16 loss times the 0-dim float32 scale comes back float32 (torch's
        # own scale() returns that); every backend keeps the input's dtype.
        return out if out.dtype == tensor.dtype else out.to(tensor.dtype)

    def _warn_if_bf16(self, outputs: Any) -> None:
        # The first output stands for all: one autocast region computes them. Checked
        # at the first scale() only: a run does not change its compute dtype between
        # iterations, and the check costs host time on every launch-bound step.
        self._bf16_checked = True
        first = next(iter(leaves(outputs)), None)
        if not isinstance(first, torch.Tensor):
            return
        device_type = first.device.type
        autocast_bf16 = (torch.is_autocast_enabled(device_type)
                         and torch.get_autocast_dtype(device_type) == torch.bfloat16)
        if first.dtype == torch.bfloat16 or autocast_bf16:
            warnings.warn(
                "Loss scaling is unnecessary with bfloat16: it has float32's exponent range, "
                "so gradients do not underflow. Build the scaler with enabled=False (every verb "
                "becomes a pass-through) or drop it.", UserWarning, stacklevel=3)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divides the optimizer's gradients by the scale in place and records inf/NaN,
        agreed across ranks when ``torch.distributed`` is initialised. No host sync."""
        if not self._enabled:
            return
        if not self._scale_called:
            raise self._scale_not_called("unscale_")
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(device_of(optimizer))
        # torch's unscale_, written out (its frames are host time at every iteration).
        state = self._per_optimizer_states[id(optimizer)]
        stage = state["stage"]
        if stage is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        if stage is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        scale = self._scale
        assert scale is not None  # made above
        # The scale's device type, kept as a string: reading tensor.device builds an object.
        inv_scale = (scale.reciprocal() if self._device == "mps"
                     else scale.double().reciprocal().float())
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf,
                                                             False)
        state["stage"] = OptState.UNSCALED
        self._checking[id(optimizer)] = (weakref.ref(optimizer), True)
        self._finish_check(optimizer)

    @staticmethod
    def _scale_not_called(verb: str) -> ScaleNotCalledError:
        # torch raises this (an AssertionError) when its lazily created scale
        # does not exist yet; without it the gradients of an unscaled loss would be
        # divided by the scale and the step taken. Like torch, only before the
        # first scale(): later iterations are not checked (no per-step cost).
        return ScaleNotCalledError(
            f"Attempted {verb} but _scale is None.  This may indicate your script did not "
            "use scaler.scale(loss or outputs) earlier in the iteration. Fix: call "
            f"scaler.scale(loss).backward() before scaler.{verb}(optimizer); without it "
            "the unscaled gradients would be divided by the scale.")

    def _finish_check(self, optimizer: torch.optim.Optimizer) -> None:
        # After torch's own check (unscale_ or the fused path's): the spec's extra
        # inf, then agreement across ranks. The conditions are tested here, at every
        # step, with as few calls as they allow (host time a launch-bound step waits
        # for, tests/torch/test_call_counts.py): traced() written out (its own frame is one
        # more), and distributed_initialized() for dist.is_initialized() (three frames).
        if self._updates >= self._check_unscalable_from or torch.compiler.is_compiling() or (
                self._device == "cuda" and torch.cuda.is_current_stream_capturing()):
            self._found_inf_if_reciprocal_overflows(
                self._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values())
        if self._distributed is not False and DIST_AVAILABLE and distributed_initialized():
            assert self._scale is not None  # checks run once the scale exists
            agree_across_ranks(self._per_optimizer_states[id(optimizer)], self._process_group,
                               self._scale.device)

    def _found_inf_if_reciprocal_overflows(self, founds: Any) -> None:
        # spec.unscale_overflows: below about 2.94e-39 (and at 0) 1/scale is inf in
        # float32, so every unscaled gradient is inf or NaN, yet torch's kernel checks
        # the gradients before it multiplies and finds them finite. Raise the
        # flag on the device (a max, so it stays 0/1 for fused kernels): no host sync.
        # Three ops a step, called only once the host cannot bound the scale far above
        # it (_check_unscalable_from), and always in a CUDA graph capture or a compiled
        # step, whose replays do not run this Python.
        assert self._scale is not None  # checks run once the scale exists
        overflow = (self._scale < spec.MIN_UNSCALABLE).float()
        for found in founds:
            found.clamp_(min=overflow.to(found.device, non_blocking=True))

    #: torch's split, unscale and check of the gradients, lean (unscale_ and the fused
    #: path's check call it). Its first parameter is named ``scaler``, torch's ``self``.
    _unscale_grads_ = unscale_grads_  # pyright: ignore[reportAssignmentType]

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        # The fused path's check: no unscaling (the fused kernel does it). Reached from
        # step() only (ours or torch's, under ours), which has made the scale.
        super()._check_inf_per_device(optimizer)
        self._checking[id(optimizer)] = (weakref.ref(optimizer), False)
        self._finish_check(optimizer)
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _maybe_opt_step(self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any],
                        *args: Any, **kwargs: Any) -> Any:
        # The plain path's one host read: Python must decide whether to step. A loop, not
        # torch's sum over a generator (a frame per flag and one more).
        skipped = False
        for found in optimizer_state["found_inf_per_device"].values():
            if found.item():
                skipped = True
        self._host_reads += 1
        self._host_found |= skipped
        return None if skipped else optimizer.step(*args, **kwargs)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscales (unless ``unscale_`` was called) and steps unless a gradient was inf/NaN.

        A fused optimizer (``fused=True``) gets ``grad_scale`` and ``found_inf`` and
        skips on the device; nothing waits for the device then.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        # The guards inline: each call is host time a launch-bound step waits for.
        if not self._scale_called:
            raise self._scale_not_called("step")
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(device_of(optimizer))
        # accelerate's wrapper is an attribute of the instance: a plain optimizer's step
        # pays one dict lookup here, no call.
        if ("step" in optimizer.__dict__ and not self._unscaled_by_accelerator
                and not self._accelerate_warned):
            self._warn_if_accelerate_clips_scaled(optimizer)
        fused = getattr(optimizer, STEPS_ON_DEVICE, False)
        try:
            if fused and not torch.compiler.is_compiling() and not takes_grad_scaler(optimizer):
                retval = fused_step(self, optimizer, *args, **kwargs)
            else:
                retval = super().step(optimizer, *args, **kwargs)
        except AssertionError as exc:
            # torch's assertion when no parameter had a gradient: its words, and the fix.
            if str(exc) == _NO_CHECKS_FOR_OPTIMIZER:
                raise NoInfChecksError.for_optimizer() from None
            raise
        return retval

    #: Set by ``unifiedamp.callbacks.accelerate.use_scaler``: the Accelerator that steps
    #: this scaler unscales through it before it clips.
    _unscaled_by_accelerator = False
    _accelerate_warned = False

    def _warn_if_accelerate_clips_scaled(self, optimizer: torch.optim.Optimizer) -> None:
        # accelerate's AcceleratedOptimizer.step puts its own wrapper of the optimizer's
        # step on the instance while it calls scaler.step (accelerate/optimizer.py): a
        # scaler set by hand as accelerator.scaler, whose Accelerator unscales only in its
        # own fp16 mode on a GPU. A check of the step's module: no import of accelerate.
        wrapper = vars(optimizer).get("step")
        if getattr(wrapper, "__module__", None) != "accelerate.optimizer":
            return
        checked = self._checking.get(id(optimizer))
        if checked is not None and checked[1]:
            return  # unscale_ ran for this step: accelerate's fp16 mode did it
        self._accelerate_warned = True
        warnings.warn(
            "This scaler steps an optimizer prepared by Hugging Face accelerate that was "
            "handed the scaler as `accelerator.scaler = scaler`. The Accelerator then "
            "unscales only in its own fp16 mode on a GPU, so accelerator.clip_grad_norm_ "
            "and clip_grad_value_ (and the Hugging Face Trainer, which clips by default) "
            "clip the scaled gradients and the update is up to `scale` times too small. "
            "Fix: `from unifiedamp.callbacks.accelerate import use_scaler` and call "
            "use_scaler(accelerator, scaler) before accelerator.prepare(...).",
            UserWarning, stacklevel=4)

    def unscale(self, grads: Any) -> tuple[Any, torch.Tensor]:
        """Functional unscale: ``(unscaled copies of grads, all finite)``, no host sync.

        ``grads`` is a tensor or a list/tuple/dict of them; ``all finite`` is a 0-dim
        bool tensor. The check counts towards the next ``update()``. A gradient that
        carries an autograd graph (``torch.autograd.grad(..., create_graph=True)``, as for a
        gradient penalty) comes back as a differentiable product with the same values, as
        on the functional backends.
        """
        for leaf in leaves(grads):
            if not isinstance(leaf, torch.Tensor):
                _refuse_foreign(leaf, what="unscale()")
                raise TypeError(
                    f"grads must be a Tensor or a list/tuple/dict of Tensors, got a "
                    f"{type(leaf).__name__} leaf ({leaf!r}); convert it with torch.as_tensor "
                    "(gradients of a scaled loss are tensors already)")
        out = tree_map(lambda grad: grad.detach().clone(), grads)
        copies = leaves(out)
        if not self._enabled:
            return _with_graph(grads, out, None), torch.tensor(True)
        scale = self._scale
        if scale is None:
            scale = self._make_scale(copies[0].device if copies else torch.device("cpu"))
        found = torch.zeros((), dtype=torch.float32, device=scale.device)
        inv = scale.double().reciprocal().float()
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        for copy in copies:
            groups[(copy.device, copy.dtype)].append(copy)
        for (device, _), tensors in groups.items():
            found_here = torch.zeros((), dtype=torch.float32, device=device)
            unscale_and_check_(tensors, found_here, inv.to(device))
            found += found_here.to(found.device)
        if len(groups) > 1:
            found.clamp_(max=1.0)  # a 0/1 flag, as every check's (update counts on it)
        if self._updates >= self._check_unscalable_from or traced(self._device):
            self._found_inf_if_reciprocal_overflows([found])
        self._functional_found_inf.append(found)
        return _with_graph(grads, out, inv), found == 0

    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` where ``finite`` (the 0-d bool tensor :meth:`unscale` returns, or a
        bool), else ``old``: trees of tensors, selected by ``torch.where`` without a host
        sync.

        Example:
            >>> import torch
            >>> s = TorchGradScaler(device="cpu")
            >>> s.where_finite(torch.tensor(False), [torch.ones(2)], [torch.zeros(2)])
            [tensor([0., 0.])]
        """
        _refuse_foreign((new, old), what="where_finite()")
        if isinstance(finite, torch.Tensor):
            return tree_map(lambda n, o: torch.where(finite, n, o), new, old)
        keep = bool(finite)
        return tree_map(lambda n, o: n if keep else o, new, old)

    # The interface's update: a flag first (a positional number is still torch's new_scale,
    # see update_arguments), and it returns the scaler where torch's returns None.
    def update(self, finite: Any = None, *,  # type: ignore[override]
               new_scale: float | torch.Tensor | np.ndarray | None = None) -> TorchGradScaler:
        """Adapts the scale from every check since the last update, per the spec; no host
        sync. Returns the scaler itself.

        ``finite`` (the flag :meth:`unscale` returned: a 0-d bool tensor, or a bool)
        counts as one more check, after ``step()`` too; ``update()`` uses the checks
        alone. Any other tensor first is refused (TypeError): ``update(finite.float())``
        would otherwise set the scale to 1.0.

        ``new_scale`` sets the scale instead, leaving the trackers, as torch does:
        a Python or NumPy number, or a 1-element NumPy array (checked: finite
        and > 0 in float32), or a 1-element floating-point tensor (not checked: that
        would wait for the device). A plain number may come first (``update(512.0)``, as
        torch's docs use it); an array or a tensor goes by keyword
        (``update(new_scale=torch.tensor(512.0))``). Such a manual update is not counted
        as an update:
        it is not recorded in :meth:`history`, and :meth:`overflow_report` returns
        None after it (it did not skip).

        With ``history=N`` it writes one record into the ring (one op); with
        ``diagnose=True`` it builds the overflow report when the update skips (and,
        after a fused optimizer's step, reads found_inf to know whether it did).

        Example:
            >>> import numpy as np
            >>> scaler = TorchGradScaler(1024.0, device="cpu")
            >>> scaler.update(np.float32(8.0)).get_scale()
            8.0
        """
        if finite is not None:  # update() alone needs no sorting out of its arguments
            finite, new_scale = update_arguments(finite, new_scale, _FLAGS)
        if not self._enabled:
            return self
        # torch's _check_scale_growth_tracker, which torch.compile does not trace.
        scale, growth = self._scale, self._growth_tracker
        if scale is None or growth is None:
            raise ScaleNotCalledError(_UPDATE_BEFORE_SCALE)
        if new_scale is not None:
            self._set_scale(scale, new_scale)
            self._diag_found = None  # not a skip; overflow_report() is None after it
            self._scale_set = True
        else:
            found, host_found = self._iteration_found_inf(scale, finite)
            # The report of a skip is built before the rule changes the scale in place; not
            # while traced (a replay would not run this Python), nor after a plain step()
            # that read no inf (nothing to report).
            diagnosed = self._diagnose and not traced(self._device)
            report = (self._diagnose_now(scale, found, host_found)
                      if diagnosed and host_found is not False else None)
            if self._native_update:
                self._apply_torch_kernel(scale, growth, found)
            else:
                self._apply_rule(scale, growth, found)
            if self._ring is not None:
                self._record(scale, found)  # the scale the update left
            self._updates += 1
            self._count_skip(found, host_found)
            self._remember_update(found, host_found, report, diagnosed)
            # The device is read only once per period of updates: none in between.
            if self._updates % (self._monitor.max_consecutive_skips or 100) == 0:
                self._check_collapse()
        self._end_iteration()
        return self

    def _iteration_found_inf(self, scale: torch.Tensor, finite: Any
                             ) -> tuple[torch.Tensor, bool | None]:
        """The spec's found_inf: the OR of every check since the last update (each
        optimizer's on each device, and ``finite``, else each functional ``unscale()``'s), as a
        float32 0.0/1.0 on the scale's device. Also the same as a bool when a plain
        ``step()`` has read every check (one read per optimizer that checked, no other
        check), else None: then only the device knows."""
        found_infs = []
        checked = 0
        for state in self._per_optimizer_states.values():
            founds = state["found_inf_per_device"]
            if founds:
                checked += 1
                for found in founds.values():  # a loop: a comprehension is a frame
                    found_infs.append(found.to(scale.device, non_blocking=True))
        # A flag stands for the functional unscale() checks it was made from, as on the
        # functional backends, which record none: the optimizers' checks stay.
        functional = self._functional_found_inf if finite is None else None
        if functional:
            found_infs += functional
        if finite is not None:
            found_infs.append(not_finite(finite, scale.device))
        elif not found_infs:
            raise NoInfChecksError.prior_to_update()
        host_found = (self._host_found if self._host_reads == checked and not functional
                      and finite is None else None)
        if len(found_infs) > 1:
            found = torch.stack(found_infs).sum().clamp_(max=1.0)
        else:
            found = found_infs[0]  # 0.0 or 1.0
        return found, host_found

    def _apply_torch_kernel(self, scale: torch.Tensor, growth: torch.Tensor,
                            found: torch.Tensor) -> None:
        """The spec's update by torch's own kernel (a config it can express): given the
        float32-rounded factors, it computes the spec's bits."""
        if self._clamp_tracker:
            # torch grows on tracker + 1 == interval; the spec on >=.
            growth.clamp_(max=self._config.growth_interval - 1)
            self._clamp_tracker = False
        growth_factor, backoff_factor = self._float32_factors
        update_scale_(scale, growth, found, growth_factor, backoff_factor,
                      self._config.growth_interval)
        if self._hysteresis_may_be_set:
            # With hysteresis 1 the spec leaves the tracker at 0 after any update; torch's
            # kernel does not know it.
            assert self._hysteresis_tracker is not None  # made with the scale
            self._hysteresis_tracker.zero_()
            self._hysteresis_may_be_set = False

    def _count_skip(self, found: torch.Tensor, host_found: bool | None) -> None:
        """Counts the update as skipped or not, and the run of skipped updates for the
        collapse warning: on the host when a plain step() read every check (``host_found``),
        else on the device (``found``), with no host sync."""
        if host_found is None:
            self._last_skipped = found
            assert self._skip_count_device is not None  # made with the scale
            self._skip_count_device.add_(found)
            self._count_skips_on_device(found)
        else:
            self._last_skipped = host_found
            self._skip_count_host += host_found
            if self._device_holds_consecutive_skips:  # the run so far, of fused steps: rare
                assert self._consecutive_skips_device is not None  # made with the scale
                self._consecutive_skips_host = int(self._consecutive_skips_device.item())
                self._device_holds_consecutive_skips = False
            self._consecutive_skips_host = self._consecutive_skips_host + 1 if host_found else 0

    def _end_iteration(self) -> None:
        """After an update: the next iteration starts with no checks."""
        self._per_optimizer_states = defaultdict(empty_optimizer_state)
        if self._functional_found_inf:
            self._functional_found_inf = []
        self._host_reads = 0
        self._host_found = False
        self._checking = {}

    def _set_scale(self, scale: torch.Tensor, new_scale: Any) -> None:
        # One message shape with the numpy backend's, whatever the type.
        refused = f"new_scale must be a float or a 1-element array/tensor, got {new_scale!r}"
        if isinstance(new_scale, torch.Tensor):
            if new_scale.numel() != 1 or new_scale.requires_grad or \
                    not new_scale.dtype.is_floating_point:
                raise TypeError(f"{refused} (a tensor must be floating-point, with "
                                "requires_grad=False)")
            if new_scale.device.type == "cpu":
                new_scale_value(new_scale.item())  # on the host, a check costs no wait
            # On an accelerator the value is checked where the scale is read anyway
            # (state_dict): checking here would wait for the device.
            scale.copy_(new_scale.reshape(()))
            self._check_unscalable_from = self._updates
            return
        # Host values (NumPy's too, as the numpy backend takes them): checked there.
        value = new_scale_value(new_scale)
        scale.fill_(value)
        self._scale_known(spec.f32(value))

    def _apply_rule(self, scale: torch.Tensor, growth: torch.Tensor,
                    found: torch.Tensor) -> None:
        """The spec's update as tensor ops (a config torch's kernel cannot run)."""
        config = self._config
        hyst, constants = self._hysteresis_tracker, self._constants
        assert hyst is not None and constants is not None  # made with the scale
        rule = rule_for(config, constants, scale.device)
        # The compiled rule is never handed out while compiling (rule_for), so of traced()
        # only the capture is left to ask.
        if rule is not spec_update_ and scale.is_cuda \
                and not torch.cuda.is_current_stream_capturing():
            # The compiled rule, replayed as a CUDA graph (capture_rule).
            if self._rule_graph is None:
                self._rule_graph = capture_rule(scale, growth, hyst, config, constants)
            graph, flag = self._rule_graph
            flag.copy_(found)
            graph.replay()
        else:
            rule(scale, growth, hyst, found, config, constants)
        self._hysteresis_may_be_set = True

    def _count_skips_on_device(self, found: torch.Tensor) -> None:
        """Counts the run of consecutive skipped updates on the device (``found`` is 0.0 or
        1.0), carrying over the run the host has counted so far."""
        assert self._consecutive_skips_device is not None  # made with the scale
        if not self._device_holds_consecutive_skips:
            self._consecutive_skips_device.fill_(self._consecutive_skips_host)
            self._device_holds_consecutive_skips = True
        # found * (skips + 1) in one op: the run grows on a skip, else restarts at 0.
        torch.addcmul(found, self._consecutive_skips_device, found,
                      out=self._consecutive_skips_device)

    def _check_collapse(self) -> None:
        """Once per period of updates: reads the scale (and the run of skips, if on the
        device) and reports a collapse."""
        # Made with the scale, which update() checked.
        assert self._scale is not None and self._consecutive_skips_device is not None
        if traced(self._device):
            return  # a replay would not run this read
        limit = self._monitor.max_consecutive_skips
        scale = float(self._scale.item())  # the one read per period
        self._scale_known(scale)
        skips = (int(self._consecutive_skips_device.item())
                 if self._device_holds_consecutive_skips else self._consecutive_skips_host)
        if scale < spec.FLOAT32_MIN_NORMAL or (limit is not None and skips >= limit):
            self._monitor.report(self._updates, scale, skips, detail=self._collapse_detail)
        else:
            self._monitor.clear()

    # ------------------------------------------------------------ tooling

    @classmethod
    def devices(cls) -> list[str]:
        """``cpu`` and every CUDA device torch sees."""
        return devices()


def _with_graph(grads: Any, out: Any, inv: torch.Tensor | None) -> Any:
    """``out`` (the kernel's detached, unscaled copies), with each gradient that carries an
    autograd graph replaced by the same product in autograd's ops: without it, a penalty
    computed on ``unscale()``'s result would drop out of the parameters' gradients without
    an error. Low-precision gradients are multiplied in float32 and rounded back, as the
    kernel does, so the values are the copies' bits."""
    # A loop, not any() over a generator: a frame per gradient, at every step.
    for grad in leaves(grads):
        if grad.requires_grad:
            break
    else:
        return out

    def one(grad: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        if not grad.requires_grad:
            return copy
        if inv is None:                                   # disabled: the gradient as it is
            return grad.clone()
        wide = torch.promote_types(grad.dtype, torch.float32)
        return (grad.to(wide) * inv.to(grad.device)).to(grad.dtype)

    return tree_map(one, grads, out)
