"""``unifiedamp port`` on paddle: each paddle source ported to paddle or to unifiedamp runs with
the real paddle and builds the same scaler, or one whose differences its problems name.
The framework-free checks of the rewriter: tests/core/test_port_source.py."""

from __future__ import annotations

import pytest

pytest.importorskip("paddle")
pytest.importorskip("libcst")

import port_sources  # noqa: E402

PAIRS = port_sources.pairs("paddle")


@pytest.fixture(scope="module")
def built_by_target():
    """Each rewritten source of this session run once, in this process."""
    return port_sources.build_pairs(PAIRS)


@pytest.mark.parametrize("to", PAIRS)
def test_the_rewritten_source_builds_the_same_scaler_in_the_real_framework(to, built_by_target):
    port_sources.check_built(to, PAIRS[to], built_by_target[to])
