"""The Python examples of README.md and docs/ that use several frameworks: each runs as written, in
this session's process unless it needs a new interpreter (tests/support/doc_blocks.py says which
session runs each block, and how)."""

from __future__ import annotations

import doc_blocks
import pytest


@pytest.mark.parametrize("block", doc_blocks.params("cross"))
def test_example_runs(block, run_python, tmp_path, monkeypatch):
    doc_blocks.run(block, tmp_path, monkeypatch, run_python)
