"""Type-checks the package and every Python example of the documentation with mypy and pyright.

Usage: python tools/typecheck.py [--list] [--mypy-only | --pyright-only] [MYPY_ARG ...]

Checks ``src/unifiedamp``, ``examples/`` and each ```python block of README.md and docs/**/*.md
with the configuration in pyproject.toml ([tool.mypy], [tool.pyright]). The blocks are the
ones the docs tests run (tests/support/doc_blocks.py), each an independent script: each is
written to a module of its own in a temporary folder, named after its page and index
(``docs/backends/torch.md`` block 3 is ``docs_backends_torch_md_3.py``, the test id
``docs/backends/torch.md#3``), and the messages about it are printed with the page and the line
in the page.

pyright (basedpyright, pyright's defaults: ``typeCheckingMode = "standard"``) reads the
frameworks' own annotations, and some of them are wrong for the way the frameworks are used
(Keras annotates ``kernel_initializer`` as a ``str``, names JAX and Paddle export without
``__all__``...). Its errors are split in two: the library's (any error in ``src/`` or
``examples/``, and in a block any error whose message names a unifiedamp type or module), which
fail the run, and the frameworks' (an optional package that is not installed, a name a
framework's stubs do not export, or an error in a block about framework calls only), which are
listed apart and do not. Exits 1 on any mypy error or any library error of pyright. Extra
arguments go to mypy (``--no-incremental``...); ``--list`` prints the blocks' modules and pages.
"""

from __future__ import annotations

import json
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


#: pyright's rules about how a package is published rather than how it is called: an optional
#: framework that is not installed, a name its stubs do not re-export.
PACKAGING_RULES = {"reportMissingImports", "reportMissingModuleSource", "reportPrivateImportUsage"}
#: A message about the library: it names one of its types or modules.
LIBRARY_NAMES = re.compile(r"\bunifiedamp\b|\w*GradScaler\b|\bScaler(Config|State)\b|"
                           r"\bOverflowReport\b|\bSpecLossScaleOptimizer\b")


def mypy(argv: list[str], folder: Path, blocks: list[Block]) -> int:
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               *argv, str(ROOT / "src" / "unifiedamp"),
               *(str(path) for path in sorted((ROOT / "examples").glob("*.py"))),
               *(str(folder / block.module) for block in blocks)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    by_module = {block.module: block for block in blocks}
    for line in proc.stdout.splitlines():
        print(to_page(line, folder, by_module))
    sys.stderr.write(proc.stderr)
    return proc.returncode


def is_library_error(diagnostic: dict, in_block: bool) -> bool:
    """Whether a pyright error is the library's (see the module's docstring)."""
    if diagnostic.get("rule") in PACKAGING_RULES:
        return False
    return not in_block or bool(LIBRARY_NAMES.search(diagnostic["message"]))


def pyright(folder: Path, blocks: list[Block]) -> int:
    """Runs pyright; prints the library's errors, then the frameworks' apart. Returns 1 if
    the library has any."""
    command = [sys.executable, "-m", "basedpyright", "--outputjson", "--pythonpath",
               sys.executable, "--project", str(ROOT / "pyproject.toml"),
               str(ROOT / "src" / "unifiedamp"), str(ROOT / "examples"), str(folder)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.stderr.write(proc.stdout + proc.stderr)
        return 1
    by_module = {block.module: block for block in blocks}
    library, frameworks = [], []
    for d in report["generalDiagnostics"]:
        if d["severity"] != "error":
            continue
        path = Path(d["file"])
        line = d["range"]["start"]["line"] + 1
        message = " ".join(d["message"].split())
        block = by_module.get(path.name) if path.parent.resolve() == folder.resolve() else None
        if block is not None:
            where = (f"{block.page}:{block.first_line + line - 1}  (block #{block.index})")
        else:
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}"
        text = f"{where}: error: {message} [{d.get('rule')}]"
        (library if is_library_error(d, block is not None) else frameworks).append(text)
    for text in library:
        print(text)
    print(f"pyright: {len(library)} error(s) of the library")
    if frameworks:
        print(f"pyright: {len(frameworks)} error(s) of the frameworks' packaging and "
              "annotations (not the library's; they do not fail the check):")
        for text in frameworks:
            print(f"  {text}")
    return 1 if library else 0


def main(argv: list[str]) -> int:
    blocks = doc_blocks()
    if "--list" in argv:
        for block in blocks:
            print(f"{block.module:45} {block.page}#{block.index} (line {block.first_line})")
        return 0
    run_mypy, run_pyright = "--pyright-only" not in argv, "--mypy-only" not in argv
    argv = [a for a in argv if a not in ("--pyright-only", "--mypy-only")]
    status = 0
    with tempfile.TemporaryDirectory(prefix="unifiedamp-typecheck-") as tmp:
        folder = Path(tmp)
        for block in blocks:
            (folder / block.module).write_text(block.code, encoding="utf-8")
        if run_mypy:
            status |= mypy(argv, folder, blocks)
        if run_pyright:
            status |= pyright(folder, blocks)
    print(f"checked src/unifiedamp, examples/ and {len(blocks)} documentation blocks")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
