"""The shipped conformance suite, for ``pytest --pyargs unifiedamp.conformance``.

Collected only when a backend is asked for (``--unifiedamp-backend`` or
``UNIFIEDAMP_BACKEND``); the adapter comes from the plugin's fixture.
"""

from __future__ import annotations

from typing import Any

import pytest

from unifiedamp.conformance.contract import ScalerContract


class TestConformance(ScalerContract):
    @pytest.fixture
    def adapter(self, unifiedamp_adapter: Any) -> Any:
        return unifiedamp_adapter
