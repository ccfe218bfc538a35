"""A device axis left out of the finite check is caught at trace time, naming ``axis_name``.

Inside a default ``jax.shard_map`` JAX types every value with the mesh axes it varies
over: a flag decided on per-device gradients varies, and using it on a replicated scale
or state raises. ``pmap`` and ``shard_map(check_vma=False)`` track nothing: a check
without an axis warns there. Gradients that already agree (``lax.pmean``, the summed
gradients of replicated parameters, ``jax.jit`` on global arrays) need no axis, and
nothing is said. One device is enough: the check reads types, not values (two devices
and two processes: tests/distributed/test_distributed_jax.py).

On a 2-D ("data", "model") mesh with parameters sharded over "model", the flag varies over
"model" only (JAX sums the gradients over "data"): a tuple ``axis_name`` sums it over the
axes it varies over, and one that leaves out "model" raises (default ``shard_map``) or warns
(``check_vma=False``, ``pmap``). A 1 x 1 mesh carries the same types (four devices, where
the values show: test_jax_devices.py).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from unifiedamp.backends.jax import (  # noqa: E402
    JaxGradScaler,
    all_finite,
    find_scaler,
    loss_scaled,
    loss_scaled_accumulate,
    step_if_finite,
    where_finite,
)

MESH = Mesh(np.array(jax.devices()[:1]), ("d",))
PARAMS = {"w": jnp.ones(3)}


def shard_mapped(body, check_vma=True):
    """``body(scaler, params, x)`` under ``jax.jit(shard_map)`` on a one-device mesh: the
    scaler and parameters replicated (``P()``), ``x`` one shard per device (``P("d")``)."""
    return jax.jit(jax.shard_map(body, mesh=MESH, in_specs=(P(), P(), P("d")),
                                 out_specs=P(), check_vma=check_vma))


def uses(name, axis_name):
    """A step that checks the per-device gradient ``x`` and uses the flag through ``name``."""

    def body(scaler, params, x):
        grads = {"w": x}  # varies over "d": each device's own gradient
        if name in ("loss_scaled", "loss_scaled_accumulate"):
            tx = (loss_scaled(optax.sgd(0.1), scaler, axis_name=axis_name)
                  if name == "loss_scaled" else
                  loss_scaled_accumulate(optax.sgd(0.1), scaler, 1, axis_name=axis_name))
            updates, state = tx.update(grads, tx.init(params), params)
            return find_scaler(state).loss_scale
        unscaled, finite = scaler.unscale(grads, axis_name=axis_name)
        if name == "update":
            return scaler.update(finite).loss_scale
        stepped = jax.tree.map(lambda p, g: p - lax.pmean(g, "d"), params, unscaled)
        if name == "where_finite":
            return where_finite(finite, stepped, params)["w"].sum()
        return step_if_finite(finite, lambda p: stepped, params)["w"].sum()

    return body


FLAG_USERS = ["update", "step_if_finite", "where_finite", "loss_scaled",
              "loss_scaled_accumulate"]


@pytest.mark.parametrize("name", FLAG_USERS)
def test_a_per_device_flag_used_on_a_replicated_state_in_shard_map_names_axis_name(name):
    step = shard_mapped(uses(name, None))
    with pytest.raises(ValueError, match=r"varies over the shard_map mesh axis 'd'.*"
                                         r"Fix: pass axis_name='d'") as error:
        step(JaxGradScaler(8.0), PARAMS, jnp.ones(3))
    assert "scaler.unscale(grads, axis_name='d')" in str(error.value)
    assert "Mesh axes in scope: ('d',)" in str(error.value)


@pytest.mark.parametrize("name", FLAG_USERS)
def test_with_axis_name_the_same_step_runs_and_skips_on_an_inf(name):
    step = shard_mapped(uses(name, "d"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        good = step(JaxGradScaler(8.0), PARAMS, jnp.ones(3))
        bad = step(JaxGradScaler(8.0), PARAMS, jnp.array([1.0, jnp.inf, 1.0]))
    if name in ("update", "loss_scaled", "loss_scaled_accumulate"):
        assert (float(good), float(bad)) == (8.0, 4.0)
    else:
        assert (float(good), float(bad)) == (3 * (1 - 1 / 8), 3.0)  # stepped; skipped


def test_gradients_that_already_agree_need_no_axis_and_nothing_is_said():
    def averaged(scaler, params, x):
        grads, finite = scaler.unscale({"w": lax.pmean(x, "d")})
        return step_if_finite(finite, lambda p: p, params)["w"].sum() + scaler.update(
            finite).loss_scale

    def of_replicated_parameters(scaler, params, x):
        # JAX sums the gradient of replicated parameters over the axis itself.
        grads = jax.grad(lambda p: scaler.scale((p["w"] * x).sum()))(params)
        grads, finite = scaler.unscale(grads)
        return where_finite(finite, params, params)["w"].sum() + scaler.update(
            finite).loss_scale

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for body in (averaged, of_replicated_parameters):
            assert float(shard_mapped(body)(JaxGradScaler(8.0), PARAMS, jnp.ones(3))) == 11.0
        scaler = JaxGradScaler(8.0)
        jitted = jax.jit(lambda s, g: s.update(s.unscale(g)[1]))  # no mesh axis in scope
        assert jitted(scaler, {"w": jnp.ones(3)}).get_scale() == 8.0
        assert scaler.update(scaler.unscale({"w": jnp.ones(3)})[1]).get_scale() == 8.0


def unchecked_step(axis_name, averaged=False):
    def body(scaler, params, x):
        g = lax.pmean(x, "d") if averaged else x
        unscaled, finite = scaler.unscale({"w": g}, axis_name=axis_name)
        return step_if_finite(finite, lambda p: p, params)["w"].sum() + scaler.update(
            finite).loss_scale

    return body


def run_mapped(mode, body):
    scaler = JaxGradScaler(8.0)
    if mode == "pmap":
        return jax.pmap(body, axis_name="d", in_axes=(None, None, 0))(
            scaler, PARAMS, jnp.ones((1, 3)))[0]
    return shard_mapped(body, check_vma=False)(scaler, PARAMS, jnp.ones(3))


@pytest.mark.parametrize("mode", ["pmap", "shard_map(check_vma=False)"])
def test_a_check_without_axis_name_warns_under_pmap_and_unchecked_shard_map(mode):
    with pytest.warns(UserWarning, match=r"unscale without axis_name inside pmap or "
                                         r"shard_map\(check_vma=False\) over the mesh axes "
                                         r"\('d',\)") as caught:
        run_mapped(mode, unchecked_step(None))
    (warning,) = [w for w in caught if "axis_name" in str(w.message)]
    assert "Fix: pass axis_name='d'" in str(warning.message)
    assert warning.filename == __file__  # the line that calls unscale
    # JAX cannot tell averaged gradients here: the warning stands, and axis_name says it.
    with pytest.warns(UserWarning, match="axis_name=\\(\\) says so"):
        run_mapped(mode, unchecked_step(None, averaged=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(run_mapped(mode, unchecked_step("d"))) == 11.0
        assert float(run_mapped(mode, unchecked_step((), averaged=True))) == 11.0


@pytest.mark.parametrize("mode", ["pmap", "shard_map(check_vma=False)"])
@pytest.mark.parametrize("name", ["loss_scaled", "loss_scaled_accumulate"])
def test_the_wrappers_given_axis_name_say_nothing_under_pmap(mode, name):
    """The wrappers check with the axis given; their own unscaling must not check again
    without it (which warned twice per step)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(run_mapped(mode, uses(name, "d"))) == 8.0


def test_axis_name_empty_tuple_adds_no_collective():
    def flag(axis_name):
        return jax.pmap(lambda x: all_finite(x, axis_name), axis_name="d")

    assert "psum" in str(jax.make_jaxpr(flag("d"))(jnp.ones((1, 3))))
    assert "psum" not in str(jax.make_jaxpr(flag(()))(jnp.ones((1, 3))))
    assert not bool(flag(())(jnp.array([[1.0, jnp.nan, 1.0]]))[0])



# ------------------------------------------------------------ 2-D meshes

MESH_2D = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
W = jnp.ones((3, 2))  # its columns sharded over "model"
X = jnp.ones((4, 3))  # the batch, its rows split over "data"


def on_2d_mesh(body, check_vma=True):
    """``body(scaler, w, x)`` under ``jax.jit(shard_map)`` on ``MESH_2D``: the scaler
    replicated, ``w`` sharded over "model", ``x`` over "data"."""
    return jax.jit(jax.shard_map(body, mesh=MESH_2D, in_specs=(P(), P(None, "model"), P("data")),
                                 out_specs=P(), check_vma=check_vma))


def sharded_step(name, axis_name):
    """The gradient of ``w`` (varies over "model"), checked by ``name``; the new scale."""

    def body(scaler, w, x):
        grads = jax.grad(lambda w: scaler.scale(((x @ w) ** 2).mean()))(w)
        if name in ("loss_scaled", "loss_scaled_accumulate"):
            tx = (loss_scaled(optax.sgd(0.1), scaler, axis_name=axis_name)
                  if name == "loss_scaled" else
                  loss_scaled_accumulate(optax.sgd(0.1), scaler, 1, axis_name=axis_name))
            return find_scaler(tx.update(grads, tx.init(w), w)[1]).loss_scale
        finite = (all_finite(grads, axis_name) if name == "all_finite" else
                  scaler.unscale(grads, axis_name=axis_name)[1])
        return scaler.update(finite).loss_scale

    return body


CHECKERS = ["unscale", "all_finite", "loss_scaled", "loss_scaled_accumulate"]


@pytest.mark.parametrize("name", CHECKERS)
def test_a_tuple_agrees_a_flag_that_varies_over_some_of_its_axes_only(name):
    # lax.psum refuses a value varying over "model" and not "data" in one call
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for axis_name in (("data", "model"), ("model", "data"), ["data", "model"]):
            step = on_2d_mesh(sharded_step(name, axis_name))
            assert float(step(JaxGradScaler(8.0), W, X)) == 8.0
            assert float(step(JaxGradScaler(8.0), W, X.at[1, 2].set(jnp.inf))) == 4.0


def test_the_tuple_adds_only_the_psum_over_the_axis_the_flag_varies_over():
    args = (JaxGradScaler(8.0), W, X)

    def jaxpr(axis_name):
        return str(jax.make_jaxpr(on_2d_mesh(sharded_step("unscale", axis_name)))(*args))

    assert jaxpr(("data", "model")) == jaxpr("model")
    (flag_sum,) = [line for line in jaxpr("model").splitlines() if "i32[] = psum" in line]
    assert "axes=('model',)" in flag_sum
    # replicated parameters: JAX sums their gradients over both axes, nothing is left to agree
    replicated = jax.jit(jax.shard_map(sharded_step("unscale", ("data", "model")), mesh=MESH_2D,
                                       in_specs=(P(), P(), P("data")), out_specs=P()))
    assert "i32[] = psum" not in str(jax.make_jaxpr(replicated)(*args))


@pytest.mark.parametrize("name", CHECKERS)
def test_an_axis_name_leaving_out_the_sharded_axis_raises_naming_it(name):
    step = on_2d_mesh(sharded_step(name, "data"))
    with pytest.raises(ValueError, match=r"varies over the shard_map mesh axis 'model'.*"
                                         r"Fix: pass axis_name='model'") as error:
        step(JaxGradScaler(8.0), W, X)
    assert "already names other axes, add 'model' to them in a tuple" in str(error.value)


@pytest.mark.parametrize("name", CHECKERS)
def test_an_axis_name_leaving_out_a_mesh_axis_warns_where_jax_tracks_nothing(name):
    with pytest.warns(UserWarning, match=r"with axis_name='data' inside pmap or shard_map\("
                                         r"check_vma=False\) over the mesh axes \('data', "
                                         r"'model'\): .* not over 'model'") as caught:
        on_2d_mesh(sharded_step(name, "data"), check_vma=False)(JaxGradScaler(8.0), W, X)
    # loss_scaled_accumulate traces its window's branch twice (its output types, then
    # lax.cond): the same warning from the same line, which Python's filter shows once.
    ((message, filename),) = {(str(w.message), w.filename) for w in caught
                              if "axis_name" in str(w.message)}
    assert "Fix: pass axis_name=('data', 'model')" in message
    assert filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for axis_name in (("data", "model"), ("model", "data"), ()):
            on_2d_mesh(sharded_step(name, axis_name), check_vma=False)(JaxGradScaler(8.0), W, X)


def test_under_pmap_an_axis_name_of_an_inner_vmap_only_warns_naming_the_device_axis():
    def flags(axis_name):
        return jax.pmap(jax.vmap(lambda g: all_finite(g, axis_name), axis_name="b"),
                        axis_name="d")

    with pytest.warns(UserWarning, match=r"all_finite with axis_name='b' .* not over 'd'.* "
                                         r"Fix: pass axis_name=\('b', 'd'\)"):
        flags("b")(jnp.ones((1, 2, 3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not bool(flags(("b", "d"))(jnp.ones((1, 2, 3)).at[0, 1, 0].set(jnp.nan))[0, 0])


def test_pmap_maps_one_axis_as_it_does_not_nest():
    """So under pmap an axis_name that JAX accepts (no unbound name) covers its devices,
    unless it names only an inner vmap's axis (above)."""
    nested = jax.pmap(jax.pmap(lambda g: all_finite(g, ("d", "e")), axis_name="e"),
                      axis_name="d")
    with pytest.raises(ValueError, match="context mesh"):
        nested(jnp.ones((1, 1, 3)))
