"""``unifiedamp port-state`` on flax's ``.msgpack`` files: an empty, truncated or foreign one
is refused naming it. The framework-free checks: tests/core/test_port_state.py."""

from __future__ import annotations

import pytest

pytest.importorskip("flax")

from port_state_files import check_damaged_refused  # noqa: E402


@pytest.mark.parametrize("ext", [".msgpack"])
def test_an_empty_truncated_or_foreign_file_is_refused_naming_it(tmp_path, ext):
    check_damaged_refused(tmp_path, ext)
