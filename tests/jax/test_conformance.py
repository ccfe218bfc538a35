"""The JAX backend passes the packaged conformance suite, through its mixins."""

from __future__ import annotations

import pytest
from builtin_conformance import IN_SUITE_EXAMPLES, builtin_adapter

from unifiedamp.conformance import ScalerContract


class TestJaxConformance(ScalerContract):
    """jax.grad of a scaled loss, optax.adam; jit and shard_map over host devices."""

    backend = "jax"

    @pytest.fixture
    def adapter(self):
        return builtin_adapter("jax", "optax")

    @pytest.fixture
    def max_examples(self):
        return IN_SUITE_EXAMPLES
