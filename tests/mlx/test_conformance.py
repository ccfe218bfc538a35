"""The MLX backend passes the packaged conformance suite, through its mixins."""

from __future__ import annotations

import pytest
from builtin_conformance import IN_SUITE_EXAMPLES, builtin_adapter

from unifiedamp.conformance import ScalerContract


class TestMlxConformance(ScalerContract):
    """nn.value_and_grad of a scaled loss, mlx.optimizers.Adam; mx.compile."""

    backend = "mlx"

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("mlx", "mlx.core")

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES
