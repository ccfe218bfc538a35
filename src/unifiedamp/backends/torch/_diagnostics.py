"""The torch scaler's diagnostics (``docs/diagnostics.md``): ``watch``, ``overflow_report``
and ``history``, as a mixin of the scaler, and the gradient counts they are made of.

``overflow_report()`` names the gradients that held inf/NaN at a skipped step and is computed
only after a skip; ``history=N`` keeps the last N (iteration, scale, skipped) records in a
ring on the scale's device, one small op per update; ``diagnose=True`` computes the report
inside a skipped ``update()`` (plain optimizers: free on other steps; fused ones: one read of
found_inf per update).
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch

from unifiedamp import spec
from unifiedamp.backends._imperative import WatchedNames, scale_before_skip
from unifiedamp.backends.torch._compat import inf_norms
from unifiedamp.diagnostics import GradientOverflow, OverflowReport, ScaleHistory
from unifiedamp.spec import ScalerConfig

__all__ = ["DIAGNOSTICS_ATTRIBUTES", "TorchDiagnostics", "count_overflows", "scale_before_skip"]


def count_overflows(named_grads: list[tuple[str, torch.Tensor]]) -> list[GradientOverflow]:
    """The :class:`GradientOverflow` of each gradient that holds inf or NaN, in order.

    One pass over every gradient finds the candidates, a reduction that is inf or NaN
    whenever an element is: on CUDA the infinity norm (one multi-tensor kernel), on
    other devices the sum (faster there than torch's infinity norm, ``docs/diagnostics.md``;
    a finite sum can overflow too, and such a gradient is dropped once counted). Only the
    candidates are then counted.

    Example:
        >>> g = torch.tensor([1.0, float("inf"), -3.0, float("nan")])
        >>> big = torch.full((2,), 3e38)  # its sum overflows; no element does
        >>> count_overflows([("w", g), ("b", torch.ones(2)), ("big", big)])
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
        reduced = inf_norms(tensors) if device.type == "cuda" else [g.sum() for g in tensors]
        finite = torch.stack([r.isfinite().all() for r in reduced]).tolist()
        candidates += [item for item, ok in zip(items, finite, strict=True) if not ok]
    overflows = []
    for index, grad in sorted(candidates, key=lambda item: item[0]):
        # count_nonzero, not a bool sum, which runs in int64 (slower on a CPU).
        magnitude = grad.abs()
        inf = torch.count_nonzero(magnitude == math.inf).double()
        nan = torch.count_nonzero(magnitude.isnan()).double()
        largest = magnitude.nan_to_num_(0.0, 0.0, 0.0).amax().double()  # in the copy
        inf, nan, largest = torch.stack([inf, nan, largest]).tolist()
        if inf or nan:
            name, stored = named_grads[index]
            overflows.append(GradientOverflow(name, stored.shape, int(inf), int(nan), largest))
    return overflows


#: What ``TorchDiagnostics._reset_diagnostics`` assigns: records and references, not state;
#: a pickled copy starts them afresh.
DIAGNOSTICS_ATTRIBUTES = frozenset({
    "_ring", "_ring_slots", "_ring_count", "_ring_base", "_ring_chained", "_scale_set",
    "_checking", "_scaled_input",
    "_diag_step", "_diag_found", "_diag_checked", "_diag_input", "_diag_functional",
    "_diag_config", "_diag_loads", "_diag_scale", "_loads", "_diag_report",
    "_diag_report_ready", "_last_skip_report", "_watched",
})


class TorchDiagnostics(WatchedNames):
    """``watch``, ``overflow_report`` and ``history`` of the torch scaler, and what they keep.

    ``watch()`` and the names it gives are the imperative backends' (:class:`WatchedNames`:
    parameters held weakly). The rest is torch's own: the flag of an update stays on the
    device until a report is asked for, the ring lives on the scale's device and is written
    by one op, and a skipped update's scale is inferred from the state it left. The scaler
    calls :meth:`_init_diagnostics` from its ``__init__``, :meth:`_make_ring`
    when it makes the scale, :meth:`_record` and :meth:`_diagnose_now` in ``update()``
    before the rule changes the scale, and :meth:`_remember_update` after it.
    """

    _parameter_type = torch.Tensor
    _parameter_kind = "parameter"
    _watch_weakly = True

    if TYPE_CHECKING:  # the scaler's own, which these methods read
        _enabled: bool
        _config: ScalerConfig
        _scale: torch.Tensor | None
        _hysteresis_tracker: torch.Tensor | None
        _updates: int
        _functional_found_inf: list[torch.Tensor]

    def _init_diagnostics(self, diagnose: bool, history: int) -> None:
        self._diagnose = diagnose
        self._history_size = int(history)
        self._reset_diagnostics()

    def _reset_diagnostics(self) -> None:
        """Empties what the diagnostics keep (a new scaler, or a pickled copy's): each of
        ``DIAGNOSTICS_ATTRIBUTES``."""
        # The history ring: [N, 2] float32 (scale after the update, skipped) on the
        # scale's device, made with the scale; a view per slot, so that a record is one op
        # (a stack into it). Record k (from 0) is update _ring_base + k + 1: every update
        # writes one. _ring_chained: the last record's predecessor holds the scale that
        # update started from (no load_state_dict or update(new_scale) between them);
        # _scale_set: one of those since the last record.
        self._ring: torch.Tensor | None = None
        self._ring_slots: tuple[torch.Tensor, ...] = ()
        self._ring_count = 0
        self._ring_base = 0
        self._ring_chained = False
        self._scale_set = False
        # Host references only (no device work): the optimizers checked since the last
        # update, id -> (weak reference, whether unscale_ ran on it), and the last
        # single-tensor input of scale().
        self._checking: dict[int, tuple[weakref.ref[Any], bool]] = {}
        self._scaled_input: torch.Tensor | None = None
        # The last update(), for overflow_report(): its number, its found_inf (a bool when
        # a plain step() read it, else the device flag; None: no update yet or a manual
        # update(new_scale)), what it checked, its scale() input, its functional checks,
        # the config it ran, and how many load_state_dict() calls had been made then.
        self._diag_step = 0
        self._diag_found: bool | torch.Tensor | None = None
        self._diag_checked: dict[int, tuple[weakref.ref[Any], bool]] = {}
        self._diag_input: torch.Tensor | None = None
        self._diag_functional = 0
        self._diag_config = self._config
        self._diag_loads = 0
        # The skipped update's scale, inferred before a load replaced the state it left.
        self._diag_scale: tuple[float, str] | None = None
        # load_state_dict() calls: one since the last update means the scale is not the
        # one that update left.
        self._loads = 0
        # The last update's report, once built (ready), and the last report of a skip.
        self._diag_report: OverflowReport | None = None
        self._diag_report_ready = False
        self._last_skip_report: OverflowReport | None = None
        # Parameter names from watch(): id -> (name, weak reference), matched by identity.
        self._watched = {}

    def _make_ring(self, dev: torch.device) -> None:
        """Makes the history ring on ``dev``, the scale's device (with the scale)."""
        if self._history_size:
            self._ring = torch.zeros((self._history_size, 2), dtype=torch.float32, device=dev)
            self._ring_slots = self._ring.unbind(0)
            self._ring_count = 0
            self._ring_base = self._updates

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
            >>> from unifiedamp.backends.torch import TorchGradScaler
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

        ``iteration`` counts updates from 1; ``scale`` is the scale that update left
        (:meth:`get_scale` after it: the next iteration's); ``skipped`` whether its step
        was skipped. A manual ``update(new_scale)`` is not recorded. The records
        live on the scale's device, written without a host sync; the host counts the
        updates. (Updates replayed from a CUDA graph are not kept faithfully: a replay
        rewrites the slot its capture wrote, and the host does not see it.) Reads the
        device once.

        Raises:
            ValueError: The scaler was built with ``history=0``.

        Example:
            >>> from unifiedamp.backends.torch import TorchGradScaler
            >>> model = torch.nn.Linear(2, 1)
            >>> opt = torch.optim.SGD(model.parameters(), lr=0.0)
            >>> scaler = TorchGradScaler(1024.0, growth_interval=1, device="cpu", history=2)
            >>> for x in (1.0, 1.0, float("inf")):  # the third overflows
            ...     scaler.scale(model(torch.full((1, 2), x)).sum()).backward()
            ...     scaler.step(opt); _ = scaler.update(); opt.zero_grad()
            >>> scaler.history().as_list()  # 1024 -> 2048 -> 4096, then backed off
            [(2, 4096.0, False), (3, 2048.0, True)]
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
        assert self._ring is not None  # update() records only into a ring
        slot = self._ring_count % self._history_size
        out = self._ring[slot] if torch.compiler.is_compiling() else self._ring_slots[slot]
        torch.stack((scale, found), out=out)
        self._ring_chained = self._ring_count > 0 and not self._scale_set
        self._scale_set = False
        self._ring_count += 1

    def _ring_holds_scale_before(self) -> bool:
        """Whether the ring holds the scale the last update started from: the scale its
        predecessor left, kept in the slot before."""
        return self._ring is not None and self._ring_chained and self._history_size > 1

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
        # The loss is kept for the report of a skip only: after a step known to be good
        # it is let go here, so that it (and what its graph holds) is freed where the
        # caller drops it, as without the scaler, not at the next update().
        self._diag_input = self._scaled_input if host_found is not False else None
        self._scaled_input = None
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
        if self._ring_holds_scale_before():
            assert self._ring is not None
            return float(self._ring[(self._ring_count - 2) % self._history_size, 0]), ""
        if self._diag_loads != self._loads:
            if self._diag_scale is not None:  # inferred before the first load since
                return self._diag_scale
            return math.nan, "The scale was loaded since the update, so its scale is unknown."
        # Reached after an update, which needs the scale (made with the trackers).
        assert self._scale is not None and self._hysteresis_tracker is not None
        scale, exact = scale_before_skip(self._diag_config, float(self._scale.item()),
                                         int(self._hysteresis_tracker.item()))
        return scale, "" if exact else (
            "The scale is inferred from the backed-off one and may be off by a rounding "
            "(or the min_scale clamp): diagnose=True (or history=N, from the second update) "
            "keeps the exact value.")

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
                    name = self._gradient_name(param, f"param_groups[{g}][{i}]", k, several)
                    named_grads.append((name, param.grad))
        overflows = count_overflows(named_grads)
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

    def _collapse_detail(self) -> str:
        """The collapse warning's last sentence: the last skipped update's report."""
        report = self.overflow_report() or self._last_skip_report
        if report is None:
            return ""
        return report.collapse_detail()
