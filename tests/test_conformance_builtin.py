"""Every built-in backend passes the packaged conformance suite, through its mixins."""

from __future__ import annotations

import pytest

from unifiedamp.backends.numpy import NumpyGradScaler
from unifiedamp.conformance import ScalerContract


class TestNumpyConformance(ScalerContract):
    backend = "numpy"

    @pytest.fixture
    def adapter(self):
        return NumpyGradScaler.conformance_adapter()


def torch_adapter(optimizer, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    from unifiedamp.backends.torch import TorchGradScaler

    return TorchGradScaler.conformance_adapter(optimizer=optimizer, device=device)


@pytest.mark.framework("torch")
class TestTorchConformance(ScalerContract):
    """Plain Adam on CPU: torch's unscale kernel, one host read per step."""

    backend = "torch"

    @pytest.fixture
    def adapter(self):
        return torch_adapter("adam", "cpu")


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
        pytest.importorskip("optax")
        from unifiedamp.backends.jax import JaxGradScaler

        return JaxGradScaler.conformance_adapter()


@pytest.mark.framework("mlx")
class TestMlxConformance(ScalerContract):
    """nn.value_and_grad of a scaled loss, mlx.optimizers.Adam; mx.compile."""

    backend = "mlx"

    @pytest.fixture
    def adapter(self):
        pytest.importorskip("mlx.core")
        from unifiedamp.backends.mlx import MlxGradScaler

        return MlxGradScaler.conformance_adapter()


@pytest.mark.framework("paddle")
class TestPaddleConformance(ScalerContract):
    """paddle.nn.Linear, Adam, autograd of a scaled loss on CPU: Paddle's unscale kernel."""

    backend = "paddle"

    @pytest.fixture
    def adapter(self):
        pytest.importorskip("paddle")
        from unifiedamp.backends.paddle import PaddleGradScaler

        return PaddleGradScaler.conformance_adapter()


@pytest.mark.framework("keras")
class TestKerasConformance(ScalerContract):
    """Keras on its default backend (TensorFlow here): a custom loop with tf.GradientTape and
    the wrapped Adam's apply; the fit step (train_on_batch) for the compiled vectors."""

    backend = "keras"

    @pytest.fixture
    def adapter(self):
        pytest.importorskip("keras")
        from unifiedamp.backends.keras import KerasGradScaler

        return KerasGradScaler.conformance_adapter()

    @pytest.fixture
    def max_examples(self):
        return 25


@pytest.mark.framework("keras")
class TestKerasSGDConformance(TestKerasConformance):
    """The same through a wrapped SGD with momentum (Keras's other optimizer family)."""

    @pytest.fixture
    def adapter(self):
        pytest.importorskip("keras")
        from unifiedamp.backends.keras import KerasGradScaler

        return KerasGradScaler.conformance_adapter(optimizer="sgd")
