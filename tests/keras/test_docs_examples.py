"""The Python examples of README.md and docs/ that use Keras or TensorFlow: each runs as written,
once, in the keras session whose Keras backend it needs (TensorFlow unless the block sets
``KERAS_BACKEND`` itself), in this session's process unless it needs a new interpreter; the
other two keras sessions skip it, saying where it runs (tests/support/doc_blocks.py says which
session runs each block, and how)."""

from __future__ import annotations

import doc_blocks
import pytest

pytest.importorskip("keras")


@pytest.mark.parametrize("block", doc_blocks.params("keras"))
def test_example_runs(block, run_python, tmp_path, monkeypatch):
    doc_blocks.skip_unless_this_backend(block)
    doc_blocks.run(block, tmp_path, monkeypatch, run_python)
