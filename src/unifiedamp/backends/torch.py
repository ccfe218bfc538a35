"""The PyTorch backend: a real ``torch.amp.GradScaler`` that follows the spec bit for bit.

Where torch can express the config (growth_factor > 1, backoff_factor < 1,
hysteresis 1, no min/max scale, dynamic) the update runs torch's own kernel
``torch._amp_update_scale_`` with the factors rounded to float32, which gives
the spec's bits. Otherwise the same rule runs as a few tensor ops on the
scale's device. Either way ``unscale_`` and ``update`` never wait for the
device; the plain (non-fused) ``step`` reads one flag to decide whether to
call ``optimizer.step()``, as torch's does, and fused optimizers get
``grad_scale``/``found_inf`` and skip on the device with no read at all.

Diagnostics (``docs/diagnostics.md``): ``overflow_report()`` names the gradients that
held inf/NaN at a skipped step and is computed only after a skip; ``history=N`` keeps
the last N (iteration, scale, skipped) records in a ring on the scale's device, one
small op per update; ``diagnose=True`` computes the report inside a skipped ``update()``
(plain optimizers: free on other steps; fused ones: one read of found_inf per update).
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections import defaultdict
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state
from torch.utils._python_dispatch import _get_current_dispatch_mode

from unifiedamp import spec
from unifiedamp._monitor import CollapseMonitor
from unifiedamp._scaler import (
    GradScaler,
    NoInfChecksError,
    ScaleNotCalledError,
    diagnostics_options,
    mid_iteration_load_error,
    new_scale_value,
    update_arguments,
    watched_pairs,
)
from unifiedamp._tree import leaves, tree_map
from unifiedamp.diagnostics import GradientOverflow, OverflowReport, ScaleHistory
from unifiedamp.spec import ScalerConfig, ScalerState

__all__ = ["ScaleNotCalledError", "TorchGradScaler"]

#: torch.distributed is built in (a constant; asked once).
_DIST_AVAILABLE = dist.is_available()

_EXTRA_NAMES = ("device", "process_group", "distributed", "max_consecutive_skips",
                "on_collapse", "backend", "diagnose", "history")


def torch_expressible(config: ScalerConfig) -> bool:
    """Whether ``torch._amp_update_scale_`` computes this config's update.

    Example:
        >>> torch_expressible(ScalerConfig()), torch_expressible(ScalerConfig(hysteresis=2))
        (True, False)
    """
    return (config.growth_factor > 1.0 and config.backoff_factor < 1.0 and config.hysteresis == 1
            and config.min_scale is None and config.max_scale is None and config.dynamic)


#: Scales at or above this are far from MIN_UNSCALABLE (8x): 1 / scale is finite
#: there, and float32 products stay normal, so rounding is relative (2**-24 at most).
_SAFE_SCALE = 2 * spec.FLOAT32_MIN_NORMAL


def _updates_before_unscalable(config: ScalerConfig, scale: float) -> float:
    """How many updates from ``scale`` provably keep the scale >= ``_SAFE_SCALE``.

    Each update multiplies the scale by at least ``f32(backoff_factor)`` (growth and
    holding only raise or keep it; min_scale only raises it), rounded to nearest, so
    after n updates it is >= scale * (b * (1 - 2**-24)) ** n. Until then the spec's
    extra inf for an unscalable scale cannot happen and its device check is skipped.

    Example:
        >>> _updates_before_unscalable(ScalerConfig(), 65536.0)  # 2**16 down to ~2**-125
        139
        >>> _updates_before_unscalable(ScalerConfig(min_scale=1.0), 65536.0)
        inf
    """
    if not scale >= _SAFE_SCALE:
        return 0
    floor_scale = config.min_scale if config.min_scale is not None else 0.0
    backoff = spec.f32(config.backoff_factor) * (1 - 2.0**-24)
    if not config.dynamic or spec.f32(floor_scale) >= _SAFE_SCALE or backoff >= 1.0:
        return math.inf
    # One update less than the bound: the logarithms are rounded too.
    return max(0, math.floor(math.log(scale / _SAFE_SCALE) / -math.log(backoff)) - 1)


def _split_device(args: tuple[Any, ...], device: Any) -> tuple[tuple[Any, ...], Any]:
    """Takes torch's first positional parameter, the device, off ``args``.

    ``torch.amp.GradScaler(device, init_scale, growth_factor, backoff_factor,
    growth_interval, enabled)``: after the device, torch's order is the spec's.
    A number first is the spec's ``init_scale``.

    Example:
        >>> _split_device(("cpu", 1024.0), None)
        ((1024.0,), 'cpu')
    """
    if not args or not isinstance(args[0], (str, torch.device)):
        return args, device
    first, rest = args[0], args[1:]
    if device is not None:
        raise TypeError(f"device given twice: {first!r} as the first positional argument and "
                        f"device={device!r}; pass it once")
    if isinstance(first, str):
        try:
            torch.device(first)
        except RuntimeError:
            try:
                hint = f"init_scale={float(first)!r}"
            except ValueError:
                hint = "init_scale=65536.0"
            raise ValueError(
                f"{first!r} is not a torch device: the first positional argument is the device "
                "(as in torch.amp.GradScaler(device, init_scale, ...)) or the scale as a number. "
                f"Pass a device such as 'cpu' or 'cuda:0', or a number ({hint})") from None
    return rest, first


def _rule_constants(config: ScalerConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """The rule's float32 constants as 0-dim tensors on ``device``, made once per config:
    a Python number in ``torch.where`` would be a new tensor (a kernel) at every update."""
    values = {"one": 1.0, "zero": 0.0, "growth": spec.f32(config.growth_factor),
              "backoff": spec.f32(config.backoff_factor)}
    if config.min_scale is not None:
        values["min"] = spec.f32(config.min_scale)
    if config.max_scale is not None:
        values["max"] = spec.f32(config.max_scale)
    constants = {name: torch.tensor(value, dtype=torch.float32, device=device)
                 for name, value in values.items()}
    constants["one64"] = torch.tensor(1.0, dtype=torch.float64, device=device)
    return constants


def _spec_update_(scale: torch.Tensor, growth: torch.Tensor, hyst: torch.Tensor,
                  found_inf: torch.Tensor, config: ScalerConfig,
                  constants: dict[str, torch.Tensor]) -> None:
    """The spec's update as tensor ops, in place, with no host sync.

    ``found_inf`` is 0.0 or 1.0 (float32); ``constants`` come from ``_rule_constants``.
    """
    if not config.dynamic:
        growth.zero_()
        hyst.zero_()
        return
    # Few, small ops: each is a kernel launch (a few microseconds) on any device.
    # The trackers in float64 (exact over int32, which float32 is not past 2**24)
    # with the flag as a 0/1 multiplier: (tracker + 1) * flag is one addcmul.
    finite = constants["one64"] - found_inf
    inf = constants["one64"] - finite
    new_hyst = torch.addcmul(inf, hyst, inf)  # + 1 on an inf, else 0
    new_growth = torch.addcmul(finite, growth, finite)  # + 1 when finite, else 0
    back_off = new_hyst >= config.hysteresis
    grow = new_growth >= config.growth_interval  # never after an inf: new_growth is 0 then
    # One multiply by backoff, growth or 1.0 (exact). A float32 tensor times a
    # float32 value rounds once: the spec's f32(scale * f32(factor)).
    factor = torch.where(back_off, constants["backoff"],
                         torch.where(grow, constants["growth"], constants["one"]))
    candidate = scale * factor
    if config.min_scale is not None:  # on a backoff only: max(candidate, min or 0)
        candidate = torch.maximum(candidate,
                                  torch.where(back_off, constants["min"], constants["zero"]))
    if config.max_scale is not None:  # on a growth only; it keeps the scale finite too
        candidate = torch.where(grow, candidate.clamp_(max=constants["max"]), candidate)
    # Only a growth can overflow (to +inf, never NaN); then the old scale stays.
    torch.where(candidate != math.inf, candidate, scale, out=scale)
    hyst.copy_(new_hyst.masked_fill_(back_off, 0))
    growth.copy_(new_growth.masked_fill_(grow, 0))


#: Device types on which the tensor-op rule runs compiled by torch.compile, as one
#: fused kernel (Triton on CUDA) instead of ~16 small ones: on a GPU each is a launch.
#: On a CPU the small ops cost microseconds and a compilation seconds, so not there.
COMPILED_RULE_DEVICES = {"cuda"}
_compiled_rule: Any = None
#: (config, device type) -> whether the compiled rule runs there (tried once each).
_compiled_ok: dict[tuple[ScalerConfig, str], bool] = {}


def _rule_for(config: ScalerConfig, constants: dict[str, torch.Tensor],
              device: torch.device) -> Any:
    """``_spec_update_``, compiled where ``COMPILED_RULE_DEVICES`` asks for it and the
    compiler works (else, once warned, the tensor ops)."""
    if (device.type not in COMPILED_RULE_DEVICES or torch.compiler.is_compiling()
            or _get_current_dispatch_mode() is not None):
        # Inside a compiled step the rule is traced with the step; under a dispatch
        # mode (a FLOP counter, a debug mode) torch.compile refuses to run.
        return _spec_update_
    key = (config, device.type)
    ok = _compiled_ok.get(key)
    if ok is None:
        ok = _compiled_ok[key] = _try_compiled_rule(config, constants, device)
    return _compiled_rule if ok else _spec_update_


def _try_compiled_rule(config: ScalerConfig, constants: dict[str, torch.Tensor],
                       device: torch.device) -> bool:
    """Compiles the rule for ``config`` with a first call on scratch tensors: a failure
    (no Triton, no C++ compiler, a dispatch mode active) can come after dynamo has run
    the function eagerly, so it must not touch the scaler's own tensors."""
    global _compiled_rule
    if _compiled_rule is None:
        _compiled_rule = torch.compile(_spec_update_, fullgraph=True, dynamic=False)
    scratch = (torch.ones((), device=device), torch.zeros((), dtype=torch.int32, device=device),
               torch.zeros((), dtype=torch.int32, device=device),
               torch.zeros((), device=device))
    try:
        _compiled_rule(*scratch, config, constants)
    except Exception as exc:
        warnings.warn(f"torch.compile could not compile the loss-scale update on {device.type} "
                      f"({exc!r:.300}); it runs as separate tensor ops instead",
                      RuntimeWarning, stacklevel=5)
        return False
    return True


def _traced(device_type: str) -> bool:
    """Whether this code is being traced into a graph that runs again without it:
    ``torch.compile``, or a CUDA graph capture (asked only for a ``"cuda"`` scale: a few
    microseconds of host time per call otherwise). The host-side shortcuts then step
    aside (a replay does not run this Python) and nothing reads the device. Takes the
    device's type as a string: reading ``tensor.device`` costs host time at every step."""
    return torch.compiler.is_compiling() or (
        device_type == "cuda" and torch.cuda.is_current_stream_capturing())


#: step functions -> whether they take torch's deprecated ``grad_scaler`` keyword.
_TAKES_GRAD_SCALER: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _takes_grad_scaler(optimizer: torch.optim.Optimizer) -> bool:
    """``"grad_scaler" in inspect.signature(optimizer.step).parameters``, once per function:
    torch asks at every fused step (two signature walks, ~5 us of host time)."""
    step = optimizer.step
    func = getattr(step, "__func__", step)
    try:
        return _TAKES_GRAD_SCALER[func]
    except (KeyError, TypeError):  # TypeError: not weakly referenceable; not cached
        import inspect

        takes = "grad_scaler" in inspect.signature(step).parameters
        try:
            _TAKES_GRAD_SCALER[func] = takes
        except TypeError:
            pass
        return takes


def _not_finite(finite: Any, device: torch.device) -> torch.Tensor:
    """``update(finite)``'s flag as a check: a float32 0.0/1.0 (1.0: not finite) on
    ``device``, without a host sync."""
    if isinstance(finite, torch.Tensor):
        return torch.logical_not(finite).to(device=device, dtype=torch.float32,
                                            non_blocking=True)
    return torch.tensor(0.0 if bool(finite) else 1.0, device=device)


def _device_of(optimizer: torch.optim.Optimizer) -> torch.device:
    for group in optimizer.param_groups:
        for param in group["params"]:
            return param.device
    return torch.device("cpu")


def _scale_before_skip(config: ScalerConfig, after: float, hysteresis_after: int
                       ) -> tuple[float, bool]:
    """The scale a skipped update started from, from the state it left: ``(scale, exact)``.

    After an inf the spec multiplies the scale by ``f32(backoff_factor)`` when the
    hysteresis tracker reaches ``hysteresis`` (the tracker is then 0; it is >= 1 when it
    held) and clamps at ``min_scale``. The product is inverted in float32; it is exact
    when one float32 maps to ``after`` (always for a power-of-two backoff such as 0.5),
    and not at the ``min_scale`` clamp. Used when no history ring holds the value and
    ``diagnose`` did not read it before the update.

    Example:
        >>> _scale_before_skip(ScalerConfig(), 32768.0, 0)
        (65536.0, True)
        >>> _scale_before_skip(ScalerConfig(hysteresis=2), 1024.0, 1)  # held: no backoff
        (1024.0, True)
    """
    if not config.dynamic or (config.hysteresis > 1 and hysteresis_after != 0):
        return after, True
    backoff = spec.f32(config.backoff_factor)
    guess = np.float32(spec.f32(after / backoff))
    if config.min_scale is not None and after == spec.f32(config.min_scale):
        return float(guess), False  # anything from min_scale to min_scale / backoff
    nearby = [guess]
    for direction in (-np.inf, np.inf):
        x = guess
        for _ in range(2):
            x = np.nextafter(x, np.float32(direction))
            nearby.append(x)
    # A float32 product of float32 values, rounded once: as the update computes it.
    sources = {float(x) for x in nearby if spec.f32(float(x) * backoff) == after}
    return (sources.pop(), True) if len(sources) == 1 else (float(guess), False)


def _count_overflows(named_grads: list[tuple[str, torch.Tensor]]) -> list[GradientOverflow]:
    """The :class:`GradientOverflow` of each gradient that holds inf or NaN, in order.

    One pass over every gradient finds the candidates, a reduction that is inf or NaN
    whenever an element is: on CUDA the infinity norm (one multi-tensor kernel), on
    other devices the sum (measured on a CPU: about 60x faster than torch's infinity
    norm there; a finite sum can overflow too, and such a gradient is dropped once
    counted). Only the candidates are then counted.

    Example:
        >>> g = torch.tensor([1.0, float("inf"), -3.0, float("nan")])
        >>> big = torch.full((2,), 3e38)  # its sum overflows; no element does
        >>> _count_overflows([("w", g), ("b", torch.ones(2)), ("big", big)])
        [GradientOverflow('w', shape=(4,), inf=1, nan=1, max_finite=3.0)]
    """
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = defaultdict(list)
    for index, (_, grad) in enumerate(named_grads):
        grad = grad.detach()
        if grad.is_sparse:
            grad = grad.coalesce().values()
        if grad.numel():  # the infinity norm of an empty tensor is an error; it is finite
            by_device[grad.device].append((index, grad))
    candidates: list[tuple[int, torch.Tensor]] = []
    for device, items in by_device.items():
        tensors = [g for _, g in items]
        reduced = (torch._foreach_norm(tensors, math.inf) if device.type == "cuda"
                   else [g.sum() for g in tensors])
        finite = torch.stack([r.isfinite().all() for r in reduced]).tolist()
        candidates += [item for item, ok in zip(items, finite, strict=True) if not ok]
    overflows = []
    for index, grad in sorted(candidates, key=lambda item: item[0]):
        # count_nonzero, not a bool sum (which runs in int64: ~20x slower on a CPU).
        magnitude = grad.abs()
        inf = torch.count_nonzero(magnitude == math.inf).double()
        nan = torch.count_nonzero(magnitude.isnan()).double()
        largest = magnitude.nan_to_num_(0.0, 0.0, 0.0).amax().double()  # in the copy
        inf, nan, largest = torch.stack([inf, nan, largest]).tolist()
        if inf or nan:
            name, stored = named_grads[index]
            overflows.append(GradientOverflow(name, stored.shape, int(inf), int(nan), largest))
    return overflows


class TorchGradScaler(torch.amp.GradScaler, GradScaler):
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
    # Set by _fresh_diagnostics (a __dict__ update), whose comments say what they hold.
    _checking: dict[int, tuple[weakref.ref[Any], bool]]
    _scaled_input: torch.Tensor | None
    _loads: int
    _diag_found: bool | torch.Tensor | None
    _diag_scale: tuple[float, str] | None

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
        args, device = _split_device(args, device)
        config = spec.config_from_args(args, kwargs, extra_names=_EXTRA_NAMES)
        monitor = CollapseMonitor(max_consecutive_skips, on_collapse)
        if process_group is not None and not (dist.is_available()
                                              and isinstance(process_group, dist.ProcessGroup)):
            raise TypeError(f"process_group must be a torch.distributed group "
                            f"(torch.distributed.new_group(ranks)) or None, got "
                            f"{process_group!r}")
        explicit = torch.device(device) if device is not None else None
        if explicit is not None and explicit.type == "cuda" and config.enabled \
                and not torch.cuda.is_available():
            # torch.amp.GradScaler (2.13) warns and disables itself here, and the run
            # goes on in float16 with no loss scaling: gradients underflow unnoticed
            # in a log full of warnings. A loud error at construction costs nothing.
            raise RuntimeError(
                f"device={str(explicit)!r} but CUDA is not available: pass device='cpu' or "
                "enabled=False (or leave device out: the scale then lives on the device of "
                "the first tensor scaled)")
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
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._config = config
        self._monitor = monitor
        self._process_group = process_group
        self._distributed = distributed
        self._init_scale = spec.f32(config.init_scale)
        self._init_growth_tracker = 0
        self._init_hysteresis_tracker = 0
        self._hysteresis_tracker: torch.Tensor | None = None
        self._consecutive_skips: torch.Tensor | None = None
        self._skipped_on_device: torch.Tensor | None = None
        self._functional_found_inf: list[torch.Tensor] = []
        self._sync_torch_attributes()
        self._clamp_tracker = False
        self._hysteresis_may_be_set = False
        self._updates = 0
        # The device check for an unscalable scale runs from this update on (see
        # _updates_before_unscalable); moved on whenever the host learns the scale.
        self._check_unscalable_from = _updates_before_unscalable(config, self._init_scale)
        # Consecutive skipped updates: counted on the host while every check of an
        # update was read by a plain step() (which reads it anyway), else on the device.
        self._host_skips = 0
        self._skips_on_device = False
        self._host_reads = 0
        self._host_found = False
        self._skipped_on_host = 0
        self._last_skipped: bool | torch.Tensor = False
        self._bf16_checked = False
        # torch lets step()/unscale_() run only once scale() has created the scale;
        # here device= creates it at once, so a flag tells whether scale() ran.
        self._scale_called = False
        self._diagnose = diagnose
        self._history_size = int(history)
        self._reset_diagnostics()
        # Parameter names from watch(): id -> (weak reference, name), matched by identity.
        self._names: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
        if explicit is not None and config.enabled:
            try:
                self._lazy_init_scale_growth_tracker(explicit)
            except (RuntimeError, AssertionError) as exc:
                # e.g. "cuda:3" on a 2-GPU machine, or an "mps" torch was not built with.
                # torch's first sentence names the cause; the rest can be a dispatcher dump.
                cause = str(exc).strip().split(". ")[0].splitlines()[0] if str(exc).strip() \
                    else type(exc).__name__
                raise RuntimeError(f"device={str(explicit)!r} cannot hold the scale ({cause}): "
                                   "pass device='cpu' or enabled=False") from exc

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.state}, {self._config})"

    def _reset_diagnostics(self) -> None:
        """Empties what the diagnostics keep (a new scaler, or a pickled copy's)."""
        self.__dict__.update(self._fresh_diagnostics())

    def _fresh_diagnostics(self) -> dict[str, Any]:
        return {
            # The history ring: [N, 2] float32 (scale, skipped) on the scale's device, made
            # with the scale; a view per slot, so that a record is one op (a stack into it).
            # Record k (from 0) is update _ring_base + k + 1: every update writes one.
            "_ring": None, "_ring_slots": (), "_ring_count": 0, "_ring_base": 0,
            # Host references only (no device work): the optimizers checked since the
            # last update, id -> (weak reference, whether unscale_ ran on it), and the
            # last single-tensor input of scale().
            "_checking": {}, "_scaled_input": None,
            # The last update(), for overflow_report(): its number, its found_inf (a bool
            # when a plain step() read it, else the device flag; None: no update yet or
            # a manual update(new_scale)), what it checked, the config it ran, and how
            # many load_state_dict() calls had been made (one since: the scale is not
            # what the update left; _diag_scale, the skipped update's scale inferred
            # before that load).
            "_diag_step": 0, "_diag_found": None, "_diag_checked": {}, "_diag_input": None,
            "_diag_functional": 0, "_diag_config": self._config, "_diag_loads": 0,
            "_diag_scale": None,
            "_loads": 0, "_diag_report": None, "_diag_report_ready": False,
            "_last_skip_report": None,
        }

    def _sync_torch_attributes(self) -> None:
        self._rule_graph: tuple[Any, torch.Tensor] | None = None  # holds the old config
        self._native_update = torch_expressible(self._config)  # asked at every update
        # Made here, where the config changes, not in update(): spec.f32 does not
        # trace under torch.compile.
        self._constants = (None if self._scale is None
                           else _rule_constants(self._config, self._scale.device))
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
        self._constants = _rule_constants(self._config, dev)
        self._rule_graph = None  # captured with the old tensors
        self._hysteresis_tracker = torch.full((), self._init_hysteresis_tracker,
                                              dtype=torch.int32, device=dev)
        self._consecutive_skips = torch.zeros((), dtype=torch.float32, device=dev)
        self._skipped_on_device = torch.zeros((), dtype=torch.float32, device=dev)
        self._hysteresis_may_be_set = self._init_hysteresis_tracker > 0
        self._device = dev.type
        if self._history_size:
            self._ring = torch.zeros((self._history_size, 2), dtype=torch.float32, device=dev)
            self._ring_slots = self._ring.unbind(0)
            self._ring_count = 0
            self._ring_base = self._updates

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
        """Whether ``update`` runs ``torch._amp_update_scale_`` (else the spec in tensor ops)."""
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
        self._check_unscalable_from = self._updates + _updates_before_unscalable(
            self._config, scale)

    # torch.amp.GradScaler's own accessors come first in the MRO; these are the
    # interface's, over _reconfigure (validated, one config). Its setters return the
    # scaler (for chaining) where torch's return None.
    get_growth_factor = GradScaler.get_growth_factor
    set_growth_factor = GradScaler.set_growth_factor  # type: ignore[assignment]
    get_backoff_factor = GradScaler.get_backoff_factor
    set_backoff_factor = GradScaler.set_backoff_factor  # type: ignore[assignment]
    get_growth_interval = GradScaler.get_growth_interval
    set_growth_interval = GradScaler.set_growth_interval  # type: ignore[assignment]

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
        return {**canonical, **self._torch_keys(state)}

    def _torch_keys(self, state: ScalerState) -> dict[str, Any]:
        # The factors rounded to float32: torch's kernel multiplies by the factor
        # it holds, and with the float32 one it computes the spec's bits.
        return {"scale": state.scale, "growth_factor": spec.f32(self._config.growth_factor),
                "backoff_factor": spec.f32(self._config.backoff_factor),
                "growth_interval": self._config.growth_interval,
                "_growth_tracker": state.growth_tracker}

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
        return self._torch_keys(self.state)

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
                and self._ring is None and self._scale is not None
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

    def __getstate__(self) -> dict[str, Any]:
        d = super().__getstate__()
        # Device tensors and process groups do not pickle well; carry numbers.
        d["_init_hysteresis_tracker"] = self._get_hysteresis_tracker()
        d["_skipped_on_host"] = self.num_skipped_steps
        d["_last_skipped"] = self.last_step_skipped
        # torch's copy re-creates its scale lazily, so its step() needs a scale() first.
        d["_scale_called"] = False
        for name in ("_hysteresis_tracker", "_consecutive_skips", "_skipped_on_device",
                     "_process_group", "_constants", "_rule_graph"):
            d[name] = None
        # History and reports are not state (weak references do not pickle either):
        # the copy starts them afresh.
        d.update(self._fresh_diagnostics(), _names={})
        return d

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
        on_device = self._skipped_on_device
        extra = int(on_device.item()) if on_device is not None else 0
        return self._skipped_on_host + extra

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
        if isinstance(outputs, torch.Tensor):  # the usual loss: no tree walk (host time)
            # A reference (no op): overflow_report() checks it for inf/NaN after a skip.
            self._scaled_input = outputs
            return self._scale_one(outputs)
        self._scaled_input = None
        # torch's scale() takes a tensor or an iterable of them; dicts (named
        # losses) and nesting are mapped here too.
        return tree_map(self._scale_one, outputs)

    def _scale_one(self, tensor: Any) -> torch.Tensor:
        # The multiply is written here rather than through torch.amp.GradScaler.scale,
        # which torch.compile refuses to trace (a graph break in a compiled train step).
        if not isinstance(tensor, torch.Tensor):
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
            self._lazy_init_scale_growth_tracker(_device_of(optimizer))
        try:
            super().unscale_(optimizer)
        except ValueError as exc:
            if "FP16" not in str(exc):
                raise
            raise ValueError(
                "Attempting to unscale FP16 gradients. Keep the parameters (and so their "
                "gradients) in float32 and run the float16 compute under torch.autocast: "
                "unscaled float16 gradients flush small values to zero, which is what loss "
                "scaling exists to prevent. (Fused optimizers take float16 gradients.)"
            ) from None
        self._checking[id(optimizer)] = (weakref.ref(optimizer), True)
        self._finish_check(optimizer)

    @staticmethod
    def _scale_not_called(verb: str) -> ScaleNotCalledError:
        # torch 2.13 raises this (an AssertionError) when its lazily created scale
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
        # step, without a call each (host time a launch-bound step waits for).
        if self._updates >= self._check_unscalable_from or _traced(self._device):
            self._found_inf_if_reciprocal_overflows(
                self._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values())
        if self._distributed is not False and _DIST_AVAILABLE and dist.is_initialized():
            self._agree_across_ranks(optimizer)

    def _found_inf_if_reciprocal_overflows(self, founds: Any) -> None:
        # spec.unscale_overflows: below about 2.94e-39 (and at 0) 1/scale is inf in
        # float32, so every unscaled gradient is inf or NaN, yet torch's kernel checks
        # the gradients before it multiplies (2.13) and finds them finite. Raise the
        # flag on the device (a max, so it stays 0/1 for fused kernels): no host sync.
        # Three ops a step, called only once the host cannot bound the scale far above
        # it (_check_unscalable_from), and always in a CUDA graph capture or a compiled
        # step, whose replays do not run this Python.
        assert self._scale is not None  # checks run once the scale exists
        overflow = (self._scale < spec.MIN_UNSCALABLE).float()
        for found in founds:
            found.clamp_(min=overflow.to(found.device, non_blocking=True))

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        # The fused path's check: no unscaling (the fused kernel does it). Reached from
        # step() only (ours or torch's, under ours), which has made the scale.
        super()._check_inf_per_device(optimizer)
        self._checking[id(optimizer)] = (weakref.ref(optimizer), False)
        self._finish_check(optimizer)
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _agree_across_ranks(self, optimizer: torch.optim.Optimizer) -> None:
        # Called where torch.distributed is initialised and distributed is not False.
        group = self._process_group or dist.group.WORLD
        if dist.get_world_size(group) == 1:
            return
        state = self._per_optimizer_states[id(optimizer)]
        assert self._scale is not None  # checks run once the scale exists
        found = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        for value in state["found_inf_per_device"].values():
            found += value.to(found.device, non_blocking=True)
        # Every rank joins the collective, also one whose shard has no gradient.
        on_wire = found.cuda() if dist.get_backend(group) == "nccl" else found
        dist.all_reduce(on_wire, op=dist.ReduceOp.MAX, group=group)
        state["found_inf_per_device"] = {found.device: on_wire.to(found.device)}

    def _maybe_opt_step(self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any],
                        *args: Any, **kwargs: Any) -> Any:
        # The plain path's one host read: Python must decide whether to step.
        skipped = bool(sum(v.item() for v in optimizer_state["found_inf_per_device"].values()))
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
            self._lazy_init_scale_growth_tracker(_device_of(optimizer))
        fused = getattr(optimizer, "_step_supports_amp_scaling", False)
        if fused and not torch.compiler.is_compiling() and not _takes_grad_scaler(optimizer):
            retval = self._fused_step(optimizer, *args, **kwargs)
        else:
            retval = super().step(optimizer, *args, **kwargs)
        return retval

    def _fused_step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """torch's ``step()`` for an optimizer that skips on the device (``fused=True``),
        less two ops and its signature walks: the flag goes to the optimizer as it is
        where torch passes ``0 + flag`` (its ``sum`` of one device's flags), and the
        scale where torch passes ``scale * 1`` (no ``grad_scale`` of the optimizer's
        own). Same checks, errors and attributes as torch 2.13's."""
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self._check_inf_per_device(optimizer)
        scale = self._scale
        assert scale is not None  # made by step()
        founds = [t.to(scale.device, non_blocking=True)
                  for t in state["found_inf_per_device"].values()]
        own = getattr(optimizer, "grad_scale", None)
        # Fused optimizers read these two attributes, which Optimizer does not declare.
        if state["stage"] == OptState.UNSCALED:
            optimizer.grad_scale = own  # type: ignore[attr-defined]
        else:
            optimizer.grad_scale = scale if own is None else scale * own  # type: ignore[attr-defined]
        optimizer.found_inf = founds[0] if len(founds) == 1 else sum(founds)  # type: ignore[attr-defined]
        retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        del optimizer.grad_scale  # type: ignore[attr-defined]
        del optimizer.found_inf  # type: ignore[attr-defined]
        return retval

    def unscale(self, grads: Any) -> tuple[Any, torch.Tensor]:
        """Functional unscale: ``(unscaled copies of grads, all finite)``, no host sync.

        ``grads`` is a tensor or a list/tuple/dict of them; ``all finite`` is a 0-dim
        bool tensor. The check counts towards the next ``update()``.
        """
        for leaf in leaves(grads):
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(
                    f"grads must be a Tensor or a list/tuple/dict of Tensors, got a "
                    f"{type(leaf).__name__} leaf ({leaf!r}); convert it with torch.as_tensor "
                    "(gradients of a scaled loss are tensors already)")
        out = tree_map(lambda grad: grad.detach().clone(), grads)
        copies = leaves(out)
        if not self._enabled:
            return out, torch.tensor(True)
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
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, found_here, inv.to(device))
            found += found_here.to(found.device)
        if len(groups) > 1:
            found.clamp_(max=1.0)  # a 0/1 flag, as every check's (update counts on it)
        if self._updates >= self._check_unscalable_from or _traced(self._device):
            self._found_inf_if_reciprocal_overflows([found])
        self._functional_found_inf.append(found)
        return out, found == 0

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
        counts as one more check; ``update()`` uses the checks alone.

        ``new_scale`` sets the scale instead, leaving the trackers, as torch does (a
        number as the first argument is ``new_scale``, as in torch):
        a Python or NumPy number, or a 1-element NumPy array (checked: finite and
        > 0 in float32), or a 1-element floating-point tensor (not checked: that
        would wait for the device). Such a manual update is not counted as an update:
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
        finite, new_scale = update_arguments(finite, new_scale)
        if not self._enabled:
            return self
        # torch's _check_scale_growth_tracker, which torch.compile does not trace.
        scale, growth = self._scale, self._growth_tracker
        if scale is None or growth is None:
            raise ScaleNotCalledError(
                "Attempted update but _scale is None.  This may indicate your script did not "
                "use scaler.scale(loss or outputs) earlier in the iteration. Fix: call "
                "scaler.scale(loss).backward() and scaler.step(optimizer) before "
                "scaler.update()")
        if new_scale is not None:
            self._set_scale(scale, new_scale)
            self._diag_found = None  # not a skip; overflow_report() is None after it
        else:
            # One pass: the flags, and how many optimizers checked. Every check since
            # the last update was read by a plain step() when there is one read per
            # optimizer that checked and no functional unscale().
            found_infs = []
            checked = 0
            for state in self._per_optimizer_states.values():
                founds = state["found_inf_per_device"]
                if founds:
                    checked += 1
                    found_infs += [found.to(scale.device, non_blocking=True)
                                   for found in founds.values()]
            functional = self._functional_found_inf
            if functional:
                found_infs += functional
            if finite is not None:
                found_infs.append(_not_finite(finite, scale.device))
            elif not found_infs:
                raise NoInfChecksError("No inf checks were recorded prior to update.")
            host_found = (self._host_found if self._host_reads == checked and not functional
                          and finite is None else None)
            if len(found_infs) > 1:
                found = torch.stack(found_infs).sum().clamp_(max=1.0)
            else:
                found = found_infs[0]  # 0.0 or 1.0
            # Both before the update changes the scale in place.
            if self._ring is not None:
                self._record(scale, found)
            # Not inside a traced graph: a replay would not run this Python.
            diagnosed = self._diagnose and not _traced(self._device)
            report = self._diagnose_now(scale, found, host_found) if diagnosed else None
            self._apply_update(scale, growth, found)
            self._updates += 1
            if host_found is not None:
                self._last_skipped = host_found
                self._skipped_on_host += host_found
            else:
                self._last_skipped = found
                assert self._skipped_on_device is not None  # made with the scale
                self._skipped_on_device.add_(found)
            self._remember_update(found, host_found, report, diagnosed)
            self._watch_collapse(found, host_found)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        if self._functional_found_inf:
            self._functional_found_inf = []
        self._host_reads = 0
        self._host_found = False
        self._checking = {}
        return self

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

    def _apply_update(self, scale: torch.Tensor, growth: torch.Tensor,
                      found: torch.Tensor) -> None:
        config = self._config
        hyst = self._hysteresis_tracker
        assert hyst is not None  # made with the scale
        if self._native_update:
            if self._clamp_tracker:
                # torch grows on tracker + 1 == interval; the spec on >=.
                growth.clamp_(max=config.growth_interval - 1)
                self._clamp_tracker = False
            growth_factor, backoff_factor = self._float32_factors
            torch._amp_update_scale_(scale, growth, found, growth_factor, backoff_factor,
                                     config.growth_interval)
            if self._hysteresis_may_be_set:
                # With hysteresis 1 the spec leaves the tracker at 0 after any update.
                hyst.zero_()
                self._hysteresis_may_be_set = False
        else:
            constants = self._constants
            assert constants is not None  # made with the scale
            rule = _rule_for(config, constants, scale.device)
            if rule is _compiled_rule and scale.is_cuda and not _traced(self._device):
                self._replay_rule(found)
            else:
                rule(scale, growth, hyst, found, config, constants)
            self._hysteresis_may_be_set = True

    def _replay_rule(self, found: torch.Tensor) -> None:
        """The compiled rule as a CUDA graph of its one kernel, replayed: calling a compiled
        function costs ~90 us of host time per update (measured, H100, torch 2.11), more
        than the launch-bound step can hide; a replay costs a few. Captured once per config
        and set of tensors, with the scaler's own tensors (capture records, it does not
        run) and a flag buffer the found_inf of each update is copied into."""
        if self._rule_graph is None:
            assert self._scale is not None  # update() checked it
            flag = torch.zeros((), device=self._scale.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                _compiled_rule(self._scale, self._growth_tracker, self._hysteresis_tracker,
                               flag, self._config, self._constants)
            self._rule_graph = (graph, flag)
        graph, flag = self._rule_graph
        flag.copy_(found)
        graph.replay()

    def _watch_collapse(self, found: torch.Tensor, host_found: bool | None) -> None:
        """Counts consecutive skipped updates (``found`` is 0.0 or 1.0; ``host_found`` its
        value when a plain step() has read it, else None) and, once per period, reads
        the scale and reports a collapse."""
        # Made with the scale, which update() checked.
        assert self._scale is not None and self._consecutive_skips is not None
        if host_found is not None:
            if self._skips_on_device:  # a switch from fused steps: rare
                self._host_skips = int(self._consecutive_skips.item())
                self._skips_on_device = False
            self._host_skips = self._host_skips + 1 if host_found else 0
        else:
            if not self._skips_on_device:
                self._consecutive_skips.fill_(self._host_skips)
                self._skips_on_device = True
            # found * (skips + 1) in one op: the run grows on a skip, else restarts at 0.
            torch.addcmul(found, self._consecutive_skips, found, out=self._consecutive_skips)
        # Read the device only every `period` updates, so update() stays free of
        # host syncs in between.
        limit = self._monitor.max_consecutive_skips
        if self._updates % (limit or 100) == 0 and not _traced(self._device):
            scale = float(self._scale.item())  # the one read per period
            self._scale_known(scale)
            skips = (int(self._consecutive_skips.item()) if self._skips_on_device
                     else self._host_skips)
            if scale < spec.FLOAT32_MIN_NORMAL or (limit is not None and skips >= limit):
                self._monitor.report(self._updates, scale, skips, detail=self._collapse_detail)
            else:
                self._monitor.clear()

    # ------------------------------------------------------------ diagnostics

    def watch(self, model: Any) -> None:
        """Names the parameters in :meth:`overflow_report`.

        ``model`` is anything with ``named_parameters()`` (a ``torch.nn.Module``, a
        Lightning module, DDP), a dict ``name -> parameter`` or an iterable of
        ``(name, parameter)`` pairs. Names
        are matched to the optimizer's parameters by identity (weakly held: watching
        keeps nothing alive); a later call adds names, renaming a parameter seen
        again. Parameters without a name are reported as ``param_groups[g][i]``
        (``optimizers[k].param_groups[g][i]`` when several optimizers were checked).

        Example:
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
            >>> scaler = TorchGradScaler(device="cpu")
            >>> scaler.watch(model)
            >>> scaler.watch([("head", torch.nn.Parameter(torch.zeros(1)))])
        """
        pairs = watched_pairs(model, lambda p: isinstance(p, torch.Tensor), "parameter")
        self._names = {key: entry for key, entry in self._names.items()
                       if entry[0]() is not None}
        for name, param in pairs:
            self._names[id(param)] = (weakref.ref(param), str(name))

    def overflow_report(self) -> OverflowReport | None:
        """Which gradients held inf/NaN at the last update, if it skipped; else None.

        None also before any update, after a manual ``update(new_scale)`` and on a
        disabled scaler. The report lists, in parameter order, the gradients of the
        optimizers checked in that iteration that held inf or NaN, each with its inf
        and NaN counts and its largest finite magnitude (of the gradient as stored:
        unscaled after ``unscale_``/``step``; a fused optimizer's gradients are still
        multiplied by the scale, as its kernel skips everything), and whether the last
        single tensor given to :meth:`scale` was finite (None when it was a list or
        dict). Built from the gradients as they are when first asked (``diagnose=True``:
        inside the skipped ``update()``), then kept until the next update. It reads
        the device; it never changes a step, the scale or found_inf.

        Example:
            >>> model = torch.nn.Linear(2, 1)
            >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> scaler = TorchGradScaler(1024.0, device="cpu")
            >>> scaler.watch(model)
            >>> scaler.scale(model(torch.ones(1, 2)).sum()).backward()
            >>> model.bias.grad[0] = float("inf")  # an overflow, injected
            >>> scaler.step(opt); _ = scaler.update()
            >>> report = scaler.overflow_report()
            >>> report.names, report.step, report.scale, report.loss_finite
            (['bias'], 1, 1024.0, True)
        """
        if not self._enabled or self._diag_found is None:
            return None
        if not self._diag_report_ready:
            found = self._diag_found
            skipped = found if isinstance(found, bool) else bool(found.item())
            report = self._build_report(self._scale_of_last_update(), self._diag_step,
                                        self._diag_checked, self._diag_input,
                                        self._diag_functional, now=False) if skipped else None
            self._keep_report(report)
        return self._diag_report

    def history(self) -> ScaleHistory:
        """The last ``history`` updates: ``(iteration, scale, skipped)``, oldest first.

        ``iteration`` counts updates from 1; ``scale`` is the scale that iteration's
        loss was multiplied by (before the update changed it); ``skipped`` whether its
        step was skipped. A manual ``update(new_scale)`` is not recorded. The records
        live on the scale's device, written without a host sync; the host counts the
        updates. (Updates replayed from a CUDA graph are not kept faithfully: a replay
        rewrites the slot its capture wrote, and the host does not see it.) Reads the
        device once.

        Raises:
            ValueError: The scaler was built with ``history=0``.

        Example:
            >>> model = torch.nn.Linear(2, 1)
            >>> opt = torch.optim.SGD(model.parameters(), lr=0.0)
            >>> scaler = TorchGradScaler(1024.0, growth_interval=1, device="cpu", history=2)
            >>> for x in (1.0, 1.0, float("inf")):  # the third overflows
            ...     scaler.scale(model(torch.full((1, 2), x)).sum()).backward()
            ...     scaler.step(opt); _ = scaler.update(); opt.zero_grad()
            >>> scaler.history().as_list()
            [(2, 2048.0, False), (3, 4096.0, True)]
        """
        if not self._history_size:
            raise ValueError("this scaler keeps no history (history=0): build it with "
                             "history=N, e.g. TorchGradScaler(..., history=1024), to keep the "
                             "last N updates")
        if self._ring is None or not self._ring_count:
            return ScaleHistory([], [], [])
        records = self._ring.tolist()  # the one read
        size, count = self._history_size, self._ring_count
        # Slot s holds the last record k < count with k % size == s.
        last = [count - 1 - (count - 1 - s) % size for s in range(size)]
        return ScaleHistory.from_ring([self._ring_base + k + 1 for k in last],
                                      [r[0] for r in records], [r[1] > 0 for r in records],
                                      count)

    def _record(self, scale: torch.Tensor, found: torch.Tensor) -> None:
        # One op into the slot's view (found is float32 0.0/1.0 on the scale's device).
        # A traced update indexes the ring instead: one graph for every slot, where a
        # view per slot would be a guard, and a recompilation, per slot.
        slot = self._ring_count % self._history_size
        out = self._ring[slot] if torch.compiler.is_compiling() else self._ring_slots[slot]
        torch.stack((scale, found), out=out)
        self._ring_count += 1

    def _diagnose_now(self, scale: torch.Tensor, found: torch.Tensor,
                      host_found: bool | None) -> OverflowReport | None:
        """diagnose=True: the report of this update if it skips, built before the update
        changes the scale. A plain step() has read found_inf already; otherwise this is
        the one read."""
        skipped = host_found if host_found is not None else bool(found.item())
        if not skipped:
            return None
        return self._build_report(float(scale.item()), self._updates + 1, self._checking,
                                  self._scaled_input, len(self._functional_found_inf),
                                  now=True)

    def _remember_update(self, found: torch.Tensor, host_found: bool | None,
                         report: OverflowReport | None, diagnosed: bool) -> None:
        # Host assignments only: what overflow_report() needs later.
        self._diag_step = self._updates
        self._diag_found = host_found if host_found is not None else found
        self._diag_checked = self._checking
        self._diag_input = self._scaled_input
        self._diag_functional = len(self._functional_found_inf)
        self._diag_config = self._config
        self._diag_loads = self._loads
        self._diag_scale = None
        self._diag_report_ready = False
        if diagnosed:
            self._keep_report(report)

    def _keep_report(self, report: OverflowReport | None) -> None:
        self._diag_report = report
        self._diag_report_ready = True
        if report is not None:
            self._last_skip_report = report

    def _scale_of_last_update(self) -> tuple[float, str]:
        """The scale the last (skipped) update started from, and a note when inexact."""
        if self._ring is not None and self._ring_count:
            return float(self._ring[(self._ring_count - 1) % self._history_size, 0]), ""
        if self._diag_loads != self._loads:
            if self._diag_scale is not None:  # inferred before the first load since
                return self._diag_scale
            return math.nan, "The scale was loaded since the update, so its scale is unknown."
        # Reached after an update, which needs the scale (made with the trackers).
        assert self._scale is not None and self._hysteresis_tracker is not None
        scale, exact = _scale_before_skip(self._diag_config, float(self._scale.item()),
                                          int(self._hysteresis_tracker.item()))
        return scale, "" if exact else (
            "The scale is inferred from the backed-off one and may be off by a rounding "
            "(or the min_scale clamp): history=N or diagnose=True keep the exact value.")

    def _build_report(self, scale: float | tuple[float, str], step: int,
                      checked: dict[int, tuple[weakref.ref[Any], bool]],
                      loss: torch.Tensor | None, functional: int, now: bool) -> OverflowReport:
        scale, note = scale if isinstance(scale, tuple) else (scale, "")
        notes = [note] if note else []
        referents = [(ref(), unscaled) for ref, unscaled in checked.values()]
        if any(opt is None for opt, _ in referents):
            notes.append("An optimizer checked in that iteration has been deleted since.")
        optimizers = [(opt, unscaled) for opt, unscaled in referents if opt is not None]
        several = len(optimizers) > 1
        named_grads: list[tuple[str, torch.Tensor]] = []
        seen: set[int] = set()
        for k, (opt, _) in enumerate(optimizers):
            for g, group in enumerate(opt.param_groups):
                for i, param in enumerate(group["params"]):
                    if param.grad is None or id(param) in seen:
                        continue
                    seen.add(id(param))
                    named_grads.append((self._name_of(param, k, g, i, several), param.grad))
        overflows = _count_overflows(named_grads)
        loss_finite = None if loss is None else bool(torch.isfinite(loss.detach()).all())
        if scale < spec.MIN_UNSCALABLE:
            notes.append(f"The scale {scale:g} is below {spec.MIN_UNSCALABLE:.3g}, whose "
                         "reciprocal is inf in float32: every check fails there; set "
                         "min_scale to keep a floor.")
        elif not overflows and not now:
            notes.append("No gradient holds inf/NaN now: they were zeroed or freed since "
                         "the update (zero_grad()); build the scaler with diagnose=True "
                         "to keep the report from inside update().")
        if overflows and any(not unscaled for _, unscaled in optimizers):
            notes.append("A fused optimizer's gradients are still multiplied by the scale "
                         "(its kernel skipped the step, unscaling included).")
        if functional:
            notes.append(f"{functional} check(s) by unscale(grads) are not covered: their "
                         "gradients are copies the caller holds.")
        return OverflowReport(step, scale, overflows, len(named_grads), loss_finite,
                              " ".join(notes))

    def _name_of(self, param: torch.Tensor, k: int, g: int, i: int, several: bool) -> str:
        entry = self._names.get(id(param))
        if entry is not None and entry[0]() is param:
            return entry[1]
        return (f"optimizers[{k}]." if several else "") + f"param_groups[{g}][{i}]"

    def _collapse_detail(self) -> str:
        """The collapse warning's last sentence: the last skipped update's report."""
        report = self.overflow_report() or self._last_skip_report
        if report is None:
            return ""
        return report.collapse_detail()

    # ------------------------------------------------------------ tooling

    @classmethod
    def devices(cls) -> list[str]:
        """``cpu`` and every CUDA device torch sees."""
        return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
