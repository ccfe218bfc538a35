"""``unifiedamp port-state`` on paddle's files (paddle.save's format): a ``.pdparams``,
``.pdopt`` or ``.pdckpt`` file holding code is refused unless trusted (then paddle.load runs
it), and an empty, truncated or foreign one is refused naming it. The framework-free checks:
tests/core/test_port_state.py."""

from __future__ import annotations

import pytest

pytest.importorskip("paddle")

from port_state_files import (  # noqa: E402
    check_damaged_refused,
    check_no_code_runs_unless_trusted,
)


@pytest.mark.parametrize("name", ["c.pdparams", "d.pdopt", "e.pdckpt"])
def test_no_checkpoint_runs_code_unless_the_user_trusts_it(tmp_path, name):
    check_no_code_runs_unless_trusted(tmp_path, name)


@pytest.mark.parametrize("ext", [".pdparams", ".pdopt"])
def test_an_empty_truncated_or_foreign_file_is_refused_naming_it(tmp_path, ext):
    check_damaged_refused(tmp_path, ext)
