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


def _train(code: str, poison: list[bool], devices: int = 1) -> list[dict]:
    """Runs ``code``'s create_train_state and train_step under jax.pmap(axis_name="batch")
    on ``devices`` devices, one step per entry of ``poison`` (an inf in that step's batch, on
    device 0 only; device d's batch is device 0's plus d, so their gradients differ): per
    step, the scale the step's metrics report and the parameters, as NumPy arrays (one row
    per device)."""
    import jax
    import jax.numpy as jnp

    namespace: dict = {}
    exec(code, namespace)
    state = namespace["create_train_state"]({"w": jnp.ones(3, jnp.float32)})
    state = jax.tree_util.tree_map(lambda x: jnp.stack([jnp.asarray(x)] * devices), state)
    step = jax.pmap(namespace["train_step"], axis_name="batch")
    out = []
    for index, inf in enumerate(poison):
        batch = jnp.full((devices, 4, 3), 0.5 + index, jnp.float32)
        batch = batch + jnp.arange(devices, dtype=jnp.float32)[:, None, None]
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


FLAX_CLAMP = FLAX_INLINE.replace("DynamicScale(growth_interval=1, backoff_factor=0.25)",
                                 "DynamicScale(growth_interval=1, scale=2.0**127)")


def test_flax_clamp_at_float32_max_ports_to_the_same_trajectory():
    """DynamicScale clamps a growth past float32's maximum to it (jnp.minimum with
    finfo(float32).max): from scale=2**127 it grows into the clamp, stays there through a
    second growth, backs off and grows again; the ported scaler (max_scale=float32's maximum)
    reports the same float32 scale and parameters at every step."""
    import jax.numpy as jnp

    result = port_source(FLAX_CLAMP, "unifiedamp")
    assert result.ok, result.problems
    poison = [False] * 4 + [True] + [False] * 5
    runs = []
    for code in (FLAX_CLAMP, result.code):
        namespace: dict = {}
        exec(code, namespace)
        ds, p, seen = namespace["dyn_scale"], jnp.ones(3, jnp.float32), []
        for inf in poison:
            x = jnp.full(3, jnp.inf if inf else 1.0, jnp.float32)
            ds, p, scale, tracker = namespace["step"](ds, p, x)
            seen.append((np.float32(scale), int(tracker), np.asarray(p).tobytes()))
        runs.append(seen)
    f32_max = np.finfo(np.float32).max
    flax_scales = [scale for scale, *_ in runs[0]]
    # Flax's own trajectory: 2**127, the clamp (twice in a row), a backoff, the clamp again
    assert flax_scales[:5] == [2.0**127, f32_max, f32_max, f32_max, f32_max / 2], flax_scales
    assert flax_scales[-1] == f32_max and all(np.isfinite(flax_scales))
    for index, (a, b) in enumerate(zip(*runs, strict=True)):
        assert a[0].tobytes() == b[0].tobytes() and a[1:] == b[1:], (index, a, b)


# Run by a new interpreter on two host devices (JAX fixes its device count when it starts,
# as in test_jax_devices.py): argv[1] a JSON list of sources, argv[2] the poisoned steps.
_TWO_DEVICES = """\
import json, sys
sys.path[:0] = [{support!r}, {here!r}]
import jax
assert jax.device_count() == 2, jax.devices()
import test_port_source as t
codes, poison = json.loads(sys.argv[1]), json.loads(sys.argv[2])
runs = [[{{"scale": s["scale"].tolist(), "w": s["w"].tolist()}} for s in t._train(c, poison, 2)]
        for c in codes]
print(json.dumps(runs))
"""


def test_flax_loop_with_axis_name_on_two_devices_averages_like_flax(run_python):
    """Flax's imagenet step under jax.pmap(axis_name="batch") on two host devices whose
    gradients differ: DynamicScale.value_and_grad pmeans them, and the ported loop (its
    jax.lax.pmean line, then unscale) gives every device Flax's parameters (to float32
    rounding) and scale, through growths and an inf on one device only."""
    import json
    import os

    result = port_source(port_sources.FLAX_IMAGENET, "unifiedamp")
    assert result.ok, result.problems
    # the rewritten branch's pmean, and the original's in its else branch
    assert result.code.count("grads = jax.lax.pmean(grads, axis_name='batch')") == 2
    poison = [False] * 4 + [True] + [False] * 4
    here = os.path.dirname(os.path.abspath(__file__))
    program = _TWO_DEVICES.format(support=os.path.dirname(port_sources.__file__), here=here)
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2")
    proc = run_python(program, env={"XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"},
                      args=(json.dumps([port_sources.FLAX_IMAGENET, result.code]),
                            json.dumps(poison)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    original, ported = json.loads(proc.stdout.strip().splitlines()[-1])
    w0 = np.asarray(original[0]["w"], np.float32)
    assert not np.allclose(w0[0], np.ones(3)), w0  # it stepped
    scales = [s["scale"][0] for s in original]
    assert scales[2] > scales[1] and scales[4] < scales[3]  # it grew, then backed off
    for index, (a, b) in enumerate(zip(original, ported, strict=True)):
        fa, fb = (np.asarray(s["scale"], np.float32) for s in (a, b))
        assert fa.tobytes() == fb.tobytes(), (index, a, b)
        wa, wb = (np.asarray(s["w"], np.float32) for s in (a, b))
        assert (wa[0] == wa[1]).all(), wa  # Flax's replicas agree
        np.testing.assert_allclose(wb, wa, rtol=1e-5, atol=1e-7, err_msg=str(index))
