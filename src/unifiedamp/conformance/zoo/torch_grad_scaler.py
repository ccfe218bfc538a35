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


_AMP = "torch/amp/grad_scaler.py (torch 2.13.0)"
_SHARDED = "torch/distributed/fsdp/sharded_grad_scaler.py (torch 2.13.0)"
_SNIPPETS = "docs/snippets/zoo/torch"

#: Each cause of the two scalers' departures from the spec, checked by hand; an entry that
#: only one of them shows names its column.
DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="multiplies by a float64 factor",
        sentence="On CPU, torch.amp.GradScaler's update kernel multiplies the float32 scale by "
                 "the factor held as a float64 (the Python float given) and rounds the product "
                 "to float32 once, at every update, so a factor that is no float32 value (1.1, "
                 "0.7) can give a scale one float32 step from the spec's "
                 "f32(scale * f32(factor)). ShardedGradScaler on CPU multiplies by a Python "
                 "scalar that torch rounds to float32 first, and matches the spec.",
        matters="Not for training: one unit in the last place, and only with factors that are "
                "not float32 values (2 and 0.5 are exact). It matters where scales are compared "
                "bit for bit across frameworks (replays, checkpoint diffs).",
        checked=f"{_AMP}, GradScaler.update passes the Python floats _growth_factor and "
                "_backoff_factor to torch._amp_update_scale_, which takes them as C++ "
                "doubles. factors_rounded_to_float32_before_multiplying (77, growth 1.1, "
                "interval 1, FI): 77 * 1.1 = 84.700000000000003 in float64 rounds to "
                "84.69999694824219 (0x42a96666); the spec's 77 * f32(1.1) = 84.7000018358... "
                "rounds to 84.70000457763672 (0x42a96667). Not the first update only: the random "
                "test's init 1.0, growth 2.7828966194494416, FF diverges on the second growth "
                "(7.744513511657715, the spec 7.744513034820557). torch._amp_update_scale_ on "
                "CPU gives the same products.",
        snippet=f"{_SNIPPETS}/multiplies_by_a_float64_factor.py",
        columns=("torch",)),
    Difference(
        cause="takes a finite step whose 1/scale overflows",
        sentence="Torch's scalers check the scaled gradients for inf/NaN before unscaling them, "
                 "so where 1/scale overflows float32 (a scale of 2**-128, about 2.9e-39, or less) "
                 "the finite gradients pass the check, are multiplied by inv_scale = inf and the "
                 "optimizer steps with inf or NaN gradients, and the update counts the step as "
                 "finite (the scale grows; 0 stays 0), where the spec skips the step and backs "
                 "off.",
        matters="Only after the scale has collapsed to 2**-128 (~2.9e-39) or below, 144 "
                "consecutive backoffs by 0.5 from 65536 (a run whose every step overflows): "
                "torch then writes inf or NaN into the parameters instead of skipping.",
        checked=f"{_AMP}, GradScaler.unscale_ (and ShardedGradScaler.unscale_) computes "
                "inv_scale = self._scale.double().reciprocal().float(), inf for 2**-130, and "
                "torch._amp_foreach_non_finite_check_and_unscale_ sets found_inf from the "
                "incoming values, then multiplies. reciprocal_overflow_skips_finite_steps "
                "(2**-130, interval 1, FFF): the scaled gradients are finite, found_inf stays 0, "
                "SGD or Adam gets inf gradients and the scale grows to 2**-129 (the spec skips "
                "and backs off to 2**-131). backoff_reaches_zero_and_stays (2**-148, IIFF): "
                "2**-149, then 0; at scale 0 the scaled gradients are 0, 0 * inf = NaN, and the "
                "finite step writes NaN into the parameters.",
        snippet=f"{_SNIPPETS}/takes_a_finite_step_whose_reciprocal_overflows.py"),
    Difference(
        cause="grows only when the tracker equals the interval",
        sentence="Torch's scalers grow only when growth_tracker + 1 == growth_interval, so a "
                 "tracker already at or past a lowered interval (set_growth_interval mid-run, or "
                 "a state loaded with a smaller interval) never equals it again and the scale "
                 "stops growing until the next overflow resets the tracker.",
        matters="Yes, whenever growth_interval is lowered below the current tracker (a schedule, "
                "or a run resumed with a new interval): the scale does not grow again until an "
                "overflow, so gradients that underflow at the current scale stay underflowed.",
        checked=f"torch._amp_update_scale_'s CPU kernel: successful = growth_tracker + 1; grow "
                f"if successful == growth_interval; {_SHARDED}, "
                "ShardedGradScaler._amp_update_scale_cpu_ tests `successful == "
                "self._growth_interval` too. lowered_interval_grows_next_finite (1024, interval "
                "5 lowered to 2 before step 4, FFFFF): tracker 3 at the change, then 4, 5: no "
                "growth (the spec grows to 2048 on step 4). A loaded tracker 7 with interval 5: "
                "'F' gives 8 and 1024 (the spec: 2048).",
        snippet=f"{_SNIPPETS}/grows_only_when_the_tracker_equals_the_interval.py"),
    Difference(
        cause="reports a scale that is no float32 value",
        sentence="Before its first scale() call a torch scaler has no scale tensor: get_scale() "
                 "and state_dict() report init_scale as the Python float given (16777217.0), "
                 "not the float32 it will run with (16777216.0).",
        matters="No: the first scale() creates the float32 tensor. Only a checkpoint written "
                "before the first step holds a scale that is no float32 value, and loading it "
                "gives the same float32 scale.",
        checked=f"{_AMP}: GradScaler.get_scale returns self._init_scale while self._scale is "
                "None, state_dict saves get_scale(), and _lazy_init_scale_growth_tracker makes "
                "torch.full((), self._init_scale, dtype=torch.float32); ShardedGradScaler "
                "inherits them. 16777217 = 2**24 + 1 needs 25 significant bits; its float32 is "
                "16777216. test_every_reachable_state_reloads reads 16777217.0 after no step "
                "and 16777216.0 after save and load.",
        snippet=f"{_SNIPPETS}/reports_a_scale_that_is_no_float32_value.py"),
    Difference(
        cause="a disabled scaler saves no state",
        sentence="A disabled torch scaler's state_dict() is {} and its load_state_dict() does "
                 "nothing: a checkpoint of it holds neither its scale nor enabled=False, so "
                 "there is no canonical dict to save.",
        matters="For checkpoints only: a run with enabled=False writes {}, which a scaler built "
                "enabled refuses to load (RuntimeError: the source state dict is empty); its "
                "steps pass through as the spec says.",
        checked=f"{_AMP}: GradScaler.state_dict is `if self._enabled: return {{...}}` else "
                "`return {}`; load_state_dict returns at once when disabled and raises "
                "RuntimeError on {} when enabled; ShardedGradScaler inherits both. "
                "test_loading_keeps_enabled_as_the_scaler_was_built builds a disabled scaler, "
                "loads a canonical dict (a no-op) and saving meets {}.",
        snippet=f"{_SNIPPETS}/a_disabled_scaler_saves_no_state.py"),
    Difference(
        cause="a disabled scaler reports a scale of 1.0",
        sentence="A disabled torch scaler keeps no scale: get_scale() is 1.0 rather than the "
                 "init_scale it was built with; its steps pass through (scale() returns the "
                 "loss, step() is optimizer.step(), update() returns).",
        matters="No for training (a disabled scaler scales nothing); a script that logs the "
                "scale of a disabled scaler sees 1.0.",
        checked=f"{_AMP}: GradScaler.__init__ stores init_scale only `if self._enabled`; "
                "get_scale returns 1.0 when disabled; step calls optimizer.step() directly (the "
                "suite saw every disabled step change the parameters); ShardedGradScaler "
                "inherits get_scale. test_disabled_scaler_is_a_pass_through builds "
                "init_scale=1024, enabled=False, expects (1024.0, 0, 0) after 'I' and reads 1.0.",
        snippet=f"{_SNIPPETS}/a_disabled_scaler_reports_a_scale_of_1.py"),
    Difference(
        cause="growth overflows to inf",
        sentence="On CPU ShardedGradScaler grows with its own `self._scale *= "
                 "self._growth_factor`, with no check that the product is finite: from 2**127 "
                 "the scale becomes inf and stays there (every later scaled loss is inf, so every "
                 "step is skipped, and inf * backoff_factor = inf), where torch.amp.GradScaler's "
                 "kernel keeps the old scale, as the spec does.",
        matters="Only if the scale reaches 2**127 (~1.7e38) and grows, on CPU: from then on "
                "every step is skipped for good. Rare with fp16, whose gradients overflow long "
                "before.",
        checked=f"{_SHARDED}, ShardedGradScaler._amp_update_scale_cpu_ (what update() runs when "
                "the scale is on CPU): `if successful == self._growth_interval: self._scale *= "
                "self._growth_factor`, no isfinite test; on other devices update() calls "
                "torch._amp_update_scale_. growth_overflow_keeps_scale (2**127, interval 1, "
                "FFIF): 2**128 is inf in float32 (the spec keeps 2**127), then inf, inf, inf, "
                "every step after the first skipped.",
        snippet="docs/snippets/zoo/torch-sharded/growth_overflows_to_inf.py",
        columns=("torch-sharded",)),
)
