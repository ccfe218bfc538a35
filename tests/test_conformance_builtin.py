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
