"""The zoo's adapters of torch's own scalers: ``torch.amp.GradScaler`` and FSDP's
``ShardedGradScaler``.

Each drives the real scaler as torch's AMP recipe does: ``scaler.scale(loss).backward()``
on a real ``torch.nn.Linear``, ``scaler.step(optimizer)`` for every optimizer, then
``scaler.update()``. Torch's scalers have no hysteresis, no bounds and no static mode,
so their config space is the spec's with ``hysteresis=1``, no ``min_scale`` or
``max_scale``, and ``dynamic=True``; torch refuses ``growth_factor <= 1`` and
``backoff_factor >= 1``. The device is ``UNIFIEDAMP_DEVICE`` (default ``cpu``).

The helpers here (the device, a one-process group, the handle) serve the zoo's other
torch-based adapters too (DeepSpeed's and Megatron-core's).

Example:
    >>> from unifiedamp.conformance.zoo.torch_grad_scaler import TorchAmpGradScaler
    >>> from unifiedamp.spec import ScalerConfig
    >>> adapter = TorchAmpGradScaler()
    >>> handle = adapter.iterate(adapter.new(ScalerConfig(1024.0)), "I")
    >>> adapter.read(handle)
    ScalerState(scale=512.0, growth_tracker=0, hysteresis_tracker=0)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from unifiedamp._tree import tree_map
from unifiedamp.conformance.interface import Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import ScalerConfig, ScalerState, read_form, to_state_dict
from unifiedamp.spec._state_dict import form_cannot_carry

__all__ = ["DIFFERENCES", "Run", "ShardedGradScaler", "TorchAmpGradScaler", "device",
           "ensure_process_group", "release_process_group"]


def device() -> str:
    """The device the torch-based zoo adapters run on: ``UNIFIEDAMP_DEVICE``, default cpu."""
    return os.environ.get("UNIFIEDAMP_DEVICE", "cpu")


_STORE_DIR: tempfile.TemporaryDirectory | None = None


def ensure_process_group() -> None:
    """Starts a one-process gloo group unless one exists: FSDP's scaler all-reduces its
    inf flag over it, and DeepSpeed's logs the rank on every overflow."""
    global _STORE_DIR
    import torch.distributed as dist

    if dist.is_initialized():
        return
    _STORE_DIR = tempfile.TemporaryDirectory(prefix="unifiedamp-zoo-")
    store = dist.FileStore(os.path.join(_STORE_DIR.name, "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def release_process_group() -> None:
    """Ends the group :func:`ensure_process_group` started, if it started one (a test
    process must not leave it: the torch backend all-reduces whenever a group exists)."""
    global _STORE_DIR
    import torch.distributed as dist

    if _STORE_DIR is None:
        return
    if dist.is_initialized():
        dist.destroy_process_group()
    _STORE_DIR.cleanup()
    _STORE_DIR = None


class Run:
    """A handle: the real scaler, the problems it trains, the config it runs.

    ``config`` holds what the scaler's own state does not (torch's ``init_scale``
    once it has started), so that ``save`` writes the config it was given.
    """

    def __init__(self, scaler: Any, problems: list[Any], config: ScalerConfig):
        self.scaler, self.problems, self.config = scaler, problems, config

    def __getitem__(self, i: int) -> Any:  # Adapter.reconfigure's handle[0]
        return (self.scaler, self.problems)[i]


def torch_problems(count: int, dev: str) -> list[Any]:
    """``count`` real ``Linear`` + Adam problems whose ``set_grads(kind, scaler)`` runs
    ``scaler.scale(loss).backward()`` (the suite's torch problems)."""
    from unifiedamp.conformance.adapters.torch import make_problem

    return [make_problem("adam", dev)[0] for _ in range(count)]


def backward_one(name: str, handle: Any, kinds: str,
                 scale: Callable[[Any], Any]) -> tuple[Any, list[Any]]:
    """The backward pass of an adapter that trains one optimizer: the problem's loss
    through ``scale`` (its framework's own loss scaling), then ``.backward()``.
    Returns the optimizer and its gradients."""
    if len(kinds) != 1:
        raise ValueError(f"{name} runs one optimizer, got kinds {kinds!r}")
    (problem,) = handle.problems
    problem.set_grads(kinds[0], _Scaling(scale))
    opt = problem.optimizer
    return opt, [p.grad for group in opt.param_groups for p in group["params"]
                 if p.grad is not None]


class _Scaling:
    """What the problems' ``set_grads`` calls: ``scale(loss).backward()``."""

    def __init__(self, scale: Callable[[Any], Any]):
        self.scale = scale


def snapshot(run: Run) -> list[np.ndarray]:
    return [a.copy() for problem in run.problems for a in problem.snapshot()]


class TorchAmpGradScaler(Adapter):
    """``torch.amp.GradScaler(device)`` as torch's AMP recipe drives it.

    ``set_config`` goes through the scaler's ``set_growth_factor``,
    ``set_backoff_factor`` and ``set_growth_interval``, the only fields torch can
    change at run time. ``save``/``load`` convert torch's ``state_dict()`` (``scale``,
    the factors, ``growth_interval``, ``_growth_tracker``) to and from the canonical
    dict; ``init_scale``, which torch's dict does not carry, is the one the scaler was
    built or loaded with. A disabled torch scaler saves ``{}``, which has no canonical
    form: ``save`` raises then. ``scale_tree`` calls ``scaler.scale`` on each leaf
    (torch scales a tensor or a list of tensors, not a dict). Torch has no functional
    unscale of a tree (``unscale_`` works on an optimizer's gradients), so
    ``functional_unscale`` is not declared. ``jit`` compiles the loss with
    ``torch.compile(fullgraph=True)``; the scaler's verbs run eagerly, as in torch's
    own compiled-AMP examples.
    """

    name = "torch.amp.GradScaler"
    capabilities = frozenset({"multi_optimizer", "inplace_unscale", "scale_tree",
                              "set_config", "disable", "state_dict", "jit"})
    fixed: dict[str, Any] = {"hysteresis": 1, "min_scale": None, "max_scale": None,
                             "dynamic": True}
    #: What ``reconfigure`` can change: torch's ``set_<field>`` setters.
    settable = ("growth_factor", "backoff_factor", "growth_interval")

    def __init__(self) -> None:
        self.device = device()

    def expresses(self, config: ScalerConfig) -> str | None:
        reason = super().expresses(config)
        if reason is None and config.enabled and not config.growth_factor > 1.0:
            reason = (f"{self.name} refuses growth_factor={config.growth_factor!r} "
                      "(AssertionError: it must be > 1.0)")
        if reason is None and config.enabled and not config.backoff_factor < 1.0:
            reason = (f"{self.name} refuses backoff_factor={config.backoff_factor!r} "
                      "(AssertionError: it must be < 1.0)")
        return reason

    def info(self) -> dict[str, Any]:
        import torch

        return {"framework": "torch", "version": torch.__version__, "device": self.device}

    def _scaler(self, config: ScalerConfig) -> Any:
        import torch

        return torch.amp.GradScaler(
            self.device, init_scale=config.init_scale, growth_factor=config.growth_factor,
            backoff_factor=config.backoff_factor, growth_interval=config.growth_interval,
            enabled=config.enabled)

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Run:
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"cannot build {self.name} for {config}: {reason}")
        return Run(self._scaler(config), torch_problems(optimizers, self.device), config)

    def iterate(self, handle: Run, kinds: str, loss_fn: Any = None) -> Run:
        scaler = handle.scaler
        for kind, problem in zip(kinds, handle.problems, strict=True):
            if loss_fn is None:
                problem.set_grads(kind, scaler)
            else:
                problem.set_grads(kind, scaler, loss_fn)
            scaler.step(problem.optimizer)
        scaler.update()
        return handle

    def compiled_iterate(self, handle: Run, kinds: str) -> Run:
        from unifiedamp.conformance.adapters.torch import compiled_loss

        return self.iterate(handle, kinds, compiled_loss())

    def read(self, handle: Run) -> ScalerState:
        scaler = handle.scaler
        d = scaler.state_dict()
        if not d:  # disabled: torch reports the scale it applies, 1.0
            return ScalerState(scaler.get_scale(), 0, 0)
        # Torch has no hysteresis: with hysteresis 1 the spec's tracker is always 0.
        return ScalerState(d["scale"], d["_growth_tracker"], 0)

    def snapshot(self, handle: Run) -> list[np.ndarray]:
        return snapshot(handle)

    def reconfigure(self, handle: Run, changes: dict[str, Any]) -> Run:
        other = sorted(set(changes) - set(self.settable))
        if other:
            raise ValueError(f"{self.name} cannot change {', '.join(other)} at run time: it "
                             f"has setters for {', '.join(self.settable)} only")
        for field, value in changes.items():
            getattr(handle.scaler, f"set_{field}")(value)
        handle.config = handle.config.replace(**changes)
        return handle

    def save(self, handle: Run) -> dict[str, Any]:
        native = handle.scaler.state_dict()
        if not native:
            raise ValueError(f"{self.name}(enabled=False).state_dict() is {{}}: a disabled "
                             "torch scaler keeps no state, so there is nothing to convert")
        config, state, _ = read_form(native, handle.config)
        return to_state_dict(config, state, self.name)

    def load(self, handle: Run, state_dict: dict[str, Any]) -> Run:
        config, state, _ = read_form(state_dict, handle.config)
        # Torch's dict does not carry `enabled`: whether to scale is the run's.
        lost = form_cannot_carry(config.replace(enabled=True), "torch")
        if lost:
            raise ValueError(f"{self.name} cannot load {', '.join(lost)}: its state_dict has "
                             "no such field and its update rule has no such parameter")
        # The factors as given, as a user's torch.amp.GradScaler(...) holds them.
        handle.scaler.load_state_dict({
            "scale": state.scale, "growth_factor": config.growth_factor,
            "backoff_factor": config.backoff_factor,
            "growth_interval": config.growth_interval, "_growth_tracker": state.growth_tracker})
        handle.config = config.replace(enabled=handle.config.enabled)
        return handle

    def scale_tree(self, handle: Run, tree: Any) -> Any:
        import torch

        def scale(leaf: np.ndarray) -> np.ndarray:
            out = handle.scaler.scale(torch.from_numpy(np.array(leaf)).to(self.device))
            return out.detach().cpu().numpy()

        return tree_map(scale, tree)


class ShardedGradScaler(TorchAmpGradScaler):
    """``torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler(device)``, driven
    like ``torch.amp.GradScaler``.

    It all-reduces its inf flag over a process group in ``unscale_``: the adapter starts
    a one-process gloo group (a ``FileStore`` in a temporary directory) when none exists.
    ``distributed_iterate`` runs one iteration on that many gloo processes, each with its
    own scaler and gradients, as FSDP's ranks hold their own shards. On CPU its
    ``update`` runs its own Python ``_amp_update_scale_cpu_`` instead of torch's kernel.
    """

    name = "torch.distributed.fsdp.ShardedGradScaler"
    capabilities = TorchAmpGradScaler.capabilities | {"distributed"}

    def distributed_iterate(self, handle: Run, kinds_per_rank: list[str]) -> list[ScalerState]:
        return spawn_rank_states(_sharded_rank, len(kinds_per_rank), handle.config.to_dict(),
                                 kinds_per_rank, self.device)

    def _scaler(self, config: ScalerConfig) -> Any:
        import torch.distributed as dist
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as Sharded

        ensure_process_group()
        return Sharded(self.device, init_scale=config.init_scale,
                       backoff_factor=config.backoff_factor,
                       growth_factor=config.growth_factor,
                       growth_interval=config.growth_interval, enabled=config.enabled,
                       process_group=dist.group.WORLD)


_FLOAT64_FACTOR = Difference(
    sentence="torch.amp.GradScaler's kernel multiplies the float32 scale by the factor held "
             "as a float64 and rounds once, so a factor that is no float32 value (1.1, 0.7) "
             "can give a scale one float32 step from the spec's f32(scale * f32(factor)); "
             "ShardedGradScaler on CPU multiplies by a Python scalar, rounded to float32 "
             "first, and matches the spec.",
    matters="Not for training: one unit in the last place, and only with factors that are "
            "not float32 values (2 and 0.5 are exact). It matters where scales are compared "
            "bit for bit across frameworks (replays, checkpoint diffs).",
    checked="torch/amp/grad_scaler.py GradScaler.update passes the Python floats "
            "_growth_factor/_backoff_factor to torch._amp_update_scale_, whose CPU kernel "
            "(aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp) computes "
            "current_scale * growth_factor in double, then casts to float. By hand, init 77, "
            "growth 1.1, 'F': 77 * 1.1 = 84.70000000000000284 in float64 rounds to "
            "84.69999694824219 (0x42a96666); the spec's 77 * f32(1.1) = 84.7000018358... "
            "rounds to 84.70000457763672 (0x42a96667). Random example: 1.5 * "
            "0.7533314547664258 gives 1.1299971342086792 (spec 1.1299972534179688). Both "
            "confirmed with torch._amp_update_scale_ on CPU, torch 2.13.0.")

_RECIPROCAL = Difference(
    sentence="Torch checks the scaled gradients for inf/NaN before unscaling them, so where "
             "1/scale overflows float32 (a scale below about 2.9e-39, or 0) the finite "
             "gradients pass the check, are multiplied by inv_scale = inf and the optimizer "
             "steps with inf or NaN gradients, where the spec skips the step and backs off.",
    matters="Only after the scale has collapsed below ~2.9e-39, some 150 consecutive "
            "backoffs from 65536 (a run whose every step overflows): torch then writes inf or "
            "NaN into the parameters instead of skipping.",
    checked="GradScaler.unscale_ (and ShardedGradScaler.unscale_) computes inv_scale = "
            "self._scale.double().reciprocal().float(), inf for 2**-130, and "
            "torch._amp_foreach_non_finite_check_and_unscale_ sets found_inf from the "
            "incoming values, then multiplies. By hand, init 2**-130, interval 1, 'F': the "
            "gradients 0.5/16 * 2**-130 are finite, found_inf stays 0, the scale grows to "
            "2**-129 (spec: backs off to 2**-131 and skips) and Adam gets inf gradients; "
            "confirmed: _amp_foreach_non_finite_check_and_unscale_([1e-3], found_inf, inf) "
            "leaves found_inf 0 and the gradient inf. backoff_reaches_zero_and_stays: from "
            "2**-148, 'II' gives 2**-149 then 0; at scale 0 the scaled gradients are 0, "
            "0 * inf = NaN, and the finite step writes NaN into the parameters.")

_EQUAL_INTERVAL = Difference(
    sentence="Torch grows only when growth_tracker + 1 == growth_interval, so a tracker "
             "already at or past a lowered interval (set_growth_interval mid-run, or a state "
             "loaded with a smaller interval) never equals it again and the scale stops "
             "growing (until the int32 tracker wraps around).",
    matters="Yes, whenever growth_interval is lowered below the current tracker (a schedule, "
            "or a run resumed with a new interval): the scale never grows again, so "
            "gradients that underflow at the current scale stay underflowed.",
    checked="AmpGradScalerKernels.cpp _amp_update_scale_cpu_kernel: successful = "
            "growth_tracker + 1; grow if successful == growth_interval; "
            "ShardedGradScaler._amp_update_scale_cpu_ tests `successful == "
            "self._growth_interval` too. By hand, interval 5, 'FFF' -> tracker 3; interval "
            "set to 2; 'F' -> successful 4 != 2, tracker 4, scale 1024 (spec: 4 >= 2, grows "
            "to 2048). A loaded tracker 7 with interval 5: 'F' -> 8, no growth.")

_UNROUNDED_INIT = Difference(
    sentence="Before its first scale() call a torch scaler has no scale tensor: get_scale() "
             "and state_dict() report init_scale as the Python float given (16777217.0), "
             "not the float32 it will run with (16777216.0).",
    matters="No: the first scale() creates the float32 tensor. Only a checkpoint written "
            "before the first step holds a scale that is no float32 value, and loading it "
            "gives the same float32 scale.",
    checked="GradScaler.get_scale returns self._init_scale while self._scale is None; "
            "_lazy_init_scale_growth_tracker makes torch.full((), self._init_scale, "
            "dtype=torch.float32). By hand: 16777217 = 2**24 + 1 needs 25 significant bits; "
            "its float32 is 16777216. The suite reads 16777217.0 after no step and "
            "16777216.0 after save and load.")

_DISABLED_STATE = Difference(
    sentence="A disabled torch scaler keeps no state: state_dict() is {}, load_state_dict() "
             "does nothing and get_scale() is 1.0, so there is no canonical dict to save and "
             "its scale reads 1.0 rather than the config's init_scale.",
    matters="For checkpoints only: a run with enabled=False writes {}, which an enabled "
            "scaler refuses to load (RuntimeError on an empty dict); its steps pass through "
            "as the spec says.",
    checked="GradScaler.state_dict: `if self._enabled: return {...}`, else `return {}`; "
            "load_state_dict returns at once when disabled; get_scale returns 1.0 when "
            "disabled; step calls optimizer.step() directly (the suite saw every disabled "
            "step change the parameters). test_disabled_scaler_is_a_pass_through expects "
            "(1024.0, 0, 0) after 'I' and reads 1.0; "
            "test_loading_keeps_enabled_as_the_scaler_was_built builds a disabled scaler, "
            "loads a canonical dict (a no-op) and saving meets {}.")

_SHARDED_GROWTH = Difference(
    sentence="On CPU ShardedGradScaler grows with its own `self._scale *= "
             "self._growth_factor`, with no check that the product is finite: from 2**127 the "
             "scale becomes inf and stays there (inf * backoff_factor = inf), where "
             "torch.amp.GradScaler's kernel keeps the old scale.",
    matters="Only if the scale reaches 2**127 (~1.7e38) and grows, on CPU: every later "
            "scaled loss is inf, so every step is skipped for good. Rare with fp16, whose "
            "gradients overflow long before.",
    checked="torch/distributed/fsdp/sharded_grad_scaler.py "
            "ShardedGradScaler._amp_update_scale_cpu_ (used by update() when the scale is on "
            "CPU): `if successful == self._growth_interval: self._scale *= "
            "self._growth_factor`, no isfinite test (the CUDA path calls "
            "torch._amp_update_scale_, whose kernel has one). By hand, init 2**127, interval "
            "1, 'F': 2**128 is inf in float32 (spec keeps 2**127); 'FFFF' reads inf, inf, "
            "inf, inf.")

def _sharded_rank(rank: int, world: int, port: int, config: dict[str, Any], kinds: list[str],
                  dev: str) -> list[Any]:
    from unifiedamp.conformance.adapters.torch import init_gloo_rank

    init_gloo_rank(rank, world, port)
    adapter = ShardedGradScaler()
    adapter.device = dev
    return rank_state(adapter, config, kinds, rank)


def spawn_rank_states(main: Callable[..., list[Any]], world: int,
                      *args: Any) -> list[ScalerState]:
    """Runs ``main(rank, world, port, *args)`` on ``world`` gloo ranks, which meet on a
    free local port, and returns the state each returned with :func:`rank_state`."""
    from unifiedamp.conformance.adapters.torch_ranks import spawn_ranks

    return [ScalerState(*state) for state in spawn_ranks(main, world, *args)]


def rank_state(adapter: Any, config: dict[str, Any], kinds: list[str], rank: int) -> list[Any]:
    """One rank's iteration: its state after it, once the rank has ended the process group
    (see :func:`unifiedamp.conformance.adapters.torch.destroy_process_group`, which checks
    that the group is gone; the rank joins it with ``init_gloo_rank``)."""
    from unifiedamp.conformance.adapters.torch import run_then_leave

    # The handle (the scaler, which may hold the group, and its model) lives in the lambda.
    return run_then_leave(lambda: list(adapter.read(adapter.iterate(
        adapter.new(ScalerConfig(**config)), kinds[rank]))))


#: Test id -> how torch's scalers differ there, checked by hand. Where the two adapters
#: of this module fail a test for different reasons, the entry names which does what.
DIFFERENCES: dict[str, Difference] = {
    **{f"{test}[{vector}]": difference
       for test in ("test_vector", "test_vector_compiled")
       for vector, difference in (
           ("factors_rounded_to_float32_before_multiplying", _FLOAT64_FACTOR),
           ("reciprocal_overflow_skips_finite_steps", _RECIPROCAL),
           ("backoff_reaches_zero_and_stays", _RECIPROCAL),
           ("lowered_interval_grows_next_finite", _EQUAL_INTERVAL),
           ("growth_overflow_keeps_scale", _SHARDED_GROWTH))},
    "test_random_configs_and_steps_match_reference": _FLOAT64_FACTOR._replace(
        sentence=_FLOAT64_FACTOR.sentence + " (ShardedGradScaler fails it only where a "
                 "random run grows past 2**127: see growth_overflow_keeps_scale.)"),
    "test_every_reachable_state_reloads": _UNROUNDED_INIT,
    "test_a_loaded_tracker_past_the_interval_grows_on_the_next_finite_step": _EQUAL_INTERVAL,
    "test_loading_keeps_enabled_as_the_scaler_was_built": _DISABLED_STATE,
    "test_disabled_scaler_is_a_pass_through": _DISABLED_STATE,
}
