"""The Keras backend: a ``LossScaleOptimizer`` that follows the spec bit for bit, on every
Keras backend (TensorFlow, JAX, torch).

``scaler.wrap(inner)`` returns a :class:`SpecLossScaleOptimizer`: a subclass of
``keras.optimizers.LossScaleOptimizer`` (so ``model.compile`` does not wrap it a
second time under a ``mixed_float16`` policy) whose variables hold the scale and
both trackers, and whose update is the spec's rule written in ``keras.ops``.
Keras's own class is not used even for the configs it can express: it has
no inf guard on growth (growth past float32 makes the scale inf), divides by
the scale instead of multiplying by ``f32(1 / scale)``, fails in ``apply()``
under the JAX backend, and under ``tf.distribute.MirroredStrategy`` decides on
the first replica's local gradients (an inf on another replica is applied).

TensorFlow and XLA flush float32 subnormals to zero, so the scale's update and
its reciprocal are computed on bit patterns, as the JAX backend does: the scale
follows the spec bit for bit at every float32 value on every Keras backend.

Importing this module registers :class:`SpecLossScaleOptimizer` with Keras, which
``keras.saving.load_model`` needs to load a model saved with it.

The package: ``_scaler.py`` (:class:`KerasGradScaler`), ``_optimizer.py`` (the wrapper every
Keras backend shares), ``_tensorflow.py``, ``_jax.py`` and ``_torch.py`` (what differs on each,
behind ``_paths.py``'s interface, with the device ops they share), ``_diagnostics.py``
(``diagnose`` and ``history``) and ``_compat.py`` (the one module that touches Keras's private
API). Float32 arithmetic on bit patterns is ``unifiedamp.backends._float32_bits``'s, shared with
the JAX backend.
"""

from __future__ import annotations

from unifiedamp.backends import show_as_public

from ._optimizer import SpecLossScaleOptimizer
from ._scaler import KerasGradScaler

__all__ = ["KerasGradScaler", "SpecLossScaleOptimizer"]

# The public path in repr, pickle, Keras's saved configs ('module') and the docs.
show_as_public(KerasGradScaler, __name__)
show_as_public(SpecLossScaleOptimizer, __name__)
