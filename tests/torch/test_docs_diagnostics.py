"""docs/diagnostics.md shows what its first example prints and draws, made by this test's run.

The output block between ``<!-- output:start -->`` and ``<!-- output:end -->``, the history
``docs/diagnostics-history.json`` and the plot ``docs/diagnostics-scale.png`` come from
running the page's first Python block as a script, in this process (its printed lines
captured, its files written to a temporary folder). ``UNIFIEDAMP_WRITE_DOCS=1 pytest
tests/torch/test_docs_diagnostics.py`` rewrites them from a new run; without it the test fails
when the page shows something the example no longer prints.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import re
import shutil
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "diagnostics.md"
HISTORY = ROOT / "docs" / "diagnostics-history.json"
PLOT = ROOT / "docs" / "diagnostics-scale.png"
OUTPUT = re.compile(r"(<!-- output:start -->\n```text\n)(.*?)(```\n<!-- output:end -->)", re.S)


def first_block() -> str:
    return re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S).group(1)


def run_as_a_script(code: str, folder: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``code`` prints run as ``__main__`` in ``folder``, with the warning filters a
    new interpreter starts with. The example replaces ``warnings.showwarning`` and seeds
    torch's generator: both are put back afterwards."""
    import torch

    monkeypatch.chdir(folder)
    out = io.StringIO()
    with warnings.catch_warnings(), torch.random.fork_rng(), contextlib.redirect_stdout(out):
        warnings.resetwarnings()  # pytest's filters show DeprecationWarnings; python's do not
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                         ResourceWarning):
            warnings.simplefilter("ignore", category)
        exec(compile(code, str(PAGE), "exec"), {"__name__": "__main__"})
    return out.getvalue()


def test_the_page_shows_the_report_warning_and_plot_of_its_own_example(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    stdout = run_as_a_script(first_block(), tmp_path, monkeypatch)
    history = json.loads((tmp_path / "scale-history.json").read_text())
    if os.environ.get("UNIFIEDAMP_WRITE_DOCS"):
        PAGE.write_text(OUTPUT.sub(lambda m: m.group(1) + stdout + m.group(3),
                                   PAGE.read_text()))
        shutil.copy(tmp_path / "scale-history.json", HISTORY)
        shutil.copy(tmp_path / "scale.png", PLOT)
    shown = OUTPUT.search(PAGE.read_text()).group(2)
    assert stdout == shown, "docs/diagnostics.md shows another output: UNIFIEDAMP_WRITE_DOCS=1"
    assert history == json.loads(HISTORY.read_text())
    assert PLOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # What the page says about the run: a skip the scale caused, then the model's.
    assert "head.weight (2, 16): 1 inf, 0 NaN" in shown
    assert "The loss itself was inf/NaN before scaling" in shown
    assert "ScaleCollapseWarning: Loss scale collapsed" in shown and "Last overflow:" in shown
    skipped = [i for i, s in zip(history["iteration"], history["skipped"], strict=True) if s]
    assert skipped == [1, 2, 21, 41, 42, 43, 44, 45, 46]
