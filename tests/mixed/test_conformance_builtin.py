"""Every built-in backend passes the packaged conformance suite, through its mixins."""

from __future__ import annotations

import importlib

import pytest

from unifiedamp import _registry
from unifiedamp.conformance import ScalerContract


def builtin_adapter(backend, needs=None, **options):
    """The conformance adapter of a built-in backend; skipped where ``needs`` is missing."""
    if needs:
        pytest.importorskip(needs)
    module, _, name = _registry.BUILTIN[backend].target.partition(":")
    return getattr(importlib.import_module(module), name).conformance_adapter(**options)


#: Hypothesis examples per property here. The suite is derandomized (the same examples on
#: every run); `unifiedamp conformance`, which README's install command and CI run, checks
#: every built-in backend with the full budget (200).
IN_SUITE_EXAMPLES = 50


class TestNumpyConformance(ScalerContract):
    backend = "numpy"

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("numpy")


def torch_adapter(optimizer, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    return builtin_adapter("torch", optimizer=optimizer, device=device)


@pytest.mark.framework("torch")
class TestTorchConformance(ScalerContract):
    """Plain Adam on CPU: torch's unscale kernel, one host read per step."""

    backend = "torch"

    @pytest.fixture
    def adapter(self):
        return torch_adapter("adam", "cpu")

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES


@pytest.mark.framework("torch")
class TestTorchFusedConformance(TestTorchConformance):
    """Fused AdamW: grad_scale/found_inf handed to the optimizer, skipping on the device."""

    @pytest.fixture
    def adapter(self):
        return torch_adapter("adamw_fused", "cpu")

    @pytest.fixture
    def max_examples(self):
        return 50


@pytest.mark.framework("torch")
class TestTorchForeachConformance(TestTorchFusedConformance):
    @pytest.fixture
    def adapter(self):
        return torch_adapter("sgd_foreach", "cpu")


@pytest.mark.framework("torch")
class TestTorchCudaConformance(TestTorchConformance):
    @pytest.fixture
    def adapter(self):
        return torch_adapter("adam", "cuda")


@pytest.mark.framework("torch")
class TestTorchCudaFusedConformance(TestTorchFusedConformance):
    @pytest.fixture
    def adapter(self):
        return torch_adapter("adamw_fused", "cuda")


@pytest.mark.framework("jax")
class TestJaxConformance(ScalerContract):
    """jax.grad of a scaled loss, optax.adam; jit and shard_map over host devices."""

    backend = "jax"

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("jax", "optax")

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES


@pytest.mark.framework("mlx")
class TestMlxConformance(ScalerContract):
    """nn.value_and_grad of a scaled loss, mlx.optimizers.Adam; mx.compile."""

    backend = "mlx"

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("mlx", "mlx.core")

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES


@pytest.mark.framework("paddle")
class TestPaddleConformance(ScalerContract):
    """paddle.nn.Linear, Adam, autograd of a scaled loss on CPU: Paddle's unscale kernel."""

    backend = "paddle"

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("paddle", "paddle")

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES


@pytest.mark.framework("keras")
class TestKerasConformance(ScalerContract):
    """Keras on its default backend (TensorFlow here): a custom loop with tf.GradientTape and
    the wrapped Adam's apply; the fit step (train_on_batch) for the compiled vectors."""

    backend = "keras"

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("keras", "keras")

    @pytest.fixture
    def max_examples(self):
        return 25


@pytest.mark.framework("keras")
class TestKerasSGDConformance(TestKerasConformance):
    """The same through a wrapped SGD with momentum (Keras's other optimizer family)."""

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("keras", "keras", optimizer="sgd")
