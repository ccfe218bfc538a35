"""The torch Keras backend: ``apply`` runs torch's fused check-and-unscale kernel and the rule on
the host, and the overflow report is counted on the host, with the torch backend's own pieces
(``unifiedamp.backends.torch._compat.unscale_and_check_`` and
``unifiedamp.backends.torch._diagnostics.count_overflows``, imported when first used, so the
other Keras backends never import torch).

Keras's ``cond`` is a host ``if`` on torch anyway, and a few hundred eager scalar ops per step
(the bit-pattern path of the other backends) would cost more than the step's own update
(docs/backends/keras.md, Measured overhead). torch keeps float32 subnormals, so the kernel's
arithmetic is the spec's at every scale. The kernel unscales the gradients in place, as
``torch.amp.GradScaler`` does.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from unifiedamp import spec
from unifiedamp.backends._imperative import LastUpdate
from unifiedamp.diagnostics import GradientOverflow, OverflowReport
from unifiedamp.spec import ScalerState

from ._paths import BackendPaths

if TYPE_CHECKING:
    from ._optimizer import SpecLossScaleOptimizer


class TorchPaths(BackendPaths):
    """The paths of the torch Keras backend, for one wrapper, and what its reports need."""

    counts_on_device = False
    # Keras's torch optimizers update the tensors stateless_apply is given in place; its
    # cond is a host `if`, which runs only the outcome taken.
    selects_outcomes = False

    def __init__(self) -> None:
        #: Updates ``apply`` made: the step of a skipped update's report.
        self.updates = 0
        #: The last loss given to ``scale_loss``, detached (for the report's
        #: ``loss_finite``); None when it was not one tensor.
        self.last_loss: Any = None
        #: The last update, if it skipped. Its ``report``, once counted, names each gradient
        #: by its variable's index: :meth:`overflow_report` names them at each call.
        self.last_skip: LastUpdate | None = None
        #: Without ``diagnose``, the last skipped update's gradients, as (variable index,
        #: weak reference), until its report is counted.
        self.skipped_gradients: list[tuple[int, weakref.ref[Any]]] = []

    def apply(self, opt: SpecLossScaleOptimizer, grads: list[Any],
              trainable_variables: Any) -> None:
        """``apply(grads)``: the kernel checks and unscales, the rule runs on the host."""
        import torch

        from unifiedamp.backends.torch._compat import unscale_and_check_

        tvs = trainable_variables or opt._optimized_variables
        scale = opt.dynamic_scale.value
        todo = [g for g, v in zip(grads, tvs, strict=True)
                if g is not None and not opt._overwritten_by_gradient(v)]
        found = torch.zeros((), dtype=torch.float32, device=scale.device)
        if todo:
            inv = scale.double().reciprocal().float()
            unscale_and_check_(todo, found, inv)
        state = ScalerState(float(scale), int(opt.step_counter.value),
                            int(opt.hysteresis_counter.value))
        found_inf = bool(found) or spec.unscale_overflows(state.scale)
        self.updates += 1
        if found_inf:
            self._keep_skip(opt, grads, tvs, state.scale)
        else:
            self.last_skip, self.skipped_gradients = None, []
            opt.inner_optimizer.apply(grads, trainable_variables=trainable_variables)
        new = spec.update(opt.scaler_config, state, found_inf)
        opt._record(found_inf, new.scale)
        if new != state:
            opt._assign_state(new)

    def _keep_skip(self, opt: SpecLossScaleOptimizer, grads: list[Any], tvs: Any,
                   scale: float) -> None:
        """Keeps a skipped update: with ``diagnose`` its report now (the gradients are
        unscaled in place by then), else weak references to its gradients."""
        pairs = [(i, g) for i, g in zip(opt._indices(tvs), grads, strict=True)
                 if g is not None]
        self.last_skip = LastUpdate(self.updates, scale, [], self.last_loss,
                                    functional_only=False)
        self.skipped_gradients = []
        if opt.diagnose:
            self.last_skip.report = _counted(self.last_skip, pairs, note="")
        else:
            self.skipped_gradients = [(i, weakref.ref(g)) for i, g in pairs]

    def note_loss(self, loss: Any) -> None:
        # One tensor; else unknown. No host read.
        self.last_loss = loss.detach() if hasattr(loss, "detach") else None

    def overflow_report(self, opt: SpecLossScaleOptimizer,
                        names: dict[int, tuple[str, Any]] | None) -> OverflowReport | None:
        """The last skipped update's report: counted when it skipped (``diagnose``), else
        now, once, from its gradients as they are (``model.fit`` keeps them until the next
        step; freed ones are left out, and the note says so). ``loss_finite``: whether the
        last loss given to ``scale_loss`` was finite."""
        import torch

        last = self.last_skip
        if not opt.built or last is None:
            return None
        if last.report is None:
            alive = [(i, ref()) for i, ref in self.skipped_gradients]
            pairs = [(i, g) for i, g in alive if g is not None]
            note = ""
            if len(pairs) < len(alive):
                note = (f"{len(alive) - len(pairs)} of the {len(alive)} gradients of "
                        f"step {last.step} were freed before overflow_report() was "
                        "called: build the scaler with diagnose=True to keep the report "
                        "of each skipped step.")
            last.report = _counted(last, pairs, note)
            self.skipped_gradients = []
        counted = last.report
        loss_finite = None if last.loss is None else bool(torch.isfinite(last.loss).all())
        overflows = [GradientOverflow(opt._variable_name(int(o.name), names), o.shape, o.inf,
                                      o.nan, o.max_finite) for o in counted.overflows]
        return OverflowReport(counted.step, counted.scale, overflows, counted.checked,
                              loss_finite, counted.note)


def _counted(last: LastUpdate, pairs: list[tuple[int, Any]], note: str) -> OverflowReport:
    """The report of ``last`` from its gradients ``pairs`` (variable index, gradient), each
    gradient named by its variable's index."""
    from unifiedamp.backends.torch._diagnostics import count_overflows

    overflows = count_overflows([(str(i), g) for i, g in pairs])
    return OverflowReport(last.step, last.scale, overflows, len(pairs), None, note)
