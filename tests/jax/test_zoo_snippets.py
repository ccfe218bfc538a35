"""The snippets of the zoo's jmp column run with jmp and JAX alone and show the causes the
zoo's page explains."""

from __future__ import annotations

import importlib.util

import pytest

from unifiedamp.conformance.zoo import ZOO


@pytest.mark.skipif(importlib.util.find_spec("jmp") is None, reason=ZOO["jmp"].install)
def test_jmp_snippets_show_their_causes() -> None:
    from zoo_snippets import run_snippets

    lines = run_snippets(["jmp"])
    assert sorted(lines) == [
        "counts_finite_gradients_that_unscaling_overflows_as_inf.py",
        "counts_modulo_the_interval.py", "floor_of_1.py", "flushes_subnormals_to_zero.py",
        "scale_changes_a_leafs_dtype.py"]
    assert all(line.startswith("jmp ") and "spec" in line for line in lines.values()), lines
