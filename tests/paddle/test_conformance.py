"""The Paddle backend passes the packaged conformance suite, through its mixins."""

from __future__ import annotations

import pytest
from builtin_conformance import IN_SUITE_EXAMPLES, builtin_adapter

from unifiedamp.conformance import ScalerContract


class TestPaddleConformance(ScalerContract):
    """paddle.nn.Linear, Adam, autograd of a scaled loss on CPU: Paddle's unscale kernel."""

    backend = "paddle"

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("paddle", "paddle")

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES
