"""JAX under ``jax.distributed``: two processes, one CPU device each, one global mesh,
an inf in one process's batch shard only (rank 0 at step 1, rank 1 at step 3).

Each test is one launch of unifiedamp.conformance.engines.jax (2 to 6 s each on two
cores) and checks every rank's scale, trackers, skip decisions and weights step by step
against the spec and a single process taking the same steps on the mean gradient.
"""

from __future__ import annotations

import importlib.util

import pytest

from unifiedamp.conformance.engines import jax as engines

# This process imports no JAX (the engine's reference is NumPy): the ranks do.
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed"),
]


def warnings_of(run):
    """Per rank, the warnings about a device axis its steps raised."""
    return [[w for step in record["steps"] for w in step["warnings"] if "axis_name" in w]
            for record in run.outcome.records]


@pytest.mark.parametrize("engine", ["processes", "processes-unchecked", "processes-pmean",
                                    "processes-jit"])
def test_unifiedamp_follows_the_spec_on_every_process(engine):
    run = engines.run(engine, "unifiedamp")
    assert run.problems() == [], run.outcome.logs
    assert warnings_of(run) == [[], []]  # an axis where one is needed, none where not


def test_no_axis_in_a_default_shard_map_is_refused_naming_axis_name():
    """Each device's flag differs over "d": the step raises where it uses the flag (JAX
    would refuse the scale's out_specs later without a word about axis_name)."""
    run = engines.run("processes-no-axis", "unifiedamp")
    assert run.outcome.status == "error", run.outcome
    assert "ValueError: step_if_finite: the finite flag varies over the shard_map mesh axis " \
           "'d'" in run.outcome.detail
    assert "Fix: pass axis_name='d'" in run.outcome.detail


def test_no_axis_in_an_unchecked_shard_map_warns_on_every_process():
    """As pmap: JAX does not track what differs across devices, so each process keeps its
    own scale (rank 1 grows to 2048 while rank 0 backs off) and steps with the averaged
    inf; the library cannot prove it, but warns naming axis_name on both ranks."""
    run = engines.run("processes-unchecked-no-axis", "unifiedamp")
    assert run.outcome.status == "ok", run.outcome
    for messages in warnings_of(run):
        assert len(messages) == 1 and "Fix: pass axis_name='d'" in messages[0]
    assert "step 1, rank 1: scale 2048.0" in run.problems()[0]


def test_per_process_arrays_outside_jit_warn_on_every_process():
    """Outside jit on arrays of one process's devices, with two processes running: each
    decides on its own gradient; the check warns with the fix (global arrays or shard_map
    with axis_name) and the runs drift apart as that says."""
    run = engines.run("processes-local", "unifiedamp")
    assert run.outcome.status == "ok", run.outcome
    for messages in warnings_of(run):
        assert len(messages) == 6  # outside jit every call checks (each step records all)
        assert "held by this process's devices only, while 2 processes run" in messages[0]
        assert "make_array_from_process_local_data" in messages[0]
    assert any("the ranks' weights differ" in p for p in run.problems())


def test_native_jmp_checked_before_the_all_reduce_diverges_silently():
    """jmp.all_finite takes no axis: checked on each device's gradient before lax.pmean
    (pmap-style shard_map), rank 1 steps with the averaged inf while rank 0 skips, their
    scales part (2048 and 512 after step 1) and inf reaches the weights, with no warning."""
    run = engines.run("processes-unchecked", "jmp")
    problems = run.problems()
    assert "step 1, rank 1: scale 2048.0" in problems[0]
    assert any("non-finite weights" in p for p in problems)
    assert warnings_of(run) == [[], []]


def test_native_jmp_checked_before_the_all_reduce_fails_in_a_default_shard_map():
    """In a default shard_map the per-device flag makes jmp's new scale vary over "d", and
    jmp's own constructor fails on it (a TypeError from jax.eval_shape in __post_init__)."""
    run = engines.run("processes", "jmp")
    assert run.outcome.status == "error", run.outcome
    assert run.outcome.detail.startswith("TypeError"), run.outcome.detail


@pytest.mark.parametrize("engine", ["processes-pmean", "processes-jit"])
def test_native_jmp_follows_the_spec_where_the_gradients_are_reduced_first(engine):
    """jmp's own recipe (lax.pmean, then check) and jit on global arrays agree without an
    axis: the inf reaches every process's gradient before the check."""
    assert engines.run(engine, "jmp").problems() == []


def test_native_jmp_with_an_inf_in_one_ranks_averaged_gradient_parts_the_replicas():
    """jmp's recipe (lax.pmean, then check) relies on the inf coming through the average:
    one added to rank 1's averaged gradient (pmap-style, where JAX lets the devices differ)
    is seen by rank 1 alone, which skips while rank 0 steps and grows; the library's scaler,
    told axis_name="d", skips both."""
    ours = engines.run("processes-pmean", "unifiedamp", overflow="gradient")
    assert ours.problems() == [], ours.outcome.logs
    problems = engines.run("processes-pmean", "jmp", overflow="gradient").problems()
    assert "step 1, rank 1: scale 2048.0" in problems[0], problems
    assert "step 3, rank 0:" in "".join(problems), problems


def test_native_jmp_outside_jit_diverges_silently():
    """Per-process arrays outside jit: each process checks its own gradient, then the
    unscaled gradients are averaged: rank 1 steps with the averaged inf and grows."""
    problems = engines.run("processes-local", "jmp").problems()
    assert "step 1, rank 1: scale 2048.0" in problems[0], problems
    assert any("non-finite weights" in p for p in problems), problems


@pytest.mark.parametrize("engine", ["processes", "processes-unchecked", "processes-jit",
                                    "processes-local"])
def test_an_inf_after_the_reduction_is_refused_where_no_reduction_precedes_the_check(engine):
    with pytest.raises(ValueError, match="only processes-pmean has one"):
        engines.run(engine, "unifiedamp", overflow="gradient")
    with pytest.raises(ValueError, match="overflow='nowhere': one of input, gradient"):
        engines.run("processes-pmean", "unifiedamp", overflow="nowhere")
