"""Keras's private API: the one module of the Keras backend that touches it.

Supported: ``keras>=3.0`` (the ``keras`` extra of pyproject.toml, with ``tensorflow-cpu>=2.16``
for the TensorFlow backend); tested with keras 3.15. A Keras that renames one of the names
below, or changes the parameters of a method listed here, is outside that range:
``tests/keras/test_keras_private_api.py`` checks every name against the installed Keras and
names the one that changed.

What the backend relies on beyond Keras's public API, all of it reached through this module:

- ``keras.src.utils.tracking.no_automatic_dependency_tracking``, re-exported here: the
  wrapper's ``build`` makes its variables as Keras's own ``LossScaleOptimizer.build`` does,
  tracked by the optimizer itself.
- Six private methods of ``keras.optimizers.LossScaleOptimizer`` (:data:`OVERRIDDEN`),
  overridden by :class:`LossScaleOptimizerHooks`, which routes each to a method the subclass
  defines under a name of its own. Keras's ``apply`` calls ``_tf_apply`` (TensorFlow) or
  ``_common_apply`` (every other backend); Keras's versions of those run the
  ``_stateful_handle_*`` branches, and its ``stateless_apply`` the ``_stateless_handle_*``
  ones. Two overrides take more parameters than Keras's, all optional, so a call shaped like
  Keras's still fits: ``_stateful_handle_non_finite_grads`` (Keras's takes none) also takes
  the gradients, the variables and each local replica's gradients, and
  ``_stateless_handle_non_finite_grads`` also takes the gradients: ``diagnose`` counts them in
  the skipped branch.
- Members of Keras's ``Optimizer`` that are read, not overridden (:data:`CALLED`,
  :data:`ATTRIBUTES`): ``_trainable_variables``, ``_variables``,
  ``_overwrite_variable_with_gradient`` and ``_get_variable_index``, under the public names
  of :class:`LossScaleOptimizerHooks`.
- Which base ``build`` makes the optimizer's own variables: ``_build_optimizer`` calls
  ``Optimizer.build``, past ``LossScaleOptimizer.build``.
- TensorFlow's ``tf.__internal__.distribute.strategy_supports_no_merge_call()``, which Keras's
  own ``_tf_apply`` asks too: :func:`replicas_update_themselves`.
"""

from __future__ import annotations

from typing import Any

import keras
from keras.src.utils import tracking

__all__ = ["ATTRIBUTES", "CALLED", "OVERRIDDEN", "LossScaleOptimizerHooks",
           "no_automatic_dependency_tracking", "replicas_update_themselves"]

#: Keras's decorator for a ``build`` that tracks the variables it makes itself.
no_automatic_dependency_tracking = tracking.no_automatic_dependency_tracking

#: The private methods of ``keras.optimizers.LossScaleOptimizer`` that
#: :class:`LossScaleOptimizerHooks` overrides, with the parameters Keras's own take.
OVERRIDDEN: dict[str, list[str]] = {
    "_common_apply": ["self", "grads", "trainable_variables"],
    "_tf_apply": ["self", "grads", "trainable_variables"],
    "_stateful_handle_finite_grads": ["self", "grads", "trainable_variables"],
    "_stateful_handle_non_finite_grads": ["self"],
    "_stateless_handle_finite_grads": ["self", "optimizer_variables", "grads",
                                       "trainable_variables"],
    "_stateless_handle_non_finite_grads": ["self", "optimizer_variables", "trainable_variables"],
}

#: The private methods of Keras's ``Optimizer`` that are called, with their parameters.
CALLED: dict[str, list[str]] = {
    "_overwrite_variable_with_gradient": ["self", "variable"],
    "_get_variable_index": ["self", "variable"],
}

#: The private attributes of a built Keras ``Optimizer`` that are read.
ATTRIBUTES = ["_trainable_variables", "_variables"]


def replicas_update_themselves() -> bool:
    """Whether the ``tf.distribute`` strategy in scope runs the update in each replica (no
    strategy, or replicas under XLA on GPUs) rather than through a ``merge_call``."""
    import tensorflow as tf

    return bool(tf.__internal__.distribute.strategy_supports_no_merge_call())


class LossScaleOptimizerHooks(keras.optimizers.LossScaleOptimizer):
    """``keras.optimizers.LossScaleOptimizer`` with its private hooks routed to methods a
    subclass defines (``_apply_checked``, ``_apply_across_replicas``, ``_apply_finite``,
    ``_apply_skipped``, ``_assign_next``, ``_stateless_finite``, ``_stateless_skipped``,
    ``_stateless_next``), and the private members of Keras's ``Optimizer`` it reads under
    names of its own (``_optimized_variables``, ``_own_values``, ``_overwritten_by_gradient``,
    ``_variable_index``)."""

    # ------------------------------------------------------------ Keras's hooks

    def _common_apply(self, grads: list[Any], trainable_variables: Any = None) -> None:
        self._apply_checked(grads, trainable_variables)

    def _tf_apply(self, grads: list[Any], trainable_variables: Any = None) -> None:
        self._apply_across_replicas(grads, trainable_variables)

    def _stateful_handle_finite_grads(self, grads: list[Any], trainable_variables: Any) -> None:
        self._apply_finite(grads, trainable_variables)
        self._assign_next(True)

    def _stateful_handle_non_finite_grads(self, grads: list[Any] | None = None,
                                          trainable_variables: Any = None,
                                          replicas: list[list[Any]] | None = None) -> None:
        # Keras's takes no argument: every one here is optional.
        self._apply_skipped(grads, trainable_variables, replicas)
        self._assign_next(False)

    def _stateless_handle_finite_grads(self, optimizer_variables: Any, grads: Any,
                                       trainable_variables: Any) -> Any:
        tvs, ovs = self._stateless_finite(optimizer_variables, grads, trainable_variables)
        return tvs, self._stateless_next(ovs, True)

    def _stateless_handle_non_finite_grads(self, optimizer_variables: Any,
                                           trainable_variables: Any, grads: Any = None) -> Any:
        # Keras's takes no gradients: they are optional here.
        tvs, ovs = self._stateless_skipped(optimizer_variables, trainable_variables, grads)
        return tvs, self._stateless_next(ovs, False)

    # ------------------------------------------------------------ what the subclass defines

    def _apply_checked(self, grads: list[Any], trainable_variables: Any) -> None:
        raise NotImplementedError

    def _apply_across_replicas(self, grads: list[Any], trainable_variables: Any) -> None:
        raise NotImplementedError

    def _apply_finite(self, grads: list[Any], trainable_variables: Any) -> None:
        raise NotImplementedError

    def _apply_skipped(self, grads: list[Any] | None, trainable_variables: Any,
                       replicas: list[list[Any]] | None) -> None:
        raise NotImplementedError

    def _assign_next(self, finite: Any) -> None:
        raise NotImplementedError

    def _stateless_next(self, optimizer_variables: Any, finite: Any) -> list[Any]:
        raise NotImplementedError

    def _stateless_finite(self, optimizer_variables: Any, grads: Any,
                          trainable_variables: Any) -> Any:
        raise NotImplementedError

    def _stateless_skipped(self, optimizer_variables: Any, trainable_variables: Any,
                           grads: Any) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------ Keras's members, read

    def _build_optimizer(self, var_list: Any) -> None:
        """``Optimizer.build`` (iterations, learning rate, the variables' index), without
        ``LossScaleOptimizer.build``, whose ``step_counter`` and ``dynamic_scale`` the
        subclass makes itself."""
        super(keras.optimizers.LossScaleOptimizer, self).build(var_list)

    @property
    def _optimized_variables(self) -> Any:
        """The trainable variables the optimizer was built for, in its index order."""
        return self._trainable_variables

    def _own_values(self, scope: Any) -> list[Any]:
        """The values ``scope`` (a ``keras.StatelessScope``) holds for this optimizer's own
        variables, without the inner optimizer's."""
        return [scope.get_current_value(v) for v in self._variables]

    def _overwritten_by_gradient(self, variable: Any) -> bool:
        """Whether ``variable`` takes its gradient as its new value (Keras's
        ``overwrite_with_gradient``): that gradient is not unscaled."""
        return self._overwrite_variable_with_gradient(variable)

    def _variable_index(self, variable: Any) -> int:
        """``variable``'s position among :attr:`_optimized_variables`."""
        return self._get_variable_index(variable)
