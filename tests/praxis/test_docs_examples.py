"""The Python examples of README.md and docs/ that use Praxis or PaxML (every block of
docs/backends/praxis.md, and a block that imports them): each runs as written, in this
session's process, in the Praxis environment (tools/praxis_env.sh; .ci/run selects these tests
with ``-k "praxis or paxml"``: every id names them). Elsewhere they are skipped, saying so
(tests/support/doc_blocks.py says which session runs each block, and how)."""

from __future__ import annotations

import importlib.util

import doc_blocks
import pytest

if importlib.util.find_spec("paxml") is None or importlib.util.find_spec("praxis") is None:
    pytest.skip("Praxis and PaxML run in their own environment: build it with "
                "tools/praxis_env.sh, then .venv-praxis/bin/python -m pytest "
                "tests/praxis (docs/backends/praxis.md)", allow_module_level=True)


@pytest.mark.parametrize("block", doc_blocks.params("praxis"))
def test_example_runs(block, run_python, tmp_path, monkeypatch):
    doc_blocks.run(block, tmp_path, monkeypatch, run_python)
