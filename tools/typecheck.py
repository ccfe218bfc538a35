"""Type-checks the package and every Python example of the documentation with mypy.

Usage: python tools/typecheck.py [--list] [MYPY_ARG ...]

Checks ``src/unifiedamp``, ``examples/`` and each ```python block of README.md and docs/**/*.md
with the configuration in pyproject.toml ([tool.mypy]). The blocks are the ones the docs
tests run (tests/support/doc_blocks.py), each an independent script: each is written to a
module of its own in a temporary folder, named after its page and index
(``docs/backends/torch.md`` block 3 is ``docs_backends_torch_md_3.py``, the test id
``docs/backends/torch.md#3``), and mypy's messages
about it are printed with the page and the line in the page. Exits with mypy's status: 1 on any
error. Extra arguments go to mypy (``--no-incremental``...); ``--list`` prints the blocks'
modules and pages.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The same blocks, in the same order, as tests/support/doc_blocks.py: those indented in a tab
# or a list too, closed by a fence of the same indent.
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
# mypy's "path:line: severity: message" (with --show-column-numbers off, the default).
MESSAGE = re.compile(r"^(?P<path>[^:\n]+\.py):(?P<line>\d+):(?P<rest> .*)$")


class Block(NamedTuple):
    module: str  # the file name mypy sees
    page: str  # relative to the repository root
    index: int  # as in the docs tests' ids
    first_line: int  # the page's line of the block's first line of code
    code: str


def doc_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        rel = page.relative_to(ROOT).as_posix()
        text = page.read_text(encoding="utf-8")
        for i, match in enumerate(BLOCK.finditer(text)):
            first_line = text.count("\n", 0, match.start(2)) + 1
            module = re.sub(r"\W", "_", rel) + f"_{i}.py"
            blocks.append(Block(module, rel, i, first_line, textwrap.dedent(match.group(2))))
    return blocks


def to_page(line: str, folder: Path, by_module: dict[str, Block]) -> str:
    """mypy's message with a block's file and line replaced by the page's."""
    match = MESSAGE.match(line)
    if match is None:
        return line
    path = Path(match["path"])
    block = by_module.get(path.name)
    if block is None or path.parent.resolve() != folder.resolve():
        return line
    page_line = block.first_line + int(match["line"]) - 1
    return f"{block.page}:{page_line}:{match['rest']}  (block #{block.index})"


def main(argv: list[str]) -> int:
    blocks = doc_blocks()
    if "--list" in argv:
        for block in blocks:
            print(f"{block.module:45} {block.page}#{block.index} (line {block.first_line})")
        return 0
    with tempfile.TemporaryDirectory(prefix="unifiedamp-typecheck-") as tmp:
        folder = Path(tmp)
        for block in blocks:
            (folder / block.module).write_text(block.code, encoding="utf-8")
        command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                   *argv, str(ROOT / "src" / "unifiedamp"),
                   *(str(path) for path in sorted((ROOT / "examples").glob("*.py"))),
                   *(str(folder / block.module) for block in blocks)]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        by_module = {block.module: block for block in blocks}
        for line in proc.stdout.splitlines():
            print(to_page(line, folder, by_module))
        sys.stderr.write(proc.stderr)
    print(f"checked src/unifiedamp, examples/ and {len(blocks)} documentation blocks")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
