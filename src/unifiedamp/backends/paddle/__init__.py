"""The PaddlePaddle backend: a real ``paddle.amp.GradScaler`` that follows the spec bit for bit.

Paddle's own scaler cannot be used as it is (``docs/backends/paddle.md`` lists what it does
differently: it disables itself on a CPU place, acts on the last optimizer's inf flag
only, lets growth make the scale inf...). :class:`PaddleGradScaler` keeps its class,
names and verbs and replaces its behaviour:

- the gradients are checked and unscaled by Paddle's own kernel
  ``check_finite_and_unscale_`` (float32 gradients; other dtypes by the same
  arithmetic in elementwise ops), on whatever place the scale lives;
- every check of the iteration (every optimizer, every ``unscale_``, every
  rank) is OR-ed into the one ``found_inf`` the update acts on;
- the update is the spec's rule, applied to the host copy of the state (the
  scale is a float32 value, the trackers are ints): ``step()`` must read the
  flag on the host anyway to decide whether to call ``optimizer.step()``, as
  Paddle's optimizers do, so keeping the rule there costs no extra sync.

After a skipped step, ``scaler.overflow_report()`` names the gradients that held
inf/NaN: by ``scaler.watch(model)``'s names (``model.named_parameters()``, matched
by identity), else ``param_groups[g][i]``: ``g`` the group, ``i`` the index in it,
in the order of the optimizer's parameter groups (an optimizer built from a plain list
of parameters has one group, ``param_groups[0][i]``); ``optimizers[k].`` is put in
front when several optimizers were checked in that iteration (``k`` in the order
they were unscaled). ``history=N`` keeps the last N updates in tensors on the
scaler's place, written with device ops.

The modules: ``_scaler`` (the class), ``_diagnostics`` (what the reports and the history
need), ``_compat`` (the one module that names Paddle's private API, with the supported
versions).
"""

from unifiedamp.backends import show_as_public
from unifiedamp.backends.paddle._scaler import PaddleGradScaler, paddle_expressible

__all__ = ["PaddleGradScaler", "paddle_expressible"]

show_as_public(PaddleGradScaler, __name__)
show_as_public(paddle_expressible, __name__)
