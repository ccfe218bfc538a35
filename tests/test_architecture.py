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

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"

#: Lowest first; a module may import its own layer and the layers below it. The
#: "spec" layer also holds the framework-free helpers every layer may use.
LAYERS = [
    ("spec", ["unifiedamp.spec", "unifiedamp.spec.*", "unifiedamp._tree",
              "unifiedamp._isolation", "unifiedamp._files", "unifiedamp.diagnostics"]),
    ("registry", ["unifiedamp._registry"]),
    ("facade", ["unifiedamp", "unifiedamp._scaler", "unifiedamp._monitor"]),
    ("backends", ["unifiedamp.backends", "unifiedamp.backends.*"]),
    # Loggers for trainers (Lightning, Keras): they read a backend's scaler.
    ("callbacks", ["unifiedamp.callbacks", "unifiedamp.callbacks.*"]),
    # Porting reads native scalers and builds any backend's scaler (unifiedamp.port and
    # unifiedamp.port_*: the former paths, deprecated, re-exporting unifiedamp.porting).
    ("port", ["unifiedamp.porting", "unifiedamp.porting.*", "unifiedamp.port",
              "unifiedamp.port_*"]),
    ("conformance", ["unifiedamp.conformance", "unifiedamp.conformance.*"]),
    # unifiedamp.demo: the former path of unifiedamp.cli.demo, deprecated.
    ("cli", ["unifiedamp.cli", "unifiedamp.cli.*", "unifiedamp.demo"]),
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
