"""The torch backend passes the packaged conformance suite, through its mixins: plain, fused
and foreach optimizers, on CPU and (where there is one) on a CUDA device."""

from __future__ import annotations

import pytest
from builtin_conformance import IN_SUITE_EXAMPLES, builtin_adapter

from unifiedamp.conformance import ScalerContract


def torch_adapter(optimizer, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    return builtin_adapter("torch", optimizer=optimizer, device=device)


class TestTorchConformance(ScalerContract):
    """Plain Adam on CPU: torch's unscale kernel, one host read per step."""

    backend = "torch"

    @pytest.fixture
    def adapter(self):
        return torch_adapter("adam", "cpu")

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES


class TestTorchFusedConformance(TestTorchConformance):
    """Fused AdamW: grad_scale/found_inf handed to the optimizer, skipping on the device."""

    @pytest.fixture
    def adapter(self):
        return torch_adapter("adamw_fused", "cpu")

    @pytest.fixture
    def max_examples(self):
        return 50


class TestTorchForeachConformance(TestTorchFusedConformance):
    @pytest.fixture
    def adapter(self):
        return torch_adapter("sgd_foreach", "cpu")


class TestTorchCudaConformance(TestTorchConformance):
    @pytest.fixture
    def adapter(self):
        return torch_adapter("adam", "cuda")


class TestTorchCudaFusedConformance(TestTorchFusedConformance):
    @pytest.fixture
    def adapter(self):
        return torch_adapter("adamw_fused", "cuda")
