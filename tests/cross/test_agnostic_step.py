"""examples/agnostic_step.py: one train_step, written once, trains on five frameworks with
the same scale trajectory and skip decisions as the spec, bit for bit. The example's
``train`` runs here, in this session's process, which imports all five frameworks."""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import json
import pathlib
import subprocess
import sys

import pytest

from unifiedamp import spec

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agnostic_step.py"
FRAMEWORKS = ["numpy", "torch", "paddle", "jax", "mlx"]


def _example():
    loaded = importlib.util.spec_from_file_location("agnostic_step", EXAMPLE)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def _expected(example):
    config = spec.ScalerConfig(init_scale=2.0**10, growth_interval=3)
    state = spec.ScalerState.initial(config)
    out = []
    for k in range(1, example.STEPS + 1):
        found_inf = k in example.OVERFLOW_AT
        state = spec.update(config, state, found_inf)
        out.append((k, spec.f32_hex(state.scale), found_inf))
    return out


@pytest.fixture(scope="module")
def runs():
    """``runs(framework)``: the example's records of training on ``framework`` (one per
    step, then the counters and the trained parameters), trained on first use."""
    return functools.cache(_example().train)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_step_follows_the_spec_bit_for_bit(runs, framework):
    example = _example()
    *steps, totals = runs(framework)
    got = [(r["step"], spec.f32_hex(r["scale"]), r["skipped"]) for r in steps]
    for want, have in zip(_expected(example), got, strict=True):
        assert have == want, f"{framework} diverged from the spec at step {want[0]}: " \
                             f"got {have}, the spec gives {want}"
    # A skipped step leaves the parameters as they were; every other step moves them.
    assert [r["changed"] for r in steps] == [not r["skipped"] for r in steps]
    assert totals["num_steps"] == example.STEPS
    assert totals["num_skipped_steps"] == len(example.OVERFLOW_AT)


def test_every_framework_trains_the_same_model(runs):
    import numpy as np

    final = {fw: runs(fw)[-1]["params"] for fw in FRAMEWORKS}
    for fw in FRAMEWORKS[1:]:
        for mine, reference in zip(final[fw], final["numpy"], strict=True):
            np.testing.assert_allclose(mine, reference, rtol=1e-5, err_msg=fw)
    # It learnt: closer to the true weights than the zeros it started from.
    w = np.array(final["numpy"][0])
    assert np.abs(w - [1.0, -2.0, 0.5]).sum() < np.abs([1.0, -2.0, 0.5]).sum() / 2


def test_train_step_is_written_once_with_no_framework_in_it():
    source = inspect.getsource(_example().train_step)
    tree = ast.parse(source)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not any(isinstance(n, ast.Try) for n in ast.walk(tree))
    assert "isinstance" not in names and "type" not in names
    for framework in ("numpy", "np", "torch", "paddle", "jax", "jnp", "mlx", "mx", "keras"):
        assert framework not in names, framework
        assert framework not in source.split('"""')[-1], framework


def test_the_script_prints_what_train_returns(runs):
    # The command line the example's docstring shows, on the framework that needs no other:
    # one JSON line per record, naming its framework.
    proc = subprocess.run([sys.executable, str(EXAMPLE), "numpy"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [json.loads(line) for line in proc.stdout.splitlines()]
    assert printed == [{"framework": "numpy", **record} for record in runs("numpy")]
