"""Why no process may import paddle after TensorFlow: it crashes (and why no test session
imports both). A process of its own, since the crash is the point."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("paddle", "tensorflow")),
                    reason="paddle and tensorflow are not both installed")
def test_paddle_imported_after_tensorflow_crashes_the_process(run_python):
    """Why unifiedamp._isolation refuses that order (and no test session imports both)."""
    proc = run_python("import tensorflow\nimport paddle\nprint('unreached')")
    assert proc.returncode < 0 and "unreached" not in proc.stdout, proc.stderr[-2000:]
