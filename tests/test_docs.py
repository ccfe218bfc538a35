"""Every Python example in README.md and docs/ runs as written."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import textwrap

import pytest

from unifiedamp.conformance._pytest_process import run_pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


#: Pages whose examples run in an environment of their own, where these modules import
#: (.ci/run runs them there: ``-k praxis``).
OWN_ENVIRONMENT = {"docs/backends/praxis.md": ("praxis", "paxml")}


def code_blocks(text: str, language: str = "python") -> list[str]:
    """The ``language`` fenced blocks of a page, those indented in a tab or list included."""
    fence = re.compile(rf"^( *)```{language}\n(.*?)^\1```", re.S | re.M)
    return [textwrap.dedent(match[2]) for match in fence.finditer(text)]


def python_blocks():
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        missing = [m for m in OWN_ENVIRONMENT.get(name, ()) if importlib.util.find_spec(m) is None]
        reason = f"{name} runs where {', '.join(missing)} import: tools/praxis_env.sh builds it"
        marks = [pytest.mark.skip(reason=reason)] if missing else []
        for i, block in enumerate(code_blocks(page.read_text())):
            yield pytest.param(block, id=f"{name}#{i}", marks=marks)


@pytest.mark.parametrize("code", list(python_blocks()))
def test_example_runs(code, run_python, tmp_path):
    # In a folder of its own: examples write files (logs, plots) where they run.
    proc = run_python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


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
    for path in (ROOT / "tests").glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(), re.M))
    named = set(re.findall(r"`(?:tests/\w+\.py::)?(test_\w+)`", page))
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
