"""The docs site and what the pages say: every page in the nav, every link between pages to
a page and a heading that exist, the API reference documenting every public name, every
`unifiedamp` command of a ```bash block one the CLI parses, the spec schema's table, the tests
and settings docs/distributed.md cites, README's test command, and the assignment of every
```python block to exactly one test session (the blocks themselves run in each session's
``test_docs_examples.py``: tests/support/doc_blocks.py)."""

from __future__ import annotations

import collections
import pathlib
import re

import doc_blocks
import pytest
from doc_blocks import PAGES, code_blocks

from unifiedamp.conformance._pytest_process import run_pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def test_every_python_block_runs_in_exactly_one_session():
    """Each ```python block of README.md and docs/ is run by exactly one session's
    test_docs_examples.py (the keras session: on exactly one Keras backend)."""
    blocks = doc_blocks.blocks()
    fences = sum(len(re.findall(r"^ *```python *$", page.read_text(), re.M)) for page in PAGES)
    assert len(blocks) == fences >= 90, (len(blocks), fences)  # none missed by the pattern
    assert len({b.id for b in blocks}) == len(blocks)
    runs: collections.Counter[str] = collections.Counter()
    for session in doc_blocks.SESSIONS:
        variants = doc_blocks.KERAS_BACKENDS if session == "keras" else (None,)
        for keras_backend in variants:
            runs.update(b.id for b in doc_blocks.runs_in(session, keras_backend))
        # the session's folder runs them: a test over doc_blocks.params(session)
        runner = (TESTS / session / "test_docs_examples.py").read_text()
        assert f'doc_blocks.params("{session}")' in runner and "doc_blocks.run(" in runner, \
            session
    assert "doc_blocks.skip_unless_this_backend(block)" in (
        TESTS / "keras" / "test_docs_examples.py").read_text()
    wrong = {b.id: runs[b.id] for b in blocks if runs[b.id] != 1}
    assert not wrong, f"blocks not run exactly once (id: times): {wrong}"


def test_a_block_goes_to_the_session_of_the_frameworks_it_uses():
    def where(code, page="docs/x.md"):
        block = doc_blocks.block_of(page, 0, code)
        return block.session, block.keras_backend, block.fresh is not None

    assert where("import numpy as np\nimport unifiedamp as ua\n") == ("core", None, False)
    assert where("import unifiedamp as ua\ns = ua.GradScaler(backend='paddle')\n") == (
        "paddle", None, False)  # the backend named, its framework never imported here
    assert where("x = 1  # backend='keras'\ns = \"backend='keras'\"\n")[0] == "core"
    assert where("from unifiedamp.callbacks.lightning import ScaleLogger\n")[0] == "torch"
    assert where("import optax\nfrom flax import nnx\n")[0] == "jax"
    assert where("import keras\nimport jax\n") == ("keras", "tensorflow", False)
    assert where("import os\nos.environ['KERAS_BACKEND'] = 'jax'\nimport keras\n") == (
        "keras", "jax", True)
    assert where("import torch\nimport jax\n") == ("cross", None, False)
    assert where("import paddle\nimport keras\n") == ("cross", None, True)
    assert where("import torch.distributed as dist\ndist.init_process_group('gloo')\n") == (
        "torch", None, True)
    assert where("import jax\n", page="docs/backends/praxis.md")[0] == "praxis"
    block = doc_blocks.block_of("docs/x.md", 3, "from unifiedamp.backends.jax.paxml import L\n")
    assert (block.session, block.id) == ("praxis", "docs/x.md#3-paxml")  # -k "praxis or paxml"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci
    install = commands[0].split(" && ")
    assert install[-1] == ".venv/bin/unifiedamp conformance" and install[-1] in ci
    # Both install the tested versions: the same extras, through the constraints file.
    pip_args = install[1].split("pip install ", 1)[1]
    assert pip_args.startswith("-c constraints.txt ") and (ROOT / "constraints.txt").exists()
    assert any(line.endswith(pip_args) for line in ci), pip_args
    assert len(install) == 3, install
    # README states the test command's time in one line, with the date it was measured.
    timing = [line for line in readme.splitlines() if "min" in line and "2026-" in line]
    assert len(timing) == 1, timing


def test_worked_third_party_example_passes_the_suite():
    examples = ROOT / "docs" / "examples"
    proc = run_pytest(["--unifiedamp-max-examples", "50", str(examples)], rootdir=examples)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "TestMyScaler: backend myscaler (numpy" in proc.stdout


def test_spec_schema_doc_names_every_key_of_the_spec_document():
    from unifiedamp import spec

    doc = spec.spec_document()
    table = (ROOT / "docs" / "spec-schema.md").read_text()
    keys = set(doc) | {f"parameters[].{k}" for k in doc["parameters"][0]}
    keys |= {f"vectors[].{k}" for k in doc["vectors"][0]}
    keys |= {f"frameworks.<fw>.{k}" for k in doc["frameworks"]["torch"]}
    for key in keys:
        assert f"| `{key}` |" in table, f"{key} is not documented in docs/spec-schema.md"


def test_the_distributed_page_names_tests_and_settings_that_exist():
    """Each cell of docs/distributed.md's table cites a test and can be rerun from a shell:
    every test it names is defined, every `python -m unifiedamp.conformance.engines`
    command in the docs names an engine and a scaler its framework runs, and every engine
    has a row."""
    import importlib

    page = (ROOT / "docs" / "distributed.md").read_text()
    defined = set()
    for path in TESTS.rglob("test_*.py"):  # every session's folder; a class's tests too
        defined |= set(re.findall(r"^(?:    )?def (test_\w+)", path.read_text(), re.M))
    named = set(re.findall(r"`(?:tests/[\w/]+\.py::)?(test_\w+)`", page))
    assert len(named) >= 10 and named <= defined, sorted(named - defined)
    commands = []
    for path in PAGES:
        commands += re.findall(r"python -m unifiedamp\.conformance\.engines (\w+) ([\w.-]+) "
                               r"([\w.]+)", path.read_text())
    assert len(commands) >= 4
    for framework, engine, scaler in commands:
        module = importlib.import_module(f"unifiedamp.conformance.engines.{framework}")
        assert engine in module.ENGINES and scaler in module.SCALERS, (framework, engine,
                                                                      scaler)
    for framework in ("torch", "jax", "tensorflow", "paddle"):
        module = importlib.import_module(f"unifiedamp.conformance.engines.{framework}")
        missing = [e for e in module.ENGINES if f"`{e}`" not in page]
        assert not missing, f"{framework} engines without a row in docs/distributed.md: {missing}"


def test_every_row_of_the_distributed_table_has_both_overflows_and_a_test():
    """Each row of docs/distributed.md's table gives the framework's scaler with the overflow
    in one rank's input and with an inf in one rank's gradient after the reduction (a
    verdict, or why there is none: never "not run"), and cites a test."""
    page = (ROOT / "docs" / "distributed.md").read_text()
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| framework: engine |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    assert header[3:5] == [
        "the framework's scaler, the overflow in one rank's input",
        "the framework's scaler, an inf in one rank's gradient after the reduction"], header
    rows = [line for line in lines[start + 2:] if line.startswith("|")]
    assert len(rows) >= 15 and lines[start + 2 + len(rows)] == "", "the table ends at a blank line"
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == len(header), row
        assert all(cells[3:5]), f"a row without a cell for each overflow: {cells[0]}"
        assert "*not run*" not in cells[3] + cells[4], f"a placement not run: {cells[0]}"
        assert re.search(r"`(?:tests/[\w/]+\.py::)?test_\w+`", cells[-1]), (
            f"a row citing no test: {cells[0]}")


# The site (mkdocs.yml): every page in the nav, every link between pages to a page and a
# heading that exist, every `unifiedamp` command of a ```bash block one the CLI takes.

DOCS = ROOT / "docs"
_FENCE = re.compile(r"^( *)(`{3,}|~{3,}).*?^\1\2 *$", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def nav_pages(config: str) -> list[str]:
    """The pages mkdocs.yml's ``nav`` names (read as text: the nav is a list of
    ``- [Title: ]page.md`` lines, and the test needs no YAML reader)."""
    nav = re.search(r"^nav:\n(.*?)(?=^\S)", config, re.S | re.M)
    assert nav, "mkdocs.yml has no nav"
    return re.findall(r"^\s*-\s+(?:.*:\s+)?([\w./-]+\.md)\s*$", nav[1], re.M)


def prose(text: str) -> str:
    """A page without its code blocks and code spans, where links are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc slugify), from its text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[`*]|<[^>]+>", "", text)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: pathlib.Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _FENCE.sub("", page.read_text()),
                              re.M):
        explicit = re.search(r"\{\s*#([\w-]+)[^}]*\}\s*$", heading)
        base = explicit[1] if explicit else slug(heading)
        anchor, n = base, 0
        while anchor in found:  # a repeated heading gets _1, _2...
            n += 1
            anchor = f"{base}_{n}"
        found.add(anchor)
    return found


def test_every_page_is_in_the_nav():
    named = nav_pages((ROOT / "mkdocs.yml").read_text())
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    missing = [p for p in pages if p not in named]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"
    absent = [p for p in named if not (DOCS / p).is_file()]
    assert not absent and len(set(named)) == len(named), (absent, named)


def test_nav_pages_reads_the_nav_as_mkdocs_does():
    config = "site_name: x\nnav:\n  - Home: index.md\n  - Guides:\n      - A: a/b.md\n" \
             "  # - Old: old.md\n  - c.md\ntheme:\n  name: material\n"
    assert nav_pages(config) == ["index.md", "a/b.md", "c.md"]
    # the repository's: a page dropped from it is reported
    config = (ROOT / "mkdocs.yml").read_text()
    assert "backends/paddle.md" in nav_pages(config)
    dropped = re.sub(r"^.*: backends/paddle\.md\n", "", config, flags=re.M)
    assert "backends/paddle.md" not in nav_pages(dropped)


def test_links_between_pages_point_to_pages_and_headings_that_exist():
    checked, broken = 0, []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for target in _LINK.findall(prose(page.read_text())):
            if re.match(r"^[a-z][\w+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            checked += 1
            if page.is_relative_to(DOCS) and not linked.is_relative_to(DOCS):
                broken.append(f"{name}: {target} is outside docs/, so not on the site")
            elif not linked.exists():
                broken.append(f"{name}: {target} does not exist")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{name}: {target}: no heading #{anchor} in {linked.name}")
    assert checked >= 100, f"only {checked} links found: is the link pattern right?"
    assert not broken, "\n".join(broken)


def test_slugs_are_mkdocs_anchors():
    assert slug("`unifiedamp conformance`") == "unifiedamp-conformance"
    assert slug("Devices: shard_map, pmap and several processes") == \
        "devices-shard_map-pmap-and-several-processes"
    assert slug("PaxML: what LossScaledLearner changes, and why") == \
        "paxml-what-lossscaledlearner-changes-and-why"


def bash_commands() -> list[tuple[str, list[str]]]:
    """Each `unifiedamp ...` command line of the ```bash blocks: (where, its arguments)."""
    import shlex

    commands = []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for block in code_blocks(page.read_text(), "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                command: list[str] = []
                for word in [*words, "&&"]:
                    if word not in ("&&", "||", ";", "|"):
                        command.append(word)
                        continue
                    while command and re.match(r"^\w+=", command[0]):  # VAR=value cmd
                        command.pop(0)
                    if command and command[0].rsplit("/", 1)[-1] == "unifiedamp":
                        commands.append((f"{name}: {shlex.join(command)}", command[1:]))
                    command = []
    return commands


def test_bash_blocks_run_unifiedamp_commands_the_cli_parses(capsys):
    """A renamed subcommand or option fails here, not in a reader's shell."""
    from unifiedamp.cli import _parser

    commands = bash_commands()
    assert len(commands) >= 8, commands
    parser = _parser()
    refused = []
    for where, argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit:
            refused.append(f"{where}\n    {capsys.readouterr().err.strip()}")
    assert not refused, "\n".join(refused)
    with pytest.raises(SystemExit):  # what a stale option does
        parser.parse_args(["conformance", "--backends", "numpy"])


#: The public modules and the API reference page that documents each (docs/api/).
API_PAGES = {
    "unifiedamp": "unifiedamp.md", "unifiedamp.backends.torch": "torch.md",
    "unifiedamp.backends.paddle": "paddle.md", "unifiedamp.backends.keras": "keras.md",
    "unifiedamp.backends.jax": "jax.md", "unifiedamp.backends.jax.praxis": "jax.md",
    "unifiedamp.backends.jax.paxml": "jax.md", "unifiedamp.backends.mlx": "mlx.md",
    "unifiedamp.backends.numpy": "numpy.md", "unifiedamp.diagnostics": "diagnostics.md",
    "unifiedamp.callbacks.lightning": "callbacks.md", "unifiedamp.callbacks.keras": "callbacks.md",
    "unifiedamp.callbacks.accelerate": "callbacks.md",
    "unifiedamp.porting": "porting.md", "unifiedamp.spec": "spec.md",
    "unifiedamp.conformance": "conformance.md", "unifiedamp.conformance.contract": "conformance.md",
    "unifiedamp.conformance.strategies": "conformance.md",
}


def public_names(module: str) -> list[str]:
    """A module's ``__all__``, read from its source (importing it would import a framework):
    a list of names, or ``sorted(_LAZY)`` over a dict of lazily loaded names."""
    import ast

    path = ROOT / "src" / module.replace(".", "/")
    tree = ast.parse((path / "__init__.py" if path.is_dir() else path.with_suffix(".py"))
                     .read_text())
    values = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name)}
    names = values["__all__"]
    if isinstance(names, ast.Call):  # sorted(_LAZY)
        names = ast.List([*values[names.args[0].id].keys])  # type: ignore[attr-defined]
    return [n for n in ast.literal_eval(names) if not n.startswith("__")]


def test_the_api_reference_documents_every_public_name():
    """Each name of a public module's ``__all__`` is in its docs/api page: a ``::: path``
    directive, or a ``- name`` of a directive's ``members`` list."""
    missing = []
    for module, page in API_PAGES.items():
        text = (DOCS / "api" / page).read_text()
        documented = set(re.findall(r"^:::\s+[\w.]*?(\w+)\s*$", text, re.M))
        documented |= set(re.findall(r"^\s+-\s+(\w+)\s*$", text, re.M))
        names = public_names(module)
        assert names, module
        missing += [f"{module}.{n} (docs/api/{page})" for n in names if n not in documented]
    assert not missing, "public names the API reference leaves out: " + ", ".join(missing)


# The scaler classes the backend pages of the API reference open with.
SCALER_CLASSES = {
    "numpy.md": "unifiedamp.backends.numpy.NumpyGradScaler",
    "torch.md": "unifiedamp.backends.torch._scaler.TorchGradScaler",
    "paddle.md": "unifiedamp.backends.paddle._scaler.PaddleGradScaler",
    "keras.md": "unifiedamp.backends.keras._scaler.KerasGradScaler",
    "jax.md": "unifiedamp.backends.jax._scaler.JaxGradScaler",
    "mlx.md": "unifiedamp.backends.mlx.MlxGradScaler",
}


def _reference_package():
    """``unifiedamp`` as the API reference reads it: griffe with mkdocs.yml's extensions."""
    import importlib.util

    import griffe

    extensions = []
    for path, name in re.findall(r"^\s+- (tools/\w+\.py):(\w+)$", MKDOCS.read_text(), re.M):
        spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, ROOT / path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        extensions.append(getattr(module, name)())
    return griffe.load("unifiedamp", search_paths=[ROOT / "src"],
                       extensions=griffe.Extensions(*extensions))


MKDOCS = ROOT / "mkdocs.yml"
_NO_GRIFFE = pytest.mark.skipif(__import__("importlib").util.find_spec("griffe") is None,
                                reason="the docs extra (griffe) is not installed")


@_NO_GRIFFE
def test_the_reference_shows_each_scalers_constructor_and_inherited_members():
    """Static analysis reads ``__init__(self, *args, **kwargs)``; the reference shows what
    ``inspect.signature`` shows, and the members a scaler inherits (``update``...)."""
    import inspect

    from unifiedamp.backends.numpy import NumpyGradScaler
    from unifiedamp.spec._config import POSITIONAL

    assert re.search(r"^\s+inherited_members: true$", MKDOCS.read_text(), re.M)
    package = _reference_package()
    for path in SCALER_CLASSES.values():
        cls = package[path.removeprefix("unifiedamp.")]
        params = list(cls.all_members["__init__"].parameters)[1:]  # self
        assert [p.name for p in params[:5]] == list(POSITIONAL), path
        assert params[-1].name == "aliases" and params[-1].kind.name == "var_keyword", path
        assert "var_positional" not in {p.kind.name for p in params}, path
        assert "*args:" not in cls.docstring.value, path  # its text is a sentence now
        assert {"update", "unscale", "scale", "where_finite", "get_scale", "state_dict",
                "set_growth_factor", "num_skipped_steps"} <= set(cls.all_members), path
    # the numpy class's, against the signature it has at run time
    griffe_cls = package["backends.numpy.NumpyGradScaler"]
    shown = [(p.name, p.kind.name, p.default)
             for p in list(griffe_cls.all_members["__init__"].parameters)[1:]]
    real = [(p.name, p.kind.name.lower(),
             "{}" if p.kind is p.VAR_KEYWORD else repr(p.default))
            for p in inspect.signature(NumpyGradScaler).parameters.values()]
    assert shown == real


def _is_attribute(package, path: str) -> bool:
    import griffe

    try:
        return package[path].is_attribute
    except (KeyError, griffe.AliasResolutionError):  # made at import time: not on the page
        return False


# Public members the reference shows without a description: the pytree protocol JAX calls.
UNDESCRIBED = {"tree_flatten_with_keys", "tree_unflatten"}


@_NO_GRIFFE
def test_every_public_member_of_a_scaler_has_a_description_in_the_reference():
    """mkdocstrings leaves out a member with no docstring: an override without one (torch's
    ``config``), or a class attribute described by a ``#:`` comment or an ``Attributes:``
    entry (``backend``, JAX's ``updates``), takes the description it has in the source."""
    import griffe

    package = _reference_package()
    undescribed = []
    for path in SCALER_CLASSES.values():
        cls = package[path.removeprefix("unifiedamp.")]
        for name, member in cls.all_members.items():
            if name.startswith("_") or name in UNDESCRIBED:
                continue
            try:
                described = member.docstring is not None
            except griffe.AliasResolutionError:  # a framework's base: not on the page
                continue
            if not described:
                undescribed.append(f"{cls.name}.{name}")
    assert not undescribed, undescribed


@_NO_GRIFFE
def test_backend_api_pages_open_with_the_scaler_class():
    """mkdocstrings lists a block's attributes before its classes: an attribute of the first
    block would open the page (torch's COMPILED_RULE_DEVICES did)."""
    package = _reference_package()
    for page, path in SCALER_CLASSES.items():
        text = (DOCS / "api" / page).read_text()
        module, listed = re.search(r"^::: unifiedamp\.(\S+)\n((?:    .*\n)*)", text, re.M).groups()
        members = re.findall(r"^\s+- (\w+)$", listed, re.M)
        assert members[0] == path.rsplit(".", 1)[1], page
        attributes = [m for m in members if _is_attribute(package, f"{module}.{m}")]
        assert not attributes, f"docs/api/{page} would open with {attributes}"


def test_the_signature_page_has_a_tab_and_a_row_for_every_framework():
    text = (DOCS / "signature.md").read_text()
    first_steps = text.index("## The same training step")
    constructors = re.findall(r'^=== "([^"]+)"$', text[:first_steps], re.M)
    steps = re.findall(r'^=== "([^"]+)"$', text[first_steps:], re.M)
    assert set(steps) <= set(constructors) and "Paddle" in steps, (constructors, steps)
    rows = re.findall(r"^\| (\w[\w ]*?) \|", text, re.M)
    assert "Paddle" in rows, rows


def test_the_agnostic_example_is_on_the_site():
    """docs/agnostic.md includes examples/agnostic_step.py as it is (pymdownx.snippets, which
    fails the build on a missing file) and is found by searching "agnostic"."""
    page = (DOCS / "agnostic.md").read_text()
    included = re.findall(r'^--8<-- "([^"]+)"$', page, re.M)
    assert included == ["examples/agnostic_step.py"] and (ROOT / included[0]).is_file()
    assert "agnostic" in page.splitlines()[0].lower()  # the title: search finds it
    config = MKDOCS.read_text()
    assert re.search(r"pymdownx\.snippets:\n(?:\s{6}.*\n)*\s+check_paths: true", config)
    assert "agnostic.md" in nav_pages(config)


@_NO_GRIFFE
def test_a_scalers_methods_render_as_methods():
    """A method bound by assignment in a class body (``get_x = GradScaler.get_x``) renders in
    the reference as an attribute, with no signature: each is a ``def``."""
    package = _reference_package()
    rebound = []
    for path in SCALER_CLASSES.values():
        for name, member in package[path.removeprefix("unifiedamp.")].members.items():
            if member.is_alias or name.startswith("_") or not member.is_attribute:
                continue
            if re.fullmatch(r"\w+(\.\w+)+", str(member.value or "")):
                rebound.append(f"{path}.{name} = {member.value}")
    assert not rebound, rebound


# What each diagnostics function's description says first, and its parameters.
DIAGNOSTICS_FUNCTIONS = {
    "overflow_report": ("OverflowReport", ["counts", "step", "scale", "loss", "history"]),
    "history_init": ("An empty ring", ["size"]),
    "history_record": ("with this update recorded", ["history", "scaler", "finite"]),
    "scale_history": ("ScaleHistory", ["history"]),
    "collapse_message": ("The collapse warning's text",
                         ["scaler", "report", "step", "max_consecutive_skips"]),
    "check_collapse": ("Warns", ["scaler", "report", "step", "max_consecutive_skips",
                                 "on_collapse"]),
}


@_NO_GRIFFE
def test_the_functional_backends_diagnostics_render_as_functions():
    """JAX's and MLX's diagnostics functions are bound at import time by
    ``public_functions(...)``, their docstrings formatted from templates: the reference
    shows each with its signature and its docstring in the backend's words."""
    package = _reference_package()
    for backend, scaler, words in [("jax", "JaxGradScaler", "outside ``jit``"),
                                   ("mlx", "MlxGradScaler", "outside ``mx.compile``")]:
        for name, (says, params) in DIAGNOSTICS_FUNCTIONS.items():
            function = package[f"backends.{backend}.{name}"]
            assert function.is_function, f"{backend}.{name}"
            assert [p.name for p in function.parameters] == params, f"{backend}.{name}"
            assert function.returns is not None, f"{backend}.{name}"
            docstring = function.docstring.value
            assert says in docstring.split("\n\n")[0], f"{backend}.{name}: {docstring}"
            assert not re.search(r"\{\w+\}", docstring), docstring  # formatted
            if "scaler" in function.parameters:
                assert str(function.parameters["scaler"].annotation) == scaler
        assert words in package[f"backends.{backend}.scale_history"].docstring.value
        example = package[f"backends.{backend}.history_record"].docstring.value
        assert f"{scaler}(8.0, growth_interval=1)" in example.split("Examples:")[1]
