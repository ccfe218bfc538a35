"""The zoo's adapter of MindSpore's ``mindspore.amp.DynamicLossScaler``, driven by the loop
its documentation gives.

Each iteration takes ``mindspore.value_and_grad`` of ``loss_scaler.scale(loss)`` over the
parameters (PyNative mode, MindSpore's default), then ``grads = loss_scaler.unscale(grads)``,
``finite = amp.all_finite(grads)``, an ``nn.Adam`` step only ``if finite`` and
``loss_scaler.adjust(finite)``, as the class's docstring and API page do.

MindSpore's scaler takes ``scale_value`` (at least 1: it raises below), an integer
``scale_factor`` and ``scale_window``. It grows by ``scale_factor`` and backs off by
dividing by it, so the adapter runs ``backoff_factor = 1 / growth_factor`` only, and only
for integer powers of two, where dividing gives the bits of the spec's multiply by the
float32 reciprocal. Its state is two ``Parameter``s, ``scale_value`` and ``counter`` (the
growth tracker); ``load`` sets them with ``Parameter.set_data``, as
``mindspore.load_param_into_net`` restores a checkpoint.

Example:
    >>> from unifiedamp.spec import ScalerConfig
    >>> mindspore = MindSporeDynamicLossScaler()
    >>> mindspore.expresses(ScalerConfig(growth_factor=4.0, backoff_factor=0.25)) is None
    True
    >>> print(mindspore.expresses(ScalerConfig(0.5)))
    MindSpore's DynamicLossScaler raises ValueError for scale_value=0.5: it must be >= 1
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from unifiedamp.conformance.interface import STEP_KINDS, Adapter
from unifiedamp.conformance.zoo import Difference
from unifiedamp.spec import ScalerConfig, ScalerState, parse_state_dict, to_state_dict

__all__ = ["DIFFERENCES", "MindSporeDynamicLossScaler"]


#: Every function given to ``mindspore.value_and_grad``, kept alive: MindSpore's PyNative mode
#: caches a gradient graph by the function's id, so a freed closure whose address a new one
#: takes would run with the first one's captures (another scaler's, another step's kinds).
#: A zoo column runs in a process of its own.
_DIFFERENTIATED: list[Any] = []


class _Group(NamedTuple):
    """One optimizer and the parameters it trains."""

    params: list[Any]
    optimizer: Any


def _group(index: int) -> _Group:
    from mindspore import Parameter, Tensor, nn

    params = [Parameter(Tensor(np.full(4, 0.1, np.float32)), name=f"w{index}"),
              Parameter(Tensor(np.float32(0.1)), name=f"b{index}")]
    return _Group(params, nn.Adam(params, learning_rate=1e-3))


def _loss(group: _Group, kind: str) -> Any:
    from mindspore import Tensor, ops

    x = np.full((2, 4), 0.5, np.float32)
    x[0, 1] = STEP_KINDS[kind]
    w, b = group.params
    # |loss| < 1 and d(loss)/d(params) do not depend on the parameters: a finite step
    # stays finite at every float32 scale.
    return (ops.matmul(Tensor(x), w) + b).sum() * 2.0**-4


class MindSporeDynamicLossScaler(Adapter):
    """``mindspore.amp.DynamicLossScaler`` with ``nn.Adam``, in PyNative mode.

    Handles are ``(loss_scaler, [group, ...], config)``. MindSpore's class has no
    hysteresis, floor or ceiling argument (it never backs off below 1), no static or
    disabled mode and no setters: those tests and configs are skipped.
    """

    name = "mindspore"
    capabilities = frozenset({"multi_optimizer", "state_dict"})
    fixed = {"backoff_factor": lambda c: 1.0 / c.growth_factor, "hysteresis": 1,
             "min_scale": None, "max_scale": None, "dynamic": True, "enabled": True}

    def expresses(self, config: ScalerConfig) -> str | None:
        reason = super().expresses(config)
        if reason is None and config.init_scale < 1.0:
            reason = (f"MindSpore's DynamicLossScaler raises ValueError for "
                      f"scale_value={config.init_scale!r}: it must be >= 1")
        if reason is None and not (math.frexp(config.growth_factor)[0] == 0.5
                                   and config.growth_factor < 2.0**31):
            reason = (f"MindSpore's scale_factor is an int and divides on a backoff: "
                      f"growth_factor={config.growth_factor!r} is no integer power of two")
        return reason

    def info(self) -> dict[str, Any]:
        import mindspore

        return {"framework": "mindspore", "version": mindspore.__version__,
                "device": mindspore.get_context("device_target")}

    def _scaler(self, config: ScalerConfig) -> Any:
        reason = self.expresses(config)
        if reason is not None:
            raise ValueError(f"MindSpore's DynamicLossScaler cannot run {config.to_dict()}: "
                             f"{reason}")
        from mindspore import amp

        return amp.DynamicLossScaler(scale_value=config.init_scale,
                                     scale_factor=int(config.growth_factor),
                                     scale_window=config.growth_interval)

    def new(self, config: ScalerConfig, optimizers: int = 1) -> Any:
        return self._scaler(config), [_group(i) for i in range(optimizers)], config

    def iterate(self, handle: Any, kinds: str) -> Any:
        import mindspore
        from mindspore import amp

        loss_scaler, groups, _ = handle
        if len(kinds) != len(groups):
            raise ValueError(f"{len(kinds)} kinds for {len(groups)} optimizers")

        # Several optimizers share the one scaler: one loss, one finiteness check.
        def forward() -> Any:
            return loss_scaler.scale(sum(_loss(g, k) for g, k in zip(groups, kinds, strict=True)))

        weights = [p for g in groups for p in g.params]
        # Unannotated in mindspore, where pyright infers grad_position an int (None is
        # documented) and a result that is not a pair.
        value_and_grad: Any = mindspore.value_and_grad
        _DIFFERENTIATED.append(forward)
        _, grads = value_and_grad(forward, None, weights)()
        grads = loss_scaler.unscale(grads)
        finite = amp.all_finite(grads)
        if finite:
            for i, group in enumerate(groups):
                group.optimizer(tuple(grads[2 * i:2 * i + 2]))
        loss_scaler.adjust(finite)
        return handle

    def read(self, handle: Any) -> ScalerState:
        loss_scaler = handle[0]
        return ScalerState(float(loss_scaler.scale_value.asnumpy()),
                           int(loss_scaler.counter.asnumpy()), 0)

    def snapshot(self, handle: Any) -> list[np.ndarray]:
        # Each optimizer's Parameters: the ones it trains, its moments, powers and step.
        return [p.asnumpy().copy() for g in handle[1] for p in g.optimizer.get_parameters()]

    def save(self, handle: Any) -> dict[str, Any]:
        loss_scaler, _, config = handle
        config = config.replace(growth_factor=float(loss_scaler.scale_factor),
                                backoff_factor=1.0 / loss_scaler.scale_factor,
                                growth_interval=loss_scaler.scale_window)
        return to_state_dict(config, self.read(handle), "mindspore")

    def load(self, handle: Any, state_dict: dict[str, Any]) -> Any:
        from mindspore import Tensor

        config, state = parse_state_dict(state_dict)
        if state.hysteresis_tracker:
            raise ValueError("MindSpore's DynamicLossScaler has no hysteresis tracker: cannot "
                             f"load hysteresis_tracker={state.hysteresis_tracker}")
        loss_scaler = self._scaler(config)
        loss_scaler.scale_value.set_data(Tensor(np.float32(state.scale)))
        loss_scaler.counter.set_data(Tensor(np.int32(state.growth_tracker)))
        return loss_scaler, handle[1], config


_SOURCE = "mindspore/amp.py (mindspore 2.10.0), DynamicLossScaler.adjust"
_SNIPPETS = "docs/snippets/zoo/mindspore"

DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        cause="floor of 1",
        sentence="A backoff never goes below 1: adjust takes ops.maximum(one, scale_value / "
                 "scale_factor), and the constructor raises for a scale_value below 1.",
        matters="Only for a model whose float16 gradients overflow even unscaled: at a scale "
                "of 1 every step then overflows and is skipped, where the spec's scale goes "
                "below 1 and training goes on. Growth, backoffs above 1, growth overflow and "
                "NaN handling match the spec.",
        checked=f"{_SOURCE}, line 413: ops.maximum(one, self.scale_value / self.scale_factor); "
                "DynamicLossScaler.__init__, line 364: ValueError for scale_value < 1.0. "
                "backoff_below_one (2, IIIF): max(1, 2 / 2) = 1, then max(1, 1 / 2) = 1 where "
                "the spec gives 0.5, then 1 (spec 0.25), 1 (spec 0.25).",
        snippet=f"{_SNIPPETS}/floor_of_1.py"),
    Difference(
        cause="counts modulo the interval",
        sentence="It grows when counter == scale_window - 1 and sets counter = ((counter + 1) "
                 "% scale_window) * grads_finite, so a counter at or past scale_window wraps "
                 "around and grows up to scale_window steps late.",
        matters="Rarely: only a counter restored from a run with a longer scale_window (or "
                "scale_window lowered by assigning the attribute) wraps; one growth comes at "
                "most scale_window steps late.",
        checked=f"{_SOURCE}, lines 408 and 416: self.counter == (self.scale_window - 1) and "
                "counter = ((self.counter + 1) % self.scale_window) * grads_finite. A loaded "
                "counter 7 with scale_window 5: 7 != 4, no growth, counter (7 + 1) % 5 = 3 "
                "(seen: 1024.0, counter 3); then 4; the third finite step grows to 2048.",
        snippet=f"{_SNIPPETS}/counts_modulo_the_interval.py"),
)
