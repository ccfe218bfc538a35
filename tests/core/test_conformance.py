"""The NumPy backend passes the packaged conformance suite, through its mixins."""

from __future__ import annotations

import pytest
from builtin_conformance import IN_SUITE_EXAMPLES, builtin_adapter

from unifiedamp.conformance import ScalerContract


class TestNumpyConformance(ScalerContract):
    backend = "numpy"

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("numpy")
