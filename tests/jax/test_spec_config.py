"""Configuration values given as JAX arrays, as jmp writes them."""

from __future__ import annotations

import pytest

from unifiedamp.spec import ScalerConfig, config_from_args


def test_jax_arrays_as_jmp_writes_them_and_a_traced_value_is_refused():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    c = config_from_args((), {"loss_scale": jnp.asarray(2.0**15),
                              "min_loss_scale": jnp.float32(1)})
    assert (c.init_scale, c.min_scale) == (32768.0, 1.0)
    with pytest.raises(TypeError, match="init_scale must be a concrete number, got .*build it "
                                        "outside jax.jit"):
        jax.jit(lambda s: ScalerConfig(s).init_scale)(jnp.float32(8.0))
