"""``unifiedamp port`` on JAX: each jmp source ported to jmp or to unifiedamp runs with the
real jmp and JAX and builds the same scaler, or one whose differences its problems name; Flax's
DynamicScale, ported with its training step, follows the original's scale bit for bit.
The framework-free checks of the rewriter: tests/core/test_port_source.py."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jmp")
pytest.importorskip("libcst")

import port_sources  # noqa: E402

from unifiedamp.porting import port_source  # noqa: E402

PAIRS = port_sources.pairs("jax")


@pytest.fixture(scope="module")
def built_by_target():
    """Each rewritten source of this session run once, in this process."""
    return port_sources.build_pairs(PAIRS)


@pytest.mark.parametrize("to", PAIRS)
def test_the_rewritten_source_builds_the_same_scaler_in_the_real_framework(to, built_by_target):
    port_sources.check_built(to, PAIRS[to], built_by_target[to])


def _train(code: str, poison: list[bool]) -> list[dict]:
    """Runs ``code``'s create_train_state and train_step under jax.pmap(axis_name="batch")
    on one device, one step per entry of ``poison`` (an inf in that step's batch): per step,
    the scale the step's metrics report and the parameters, as NumPy arrays."""
    import jax
    import jax.numpy as jnp

    namespace: dict = {}
    exec(code, namespace)
    state = namespace["create_train_state"]({"w": jnp.ones(3, jnp.float32)})
    state = jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], state)
    step = jax.pmap(namespace["train_step"], axis_name="batch")
    out = []
    for index, inf in enumerate(poison):
        batch = jnp.full((1, 4, 3), 0.5 + index, jnp.float32)
        if inf:
            batch = batch.at[0, 0, 0].set(jnp.inf)
        state, metrics = step(state, batch)
        scale = metrics.get("scale", metrics.get("loss_scale"))
        out.append({"scale": np.asarray(scale), "w": np.asarray(state.params["w"])})
    return out


@pytest.mark.parametrize("source", ["FLAX_IMAGENET", "FLAX_WMT"])
def test_flax_dynamic_scale_and_its_loop_port_to_the_same_trajectory(source):
    """Flax's examples' DynamicScale (growth_interval=2: it grows on the 3rd finite step in
    a row), its value_and_grad / is_fin loop and jnp.where selects, ported to unifiedamp's JAX
    backend: every step's scale is bit for bit the original's, through growths and two
    overflows, and the parameters agree to float32 rounding; the output names the
    growth-timing difference it absorbed."""
    code = getattr(port_sources, source)
    result = port_source(code, "unifiedamp")
    assert result.ok, result.problems
    assert "DynamicScale" not in result.code.split("class TrainState")[1].split("\n", 2)[2]
    notes = " ".join(n for s in result.sites for n in s.notes)
    assert "one step later" in notes and "growth_interval=3" in result.code
    poison = [False] * 4 + [True] + [False] * 4 + [True, True] + [False] * 4
    original, ported = _train(code, poison), _train(result.code, poison)
    scales = [float(step["scale"][0]) for step in original]
    assert max(scales) > scales[0] > min(scales)  # it grew and backed off
    for index, (a, b) in enumerate(zip(original, ported, strict=True)):
        assert a["scale"].tobytes() == b["scale"].tobytes(), (index, a, b)
        # XLA fuses unscale's multiplication into the update otherwise than Flax's
        # division: the parameters agree to float32 rounding (the note says so).
        np.testing.assert_allclose(a["w"], b["w"], rtol=1e-5, atol=1e-7)


FLAX_INLINE = """\
import jax
import jax.numpy as jnp
from flax.training.dynamic_scale import DynamicScale


def loss_fn(p, x):
    return jnp.sum(p * x) * 2.0**-4


@jax.jit
def step(dyn_scale, p, x):
    dyn_scale, is_fin, loss, grad = dyn_scale.value_and_grad(loss_fn)(p, x)
    p = p - jnp.where(is_fin, 0.01 * grad, 0.0)
    return dyn_scale, p, dyn_scale.scale, dyn_scale.fin_steps


dyn_scale = DynamicScale(growth_interval=1, backoff_factor=0.25)
"""


def test_flax_value_and_grad_called_in_place_without_aux_ports_to_the_same_trajectory():
    """``ds, is_fin, loss, grad = ds.value_and_grad(loss_fn)(p, x)`` in one statement, no
    aux, under jax.jit: the same scale and fin_steps (growth_tracker) at every step."""
    import jax.numpy as jnp

    result = port_source(FLAX_INLINE, "unifiedamp")
    assert result.ok, result.problems
    assert ".loss_scale, dyn_scale.growth_tracker" in result.code
    runs = []
    for code in (FLAX_INLINE, result.code):
        namespace: dict = {}
        exec(code, namespace)
        ds, p, seen = namespace["dyn_scale"], jnp.ones(3, jnp.float32), []
        for index in range(10):
            x = jnp.full(3, jnp.inf if index in (3, 6) else 1.0 + index, jnp.float32)
            ds, p, scale, tracker = namespace["step"](ds, p, x)
            seen.append((np.asarray(scale).tobytes(), int(tracker), np.asarray(p).tobytes()))
        runs.append(seen)
    assert runs[0] == runs[1]
    assert len({scale for scale, *_ in runs[0]}) >= 3
