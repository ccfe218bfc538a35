"""Keras on TensorFlow under MultiWorkerMirroredStrategy: two worker processes, an inf on
one worker only (``unifiedamp.conformance.engines.tensorflow``).

Each test is one launch of two workers (``TF_CONFIG`` per process), six steps of a custom
loop (``strategy.run`` + ``optimizer.apply`` in a ``tf.function``); a collective that waits
past the strategy's timeout (``CommunicationOptions(timeout_seconds=)``) raises in the
worker, and the launch kills every worker at its own timeout. Each worker's records are
checked against the spec step by step: scale and trackers on each worker's copy, the skip
decision, the weights equal across workers and equal to one process taking the spec's steps
on the mean gradient.
Same command by hand: ``python -m unifiedamp.conformance.engines tensorflow multiworker
unifiedamp`` (or ``keras``).
"""

from __future__ import annotations

import importlib.util

import pytest

from unifiedamp.conformance.engines import DEFAULT_CONFIG, default_kinds, expected_states

# This process imports no TensorFlow: the workers do.
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None
                       or importlib.util.find_spec("keras") is None,
                       reason="tensorflow and keras not installed"),
]

#: A run takes 20 to 30 s on two busy cores (TensorFlow's import is most of it).
TIMEOUT = 150
#: The native run deadlocks: worker 1 waits in the all-reduce of step 1, which TensorFlow
#: ends after this many seconds (both workers finished step 0, 20 to 30 s in on two busy
#: cores; before it they wait for each other a few seconds at most).
NATIVE_COLLECTIVE_TIMEOUT = 15
#: Should TensorFlow's timeout not end it, the launch's does.
NATIVE_TIMEOUT = 120


def run(scaler: str, timeout: float, **kw):
    # The engine module imports no framework; its workers import TensorFlow.
    from unifiedamp.conformance.engines import tensorflow as engine

    return engine.run("multiworker", scaler, timeout=timeout, **kw)


def test_multiworker_custom_loop_follows_the_spec_with_an_inf_on_one_worker():
    result = run("unifiedamp", TIMEOUT)
    outcome = result.outcome
    assert outcome.status == "ok", f"{outcome.status}: {outcome.detail}\n" + "\n".join(
        outcome.logs)
    assert result.problems() == []
    # scale_loss traced in the replica function converts under AutoGraph without a warning.
    assert not any("could not transform" in log for log in outcome.logs), outcome.logs
    # Each worker planted its own kinds, and both backed off at each worker's inf.
    kinds = default_kinds(2)
    for rank, record in enumerate(outcome.records):
        assert "".join(s["kind"] for s in record["steps"]) == kinds[rank]
        assert [s["scale"] for s in record["steps"]] == [
            s.scale for s in expected_states(DEFAULT_CONFIG, kinds)]


def test_native_loss_scale_optimizer_deadlocks_under_multiworker():
    """keras.optimizers.LossScaleOptimizer decides on each worker's own gradients: at step 1
    worker 0 has an inf and skips (its scale halves), worker 1 is finite and waits in the
    gradients' all-reduce for a worker that never joins it. Neither finishes another step:
    TensorFlow ends the wait at the collective's timeout, with each worker's traceback."""
    outcome = run("keras", NATIVE_TIMEOUT, collective_timeout=NATIVE_COLLECTIVE_TIMEOUT).outcome
    assert outcome.status == "deadlock", f"{outcome.status}: {outcome.detail}"
    assert "a collective timed out" in outcome.detail, outcome.detail
    logs = outcome.logs
    assert all("step 0 F done" in log for log in logs), (
        "a worker did not finish step 0 (all finite) within the timeout: raise "
        f"NATIVE_TIMEOUT\n{logs}")
    assert "step 1 I done: scale 512.0" in logs[0], logs[0]
    assert "step 1 " not in logs[1], logs[1]
    assert not any("step 2 " in log for log in logs), logs
