"""The zoo's adapter of Paddle's native ``paddle.amp.GradScaler``, driven by the loop of its
docstring: ``scaler.scale(loss).backward()`` under ``paddle.amp.auto_cast(dtype="float16")``,
``scaler.step(optimizer)`` for each optimizer, then ``scaler.update()``.

On a CPU place Paddle's scaler does not scale at all. ``AmpScaler.__init__``
(python/paddle/amp/grad_scaler.py, paddle 3.3.1) warns "AmpScaler can only be enabled on
CUDAPlace, XPUPlace and CustomPlace ... so it makes no effect" and sets ``enable=False``:
``scale()`` returns the loss as it is, ``step()`` is ``optimizer.step()`` (an inf
gradient is applied), ``update()`` does nothing, ``state_dict()`` is ``{}`` and
``get_init_loss_scaling()`` is 1.0. So on CPU the adapter runs the one thing that runs
there, a disabled scaler, and every enabled config is skipped with :data:`CPU_SKIP`.
Set ``UNIFIEDAMP_DEVICE=gpu:0`` with a GPU build of Paddle for the dynamic rule (not run
by this project's checks, which have no GPU build).

Read in the source for the GPU path, not run: ``GradScaler._update`` is
``AmpScaler._update``, plain Python in dygraph mode: it backs off when ``decr_count ==
decr_every_n_nan_or_inf`` (consecutive non-finite updates, reset by a finite one: the
spec's hysteresis) and grows when ``incr_count == incr_every_n_steps`` (equality: a
loaded counter past the interval never fires), with no floor and no inf guard on growth;
``update()`` sees only the last ``step()``'s flag (each ``step`` overwrites
``_cache_found_inf``). Its backoff branch first prints ``float(self._scale)`` of a
shape-[1] tensor, which raises ``TypeError`` under NumPy 2.x (seen here with NumPy 2.4 on
CPU: ``float(paddle.to_tensor(np.array([2.0], np.float32)))``).

Example:
    >>> PaddleGradScaler.name
    'paddle'
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from unifiedamp._tree import tree_map
from unifiedamp.conformance.interface import STEP_KINDS, Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import (
    ScalerConfig,
    ScalerState,
    parse_state_dict,
    read_form,
    to_state_dict,
    write_form,
)

__all__ = ["CPU_SKIP", "DIFFERENCES", "PaddleGradScaler"]

#: Why every enabled config is skipped on a CPU place.
CPU_SKIP = (
    "paddle's GradScaler disables itself on a CPU place (AmpScaler.__init__: only CUDAPlace, "
    "XPUPlace and CustomPlace): scaling the loss, skipping non-finite steps, backoff and "
    "growth run only on GPU (UNIFIEDAMP_DEVICE=gpu:0 with a GPU build of paddle)")


class _Problem:
    """A ``paddle.nn.Linear(4, 1)`` and an Adam optimizer."""

    def __init__(self) -> None:
        import paddle

        self.model = paddle.nn.Linear(4, 1)
        for param in self.model.parameters():
            param.set_value(paddle.full(param.shape, 0.1, dtype=param.dtype))
        self.optimizer = paddle.optimizer.Adam(learning_rate=1e-3,
                                               parameters=self.model.parameters())

    def backward(self, kind: str, scaler: Any) -> None:
        import paddle

        self.optimizer.clear_grad(set_to_zero=False)
        x = np.full((2, 4), 0.5, np.float32)
        x[0, 1] = STEP_KINDS[kind]
        with warnings.catch_warnings():
            # On a CPU place auto_cast warns at every step that it does nothing; the
            # scaler's skip reason says it once instead.
            warnings.filterwarnings("ignore", "amp_guard can only be enabled")
            with paddle.amp.auto_cast(dtype="float16"):
                # |loss| < 1 and d(loss)/d(weight) do not depend on the weights: a finite
                # step stays finite at every float32 scale. scale() inside auto_cast:
                # outside float16 autocast paddle's scale() disables the scaler.
                loss = self.model(paddle.to_tensor(x)).sum() * 2.0**-4
                scaled = scaler.scale(loss)
        scaled.backward()

    def snapshot(self) -> list[np.ndarray]:
        import paddle

        out = [p.numpy().copy() for p in self.model.parameters()]
        state = self.optimizer.state_dict()
        out += [state[k].numpy().copy() for k in sorted(state)
                if isinstance(state[k], paddle.Tensor)]
        return out


class PaddleGradScaler(Adapter):
    """``paddle.amp.GradScaler`` with ``paddle.nn.Linear`` + Adam per optimizer.

    Handles are ``(scaler, [problem, ...], config)``. The device is
    ``UNIFIEDAMP_DEVICE`` (default ``cpu``); on CPU see the module docstring.
    """

    name = "paddle"

    def __init__(self) -> None:
        import paddle

        self.device = os.environ.get("UNIFIEDAMP_DEVICE", "cpu")
        paddle.set_device(self.device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            #: Whether a scaler built here scales (False on a CPU place).
            self.scales = paddle.amp.GradScaler().is_enable()
        self.fixed = {"min_scale": None, "max_scale": None}
        self.capabilities = frozenset({"multi_optimizer", "scale_tree", "state_dict", "disable"})

    def expresses(self, config: ScalerConfig) -> str | None:
        if not self.scales and config.enabled:
            return CPU_SKIP
        reason = super().expresses(config)
        if reason is None and config.enabled:
            # AmpScaler.__init__ asserts incr_ratio > 1.0 and decr_ratio < 1.0.
            if config.growth_factor <= 1.0:
                reason = f"paddle refuses incr_ratio={config.growth_factor!r} (needs > 1.0)"
            elif config.backoff_factor >= 1.0:
                reason = f"paddle refuses decr_ratio={config.backoff_factor!r} (needs < 1.0)"
        return reason

    def info(self) -> dict[str, Any]:
        import paddle

        return {"framework": "paddle", "version": paddle.__version__,
                "device": self.device if self.scales else f"{self.device} (scaler disabled)"}

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"paddle.amp.GradScaler cannot run {config.to_dict()} on "
                             f"{self.device}: {reason}")
        import paddle

        with warnings.catch_warnings():
            # The CPU warning is the documented behaviour this adapter reports.
            warnings.simplefilter("ignore")
            scaler = paddle.amp.GradScaler(
                enable=config.enabled, init_loss_scaling=config.init_scale,
                incr_ratio=config.growth_factor, decr_ratio=config.backoff_factor,
                incr_every_n_steps=config.growth_interval,
                decr_every_n_nan_or_inf=config.hysteresis,
                use_dynamic_loss_scaling=config.dynamic)
        return scaler, [_Problem() for _ in range(optimizers)], config

    def iterate(self, handle: Any, kinds: str) -> Any:
        scaler, problems, _ = handle
        if len(kinds) != len(problems):
            raise ValueError(f"{len(kinds)} kinds for {len(problems)} optimizers")
        for kind, problem in zip(kinds, problems, strict=True):
            problem.backward(kind, scaler)
            scaler.step(problem.optimizer)
        scaler.update()
        return handle

    def read(self, handle: Any) -> ScalerState:
        scaler = handle[0]
        native = scaler.state_dict()
        if not native:  # disabled: paddle keeps no scale, and reports 1.0
            return ScalerState(float(scaler.get_init_loss_scaling()), 0, 0)
        _, state, _ = read_form(native, handle[2])
        return state

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        return [a for problem in handle[1] for a in problem.snapshot()]

    def save(self, handle: Any) -> dict[str, Any]:
        scaler, _, config = handle
        native = scaler.state_dict()
        if not native:  # disabled: state_dict() is {}; all it keeps is its scale of 1.0
            return to_state_dict(ScalerConfig(float(scaler.get_init_loss_scaling()),
                                              enabled=False), self.read(handle), "paddle")
        config, state, _ = read_form(native, config)
        return to_state_dict(config, state, "paddle")

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        config, state = parse_state_dict(state_dict)
        scaler, problems, built = handle
        config = config.replace(enabled=built.enabled)  # the native dict carries no enabled
        # A disabled scaler's load_state_dict returns before reading its argument, and no
        # native dict holds a disabled scaler: it gets an empty one.
        scaler.load_state_dict(write_form(config, state, "paddle") if config.enabled else {})
        return scaler, problems, config

    def scale_tree(self, handle: Any, tree: Any) -> Any:
        import paddle

        def scale(leaf: np.ndarray) -> np.ndarray:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "amp_guard can only be enabled")
                with paddle.amp.auto_cast(dtype="float16"):
                    return handle[0].scale(paddle.to_tensor(leaf.copy())).numpy()

        return tree_map(scale, tree)


_SOURCE = "python/paddle/amp/grad_scaler.py (paddle 3.3.1)"

DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="a disabled scaler reports a scale of 1.0",
        sentence="A disabled GradScaler keeps no scale: get_init_loss_scaling() reports 1.0 "
                 "instead of init_loss_scaling and state_dict() is {} (its steps pass through: "
                 "scale() returns the loss, step() is optimizer.step()). On Paddle's CPU build "
                 "every GradScaler is disabled this way, enable=True or not: AmpScaler.__init__ "
                 "disables itself unless the place is a CUDAPlace, XPUPlace or CustomPlace. "
                 "That is true of the CPU build (a CPU place) only: on a GPU or XPU place a "
                 "GradScaler built enabled scales.",
        matters="On CPU a script gets no loss scaling at all (float16 auto_cast does nothing "
                "there either) and a checkpoint of the scaler is {}. Paddle's scaler works on a "
                "GPU or XPU place under auto_cast(dtype='float16'): it scales the loss, skips "
                "non-finite steps, backs off after decr_every_n_nan_or_inf consecutive ones and "
                "grows every incr_every_n_steps finite steps; this column could not compare "
                "that rule (read in the source, not run: no GPU build here). Under NumPy 2.4 "
                "its first backoff may raise TypeError: AmpScaler._update prints "
                "float(self._scale), and Tensor.__float__ is float(np.array(t)) of a shape-[1] "
                "array.",
        checked=f"{_SOURCE}, AmpScaler.__init__: `if enable and not (place.is_gpu_place() or "
                "place.is_xpu_place() or place.is_custom_place())`: warns and sets enable = "
                "False; self._init_loss_scaling = 1.0, set to init_loss_scaling only `if "
                "self._enable`; state_dict() returns {} unless enabled; GradScaler.step returns "
                "optimizer.step() and update() returns when disabled. "
                "test_disabled_scaler_is_a_pass_through (enable=False, init_loss_scaling=1024, "
                "'I'): the weights took the inf (NaN after Adam), get_init_loss_scaling() is "
                "1.0, the spec's state is (1024.0, 0, 0). "
                "float(paddle.to_tensor(np.array([2.0], np.float32))) raises TypeError with "
                "NumPy 2.4.",
        snippet="docs/snippets/zoo/paddle/a_disabled_scaler_reports_a_scale_of_1.py"),
)
