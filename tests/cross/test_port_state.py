"""``unifiedamp port-state`` across frameworks: a run checkpointed in one framework (torch,
paddle, JAX, NumPy) resumes in every other, from its checkpoint ported to that framework's
form, with the uninterrupted run's exact trajectory. Every framework trains in this process
with its real optimizer and autodiff (tests/support/port_state_runs.py); the pairs with Keras
on TensorFlow (which cannot share a process with paddle): tests/keras/test_port_state.py."""

from __future__ import annotations

import importlib.util

import port_state_runs as runs
import pytest
from port_state_runs import CHECKPOINT_AT, RESUMES, SAVES

FRAMEWORKS = ("torch", "paddle", "jax", "numpy")


@pytest.mark.slow
def test_a_run_checkpointed_in_one_framework_resumes_in_every_other_with_the_same_trajectory(
        tmp_path):
    frameworks = [fw for fw in FRAMEWORKS if importlib.util.find_spec(runs.MODULES[fw])]
    if len(frameworks) < 2:
        pytest.skip("needs two frameworks")
    folder = {fw: tmp_path / fw for fw in frameworks}
    for f in folder.values():
        f.mkdir()

    # 1. Uninterrupted run in each framework, checkpointing in its own form after AT steps.
    full = {fw: runs.uninterrupted(fw, folder[fw]) for fw in frameworks}
    for fw in frameworks:  # every framework's own run follows the spec
        assert full[fw] == runs.expected(), (fw, full[fw], runs.expected())

    # 2. port-state: each A checkpoint into each B's form.
    runs.port([(RESUMES[b][0], str(folder[a] / SAVES[a]),
                str(folder[b] / f"from-{a}-{RESUMES[b][1]}"))
               for b in frameworks for a in frameworks if a != b])

    # 3. Resume in B from every A, continue the pattern, compare with A's uninterrupted run.
    failures = []
    for b in frameworks:
        for a in frameworks:
            if a != b:
                got = runs.resumed(b, folder[b] / f"from-{a}-{RESUMES[b][1]}")
                diff = runs.first_difference(got, full[a][CHECKPOINT_AT:])
                if diff:
                    failures.append(f"{a} -> {b}: {diff}")
    assert not failures, "\n".join(failures)
