"""Every Python example in README.md and docs/ runs as written."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks():
    for page in PAGES:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            yield pytest.param(block, id=f"{page.relative_to(ROOT)}#{i}")


@pytest.mark.parametrize("code", list(python_blocks()))
def test_example_runs(code, run_python):
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci
    install = commands[0].split(" && ")
    assert install[-1] == ".venv/bin/unifiedamp conformance" and install[-1] in ci
