"""The mutation script's bugs still apply: each one's text is in its file exactly once.

A refactor that changes a mutated line would otherwise turn its mutant into a
silent no-op ("stale") and inflate nothing but the script's output.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutation_module():
    sys.path.insert(0, str(ROOT / "tools"))  # as when run as a script: tools/run_tests.py
    spec = importlib.util.spec_from_file_location("mutation", ROOT / "tools" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MUTATION = _mutation_module()


@pytest.mark.parametrize("mutant", MUTATION.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_once(mutant):
    assert MUTATION.occurrences(mutant) == 1, (
        f"mutant {mutant.name}: its text is in {mutant.path} "
        f"{MUTATION.occurrences(mutant)} times; update tools/mutation.py to the current code")


def test_mutant_names_are_unique():
    names = [m.name for m in MUTATION.MUTANTS]
    assert len(names) == len(set(names))
