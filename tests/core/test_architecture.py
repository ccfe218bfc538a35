"""The package's shape: imports run one way, with no cycle, and every module has a layer.

spec <- registry <- facade <- backends <- callbacks <- port <- conformance <- cli. Imports inside
functions count too: a lazy import still ties two modules together. Imports under
``if TYPE_CHECKING:`` do not: they never run, and they are how the facade's constructor names
each backend's class for type checkers.
"""

from __future__ import annotations

import ast
import fnmatch
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

#: Lowest first; a module may import its own layer and the layers below it. The
#: "spec" layer also holds the framework-free helpers every layer may use.
LAYERS = [
    ("spec", ["unifiedamp.errors", "unifiedamp.spec", "unifiedamp.spec.*", "unifiedamp._tree",
              "unifiedamp._isolation", "unifiedamp._atomic_write", "unifiedamp.diagnostics"]),
    ("registry", ["unifiedamp._registry"]),
    ("facade", ["unifiedamp", "unifiedamp._scaler", "unifiedamp._monitor"]),
    ("backends", ["unifiedamp.backends", "unifiedamp.backends.*"]),
    # Loggers for trainers (Lightning, Keras): they read a backend's scaler.
    ("callbacks", ["unifiedamp.callbacks", "unifiedamp.callbacks.*"]),
    # Porting reads native scalers and builds any backend's scaler.
    ("port", ["unifiedamp.porting", "unifiedamp.porting.*"]),
    ("conformance", ["unifiedamp.conformance", "unifiedamp.conformance.*"]),
    ("cli", ["unifiedamp.cli", "unifiedamp.cli.*"]),
]


def module_names(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Every module of ``package`` under ``root``: dotted name -> file."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports, anywhere in its body."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import mod` imports the module pkg.mod when there is one.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (its ``else`` runs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_of(module: str) -> int:
    for index, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: add it")


GRAPH = import_graph(SRC, "unifiedamp")


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer, as ``"module (layer) imports target (layer)"``."""
    return [f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
            f"({LAYERS[layer_of(target)][0]})"
            for module, targets in sorted(graph.items()) for target in sorted(targets)
            if layer_of(target) > layer_of(module)]


def test_imports_run_one_way_from_spec_to_cli():
    wrong = upward_imports(GRAPH)
    assert not wrong, "imports against spec <- registry <- facade <- backends <- port <- " \
                      "conformance <- cli:\n" + "\n".join(wrong)


def test_the_backend_table_names_scalers_and_adapters_that_exist_in_their_layers():
    # The registry names both by string, so that it points up without importing:
    # each target must be a module of the layer it belongs to.
    from unifiedamp import _registry

    for row in _registry.BUILTIN.values():
        for target, layer in ((row.target, "backends"), (row.adapter, "conformance")):
            module = target.partition(":")[0]
            assert module in GRAPH, f"{row.name}: {target} names no module of the package"
            assert LAYERS[layer_of(module)][0] == layer, f"{row.name}: {target} is not in {layer}"


def test_no_backend_imports_the_conformance_suite():
    backends = [m for m in GRAPH if m.startswith("unifiedamp.backends")]
    assert len(backends) >= 5
    for module in backends:
        assert not any(t.startswith("unifiedamp.conformance") for t in GRAPH[module]), module


def test_the_cycle_finder_finds_a_lazy_import_cycle(tmp_path):
    # The shape the torch backend had: a function-level import of its adapter,
    # which imports the backend at module level.
    pkg = tmp_path / "pkg"
    (pkg / "backends").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "backends" / "__init__.py").write_text("")
    (pkg / "backends" / "torch.py").write_text(
        "def adapter():\n    from pkg.backends._conf import Adapter\n    return Adapter\n")
    (pkg / "backends" / "_conf.py").write_text("from . import torch\nclass Adapter: ...\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.backends._conf"] == {"pkg.backends.torch"}
    assert find_cycle(graph) == ["pkg.backends._conf", "pkg.backends.torch",
                                 "pkg.backends._conf"]


def test_the_layer_check_sees_an_upward_import():
    # What numpy's inline conformance adapter did.
    graph = {"unifiedamp.backends.numpy": {"unifiedamp.conformance", "unifiedamp.spec"},
             "unifiedamp.conformance": set(), "unifiedamp.spec": set()}
    assert upward_imports(graph) == ["unifiedamp.backends.numpy (backends) imports "
                                     "unifiedamp.conformance (conformance)"]
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("unifiedamp.new_module")


# ---------------------------------------------------------------- backend packages

#: The modules of one backend package that another backend's package may import: the
#: Keras backend on torch runs the torch backend's kernel and overflow counts.
SHARED_ACROSS_BACKENDS = {"unifiedamp.backends.torch._compat",
                          "unifiedamp.backends.torch._diagnostics"}


def backend_package(module: str) -> str | None:
    """The backend package (or single-module backend) ``module`` belongs to; None for the
    backends layer's shared modules (``backends._functional``, ``backends._imperative``...)."""
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["unifiedamp", "backends"] or parts[2].startswith("_"):
        return None
    return ".".join(parts[:3])


def cross_backend_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of another backend's package, but of a declared shared module."""
    return [f"{module} imports {target}"
            for module, targets in sorted(graph.items()) for target in sorted(targets)
            if (own := backend_package(module)) and (other := backend_package(target))
            and own != other and target not in SHARED_ACROSS_BACKENDS]


def test_no_backend_package_imports_another_but_through_a_shared_module():
    wrong = cross_backend_imports(GRAPH)
    assert not wrong, ("a backend package imports another's; share it through a module of "
                       "backends/ or declare it in SHARED_ACROSS_BACKENDS:\n" + "\n".join(wrong))


def test_the_cross_backend_check_sees_an_import_of_another_backend():
    graph = {"unifiedamp.backends.keras._torch": {"unifiedamp.backends.torch._scaler",
                                                  "unifiedamp.backends.torch._compat",
                                                  "unifiedamp.backends._float32_bits"}}
    assert cross_backend_imports(graph) == [
        "unifiedamp.backends.keras._torch imports unifiedamp.backends.torch._scaler"]


# ---------------------------------------------------------------- size and visible state

#: A module longer than this says why it stays one module, in a docstring paragraph
#: that starts with ``Length:``.
MAX_LINES = 500


def long_modules(root: pathlib.Path) -> list[str]:
    out = []
    for name, path in module_names(root, "unifiedamp").items():
        lines = path.read_text().count("\n")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and not any(p.startswith("Length:") for p in doc.split("\n\n")):
            out.append(f"{name} ({lines} lines)")
    return out


def test_no_module_is_long_without_saying_why():
    long = long_modules(SRC)
    assert not long, (f"modules over {MAX_LINES} lines whose docstring has no 'Length:' "
                      "paragraph saying why they stay one module: " + ", ".join(long))


def test_the_length_check_sees_a_long_module(tmp_path):
    (tmp_path / "unifiedamp").mkdir()
    (tmp_path / "unifiedamp" / "__init__.py").write_text('"""Short."""\n')
    body = "x = 1\n" * MAX_LINES
    (tmp_path / "unifiedamp" / "big.py").write_text('"""Big."""\n' + body)
    (tmp_path / "unifiedamp" / "said.py").write_text(
        '"""Big.\n\nLength: one table.\n"""\n' + body)
    assert long_modules(tmp_path) == [f"unifiedamp.big ({MAX_LINES + 1} lines)"]


def hidden_state(root: pathlib.Path) -> list[str]:
    """Every ``<obj>.__dict__.update(...)`` outside ``__setstate__`` (which restores what
    ``__init__`` assigned by name): attributes that grep and type checkers miss."""
    out = []
    for name, path in module_names(root, "unifiedamp").items():
        tree = ast.parse(path.read_text())
        restoring = {id(n) for f in ast.walk(tree)
                     if isinstance(f, ast.FunctionDef) and f.name == "__setstate__"
                     for n in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in restoring:
                continue
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "update"
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "__dict__"):
                out.append(f"{name}:{node.lineno}")
    return out


def test_every_attribute_is_assigned_by_name():
    assert not hidden_state(SRC), ("assign attributes by name, not through __dict__.update: "
                                   + ", ".join(hidden_state(SRC)))


def test_the_hidden_state_check_sees_dict_update_but_not_in_setstate(tmp_path):
    (tmp_path / "unifiedamp").mkdir()
    (tmp_path / "unifiedamp" / "__init__.py").write_text(
        "class A:\n"
        "    def __init__(self):\n"
        "        self.__dict__.update({'x': 1})\n"
        "    def __setstate__(self, d):\n"
        "        self.__dict__.update(d)\n")
    assert hidden_state(tmp_path) == ["unifiedamp:3"]
