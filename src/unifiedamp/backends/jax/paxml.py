"""PaxML: one dynamic loss scaler for the whole model, through PaxML's own Learner.

:class:`LossScaledLearner` takes the place of ``paxml.learners.Learner``. Its
``update_states`` takes the gradients of the loss scaled by the scale held in its
optimizer state (``learner.scaler(opt_state).scale(loss)``): write the train step so
(``examples/praxis_stacked.py``). PaxML's own ``trainer_lib.train_step_single_learner``
takes the gradients of the unscaled loss and cannot be used with it. Everything PaxML's
Learner does (clipping, the skip on gradient anomalies, the repeat-prefix vectorization of
stacked layers, summaries) then works on the true, unscaled gradients, while the scaler
sits outside what the Learner vectorizes and restores.

Runs on PaxML 1.4.0 in its own environment (``tools/praxis_env.sh``,
``docs/backends/praxis.md``). Importing this module imports PaxML.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from paxml import learners
from praxis import base_layer, py_utils

from unifiedamp.backends.jax import JaxGradScaler, LossScaledState
from unifiedamp.backends.jax.praxis import _held_scaler, loss_scaled

__all__ = ["LossScaledLearner"]


class LossScaledLearner(learners.Learner):
    """PaxML's ``Learner`` with one dynamic loss scaler for the model.

    The optimizer state is ``LossScaledState(scaler arrays, state)``, ``state`` being
    what ``Learner`` would hold; ``get_grad_tx`` is
    :func:`unifiedamp.backends.jax.praxis.loss_scaled` around ``Learner``'s
    transformation, outside its repeat-prefix vectorization, so one scaler serves every
    layer, stacked ones included. ``update_states`` takes the gradients of
    ``learner.scaler(opt_state).scale(loss)``, unscales and checks them, then runs
    ``Learner.update_states`` on the unscaled gradients: its clipping
    (``clip_gradient_norm_to_value``...), ``skip_step_gradient_norm_value`` and summaries
    see the true gradients. Variables that take their gradient as their value
    (``overwrite_with_gradient``, e.g. fp8 scaling statistics) are neither unscaled nor
    checked, as ``Learner`` leaves them out of its own check. A step with an inf/NaN is
    skipped (updates of -0.0, the optimizer state kept) whatever
    ``enable_skip_step_on_gradient_anomalies`` says, and the scaler is updated after
    ``Learner``'s skip, which would otherwise restore the old scale and never back off.
    The scale is summarized as ``learning/loss_scale``.

    Attributes:
        loss_scaler: The initial :class:`~unifiedamp.backends.jax.JaxGradScaler`, or a
            ``pax_fiddle.Config`` of one (serializable with the experiment's config);
            ``None``: the spec's defaults, ``JaxGradScaler()``.
        loss_scaler_axis_name: The ``axis_name`` of the finite check; PaxML's jit and
            pmap steps hand the Learner gradients that agree already: leave ``None``.

    Example:
        >>> from praxis import optimizers, pax_fiddle, schedules
        >>> from unifiedamp.backends.jax import JaxGradScaler
        >>> learner = pax_fiddle.Config(
        ...     LossScaledLearner, name="learner", loss_name="loss",
        ...     loss_scaler=pax_fiddle.Config(JaxGradScaler, 2.0**15, growth_interval=1000),
        ...     optimizer=pax_fiddle.Config(optimizers.Adam, learning_rate=1e-3,
        ...                                 clip_gradient_norm_to_value=1.0,
        ...                                 lr_schedule=pax_fiddle.Config(schedules.Constant)))
        >>> pax_fiddle.build(learner).loss_scaler.get_scale()
        32768.0
    """

    loss_scaler: Any = None
    loss_scaler_axis_name: Any = None
    # The plain Learner with the same settings: its update_states runs on the unscaled
    # gradients and the inner state, with its own (vectorized) transformation.
    _unscaled: Any = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss_scaler is None:
            self.loss_scaler = JaxGradScaler()
        if not isinstance(self.loss_scaler, JaxGradScaler):
            raise TypeError(f"loss_scaler must be a unifiedamp.backends.jax.JaxGradScaler, "
                            f"got {type(self.loss_scaler).__name__}: e.g. "
                            f"loss_scaler=JaxGradScaler(2.0**15)")
        fields = {f.name: getattr(self, f.name)
                  for f in dataclasses.fields(learners.Learner) if f.init}
        self._unscaled = learners.Learner(**fields)

    def get_grad_tx(self, var_weight_hparams: Any) -> Any:
        """``loss_scaled`` around ``Learner``'s (vectorized) transformation."""
        return loss_scaled(self._unscaled.get_grad_tx(var_weight_hparams), self.loss_scaler,
                           axis_name=self.loss_scaler_axis_name)

    def scaler(self, opt_state: Any) -> JaxGradScaler:
        """The scaler held in ``opt_state`` (this learner's optimizer state), to scale the
        loss: ``learner.scaler(opt_state).scale(loss)``; traceable.

        Raises:
            TypeError: ``opt_state`` is not the ``LossScaledState`` that
                ``get_grad_tx(...).init`` returns.
        """
        return _held_scaler(self.loss_scaler, opt_state)

    def update_states(self, grads: Any, states: Any, old_vars: Any,
                      var_weight_hparams: Any) -> tuple[Any, LossScaledState]:
        """Unscales and checks ``grads`` (of the scaled loss), runs ``Learner``'s update on
        the unscaled ones, keeps the old optimizer state and returns updates of -0.0 if any
        was inf/NaN, and updates the scaler.

        Args:
            grads: The gradients of ``self.scaler(states).scale(loss)``.
            states: This learner's optimizer state (``get_grad_tx(...).init``).
            old_vars: The model's variables, as for ``Learner.update_states``.
            var_weight_hparams: Their ``WeightHParams``.

        Returns:
            ``(updates, new states)``, as ``Learner.update_states``.

        Raises:
            TypeError: ``states`` is not this learner's optimizer state.
        """
        scaler = self.scaler(states)
        overwrites = base_layer.var_overwrite_with_gradient
        # Overwrite-with-gradient variables' "gradients" are their new values: neither
        # scaled nor checked. Masked out and put back as Learner.update_states does.
        scaled = jax.tree.map(lambda g, h: py_utils.BpropMaskedNode() if overwrites(h) else g,
                              grads, var_weight_hparams)
        unscaled, finite = scaler.unscale(scaled, axis_name=self.loss_scaler_axis_name)
        unscaled = jax.tree.map(lambda h, g, u: g if overwrites(h) else u,
                                var_weight_hparams, grads, unscaled)
        transformed, inner = self._unscaled.update_states(
            unscaled, states.inner_state, old_vars, var_weight_hparams)

        # As Learner's own skip: overwrite-with-gradient variables take their value, every
        # other update is zero.
        def select_update(hparams: Any, update: Any) -> Any:
            if overwrites(hparams):
                return update
            return jnp.where(finite, update, jnp.zeros_like(update))

        def select_state(new: Any, old: Any) -> Any:
            if py_utils.is_optax_masked_node(new) or py_utils.is_optax_masked_node(old):
                return new
            return jnp.where(finite, new, old)

        transformed = jax.tree.map(select_update, var_weight_hparams, transformed)
        inner = jax.tree.map(select_state, inner, states.inner_state,
                             is_leaf=py_utils.is_optax_masked_node)
        new_scaler = scaler.update(finite)
        base_layer.add_global_summary("learning/loss_scale", new_scaler.loss_scale,
                                      base_layer.SummaryType.AGGREGATE_SCALAR)
        return transformed, LossScaledState(new_scaler.tree(), inner)
