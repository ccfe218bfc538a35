"""The paddle backend in a process that holds paddle and TensorFlow (paddle imported first):
a process of its own, since this session's process must never import TensorFlow."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("paddle", "tensorflow")),
                    reason="paddle and tensorflow are not both installed")
def test_paddle_imported_before_tensorflow_still_loads_its_backend(run_python):
    # The crash is at paddle's import: once paddle is in, tensorflow may follow and
    # the paddle backend must still load.
    code = textwrap.dedent("""
        import paddle
        import tensorflow
        import unifiedamp as ua
        print(ua.GradScaler(1024.0, backend="paddle").get_scale())
    """)
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "1024.0", proc.stderr[-2000:]
