"""Reading a source file for :func:`~unifiedamp.porting.port_source`: which names are scaler
classes, what each constructor call is assigned to, the literals of its arguments, and the
mentions of a scaler class that port cannot follow.

Every name is resolved through the file's imports (libcst's qualified names), so a class is
found however it was imported; :class:`_Context` holds what the whole pass needs, and
:class:`CallSite` is the record of one call or mention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unifiedamp.porting._config import NATIVE_SCALERS, QUALNAMES

# The module each target's call needs, and the name it is imported as when the file has none.
_IMPORTS = {"unifiedamp": ("unifiedamp", "ua"), "torch": ("torch", None),
            "paddle": ("paddle", None), "keras": ("keras", None), "jmp": ("jmp", None),
            "jax": ("jax", None)}  # Flax's DynamicScale loop: jax.value_and_grad

# Calls that hold a literal (jmp's README writes jmp.DynamicLossScale(jnp.float32(2 ** 15))).
_CASTS = {"builtins.float": float, "builtins.int": int, "numpy.float32": float,
          "numpy.float64": float, "jax.numpy.float32": float, "jax.numpy.asarray": float,
          "jax.numpy.array": float, "numpy.asarray": float, "numpy.array": float}


@dataclass
class CallSite:
    """One rewritten (or reported) line: a constructor call, a verb on its scaler, or another
    mention of a scaler class (a "reference": the class used as a value, looked up with
    getattr, or imported and never used), which port cannot follow.

    ``before``/``after`` are the call as written and as rewritten (``after`` is ``before``
    where nothing could be written); ``config`` the canonical values the source call
    builds (``{}`` for a verb or a reference); ``notes`` what was filled in or mapped;
    ``problems`` what the target cannot express, each saying what to do instead.
    """

    line: int
    kind: str  # "constructor", "verb" or "reference"
    source: str
    target: str
    before: str
    after: str
    config: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class _NotLiteral(Exception):
    """An argument that is not a literal: ``_Context.literal`` raises it, and the call's
    writer keeps the argument as its source text."""


def _walk(cst: Any, node: Any) -> Any:
    """Every node under ``node``, in source order (a stack, not recursion: deep trees)."""
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def _branches(cst: Any, expr: Any) -> Any:
    """``expr`` and the values it may take: both sides of ``a if c else b`` and ``a or b``."""
    yield expr
    if isinstance(expr, cst.IfExp):
        yield from _branches(cst, expr.body)
        yield from _branches(cst, expr.orelse)
    elif isinstance(expr, cst.BooleanOperation):
        yield from _branches(cst, expr.left)
        yield from _branches(cst, expr.right)


# Modules a getattr() picks a scaler class from (not keras.optimizers: its optimizers are
# looked up that way too).
_LOOKUP_MODULES = frozenset({"jmp", "torch.amp", "torch.cuda.amp", "paddle.amp",
                             "keras.mixed_precision", "tensorflow.keras.mixed_precision",
                             "tf_keras.mixed_precision"})
# The classes a port to each target writes: a mention of one of them stays right.
_STAYS = {"torch": ("torch.amp.GradScaler",
                    "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler"),
          "paddle": ("paddle.amp.GradScaler",), "keras": ("keras.optimizers.LossScaleOptimizer",),
          "jmp": ("jmp.DynamicLossScale", "jmp.StaticLossScale"), "unifiedamp": ()}


def _root(cst: Any, node: Any) -> str | None:
    """The name an expression such as ``torch.cuda.amp.GradScaler`` starts from."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def _bindings(ctx: _Context, node: Any) -> list[tuple[str, str]]:
    """``(local name, qualified name)`` of each name an import statement binds."""
    cst = ctx.cst
    if isinstance(node, cst.Import):
        return [(a.asname.name.value if a.asname else ctx.code(a.name).split(".")[0],
                 ctx.code(a.name)) for a in node.names]
    if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
        return []
    return [(a.asname.name.value if a.asname else ctx.code(a.name),
             f"{ctx.code(node.module)}.{ctx.code(a.name)}") for a in node.names]


def _references(ctx: _Context, positions: Any) -> list[CallSite]:
    """A site for each mention of a scaler class that is not a call port could rewrite: the
    class used as a value (``scaler_type = GradScaler``, ``isinstance(x, GradScaler)``), picked
    by ``getattr(jmp, name)``, or imported and never used (a re-export). The call that builds
    the scaler is elsewhere: a problem, unless the class is the one the port writes."""
    cst = ctx.cst
    skip: set[Any] = set()  # prefixes (torch.cuda.amp), callees, import statements
    annotated: set[Any] = set()
    imports: dict[str, int] = {}  # local name -> the line of its import
    reexports: dict[str, tuple[str, int]] = {}  # local name -> (scaler class, line)
    used: set[str | None] = set()  # names a mention of a scaler class starts from
    sites = []

    def site(node: Any, name: str, text: str, problem: bool = True) -> None:
        before = ctx.code(node)
        sites.append(CallSite(positions[node].start.line, "reference", name, ctx.to, before,
                              before, notes=[] if problem else [text],
                              problems=[text] if problem else []))

    for node in _walk(cst, ctx.module):
        if isinstance(node, cst.Annotation):
            annotated.update(_walk(cst, node))
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            skip.update(_walk(cst, node))
            for local, qualname in _bindings(ctx, node):
                imports.setdefault(local, positions[node].start.line)
                name = _normalise(qualname)
                if name is not None:
                    reexports.setdefault(local, (name, positions[node].start.line))
        if isinstance(node, cst.Attribute):
            skip.add(node.value)
        if isinstance(node, cst.Call):
            skip.add(node.func)
            if ctx.scaler(node.func) is not None:
                used.add(_root(cst, node.func))
            rewrite = _graph_rewrite(ctx, node)
            if rewrite is not None:
                site(node, *rewrite)
            module = _looked_up(ctx, node)
            if module is not None:
                site(node, module, f"getattr({ctx.code(node.args[0].value)}, ...) picks a class "
                                   f"of {module} at run time: port cannot follow it to the "
                                   "scaler it builds; write the constructor call out to port it")
        if node in skip or not isinstance(node, (cst.Name, cst.Attribute)):
            continue
        name = ctx.scaler(node)
        if name is None:
            continue
        root = _root(cst, node)
        used.add(root)
        if name in _STAYS[ctx.to]:
            continue
        where = f" (imported at line {imports[root]})" if root in imports else ""
        if node in annotated:
            site(node, name, f"{name}{where} names a type here: port leaves annotations as "
                             "they are", problem=False)
        else:
            framework = NATIVE_SCALERS[name]["framework"]
            site(node, name, f"{name}{where} is used here as a value, not called: port cannot "
                             "follow it to the call that builds the scaler, and this line keeps "
                             f"meaning {framework}'s class; port that code by hand")
    for local, (name, line) in reexports.items():
        if local not in used and name not in _STAYS[ctx.to]:
            sites.append(CallSite(line, "reference", name, ctx.to, local, local, problems=[
                f"imports {name} and never uses it here: port cannot follow it to the files "
                "that import it from here (a re-export?); port those files"]))
    return sites


#: TensorFlow's automatic mixed precision graph rewrite: it wraps the optimizer in a loss-scale
#: optimizer of its own inside TensorFlow (no scaler object in the file to rewrite).
_GRAPH_REWRITES = frozenset(
    f"{module}.enable_mixed_precision_graph_rewrite" for module in (
        "tensorflow.compat.v1.mixed_precision", "tensorflow.train.experimental",
        "tensorflow.compat.v1.train.experimental",
        "tensorflow.compat.v1.mixed_precision.experimental",
        "tensorflow.mixed_precision.experimental"))


def _graph_rewrite(ctx: _Context, node: Any) -> tuple[str, str] | None:
    """``(name, problem)`` for a call of TensorFlow's mixed precision graph rewrite (None: not
    one): port does not rewrite it, and says what to write instead."""
    name = next(iter(sorted(ctx.imported(node.func) & _GRAPH_REWRITES)), None)
    if name is None:
        return None
    loss_scale = next((ctx.code(a.value) for a in node.args
                       if a.keyword is not None and a.keyword.value == "loss_scale"), None)
    if loss_scale is None and len(node.args) > 1 and node.args[1].keyword is None:
        loss_scale = ctx.code(node.args[1].value)
    scale = f"loss_scale={loss_scale}" if loss_scale else "its default loss_scale='dynamic'"
    return name, (f"{name}(...) turns on TensorFlow's graph-rewrite mixed precision, which wraps "
                  f"the optimizer in a loss-scale optimizer inside TensorFlow ({scale}); port "
                  "rewrites scaler constructors only and left it as it is. Port it by hand: "
                  "keras.mixed_precision.set_global_policy('mixed_float16') and a Keras 3 "
                  "optimizer wrapped as keras.optimizers.LossScaleOptimizer(opt) (dynamic) or "
                  "ua.GradScaler(init_scale=..., dynamic=False, backend='keras').wrap(opt) "
                  "(a number: a static scale), then port that")


def _looked_up(ctx: _Context, node: Any) -> str | None:
    """The module of ``getattr(module, name)`` where it may pick a scaler class, or None."""
    cst = ctx.cst
    if ctx.code(node.func) != "getattr" or ctx.imported(node.func) or len(node.args) < 2:
        return None
    module = next(iter(ctx.imported(node.args[0].value) & _LOOKUP_MODULES), None)
    attr = node.args[1].value
    if module is None or (isinstance(attr, cst.SimpleString)
                          and _normalise(f"{module}.{attr.evaluated_value}") is None):
        return None
    return module


def _normalise(qualname: str) -> str | None:
    """The NATIVE_SCALERS key of an imported name, or None (unifiedamp itself is no source)."""
    name = QUALNAMES.get(qualname, qualname) if "." in qualname else qualname
    if name.startswith("tensorflow.keras."):  # `import tensorflow as tf`: tf.keras...
        name = QUALNAMES.get(name, name)
    if name in NATIVE_SCALERS and not name.startswith("unifiedamp"):
        return name
    return None


def _module_imports(cst: Any, module: Any) -> dict[str, tuple[str, int]]:
    """Top-level ``import x`` / ``import x as y``: module -> (the name it is bound to, the
    index of its statement in the module's body)."""
    bound: dict[str, tuple[str, int]] = {}
    for index, stmt in enumerate(module.body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    dotted = module.code_for_node(alias.name)
                    if alias.asname is not None:
                        bound.setdefault(dotted, (alias.asname.name.value, index))
                    else:
                        bound.setdefault(dotted.split(".")[0], (dotted.split(".")[0], index))
    return bound


class _Context:
    """What every call site needs: the tree, the target, and the imports to add."""

    def __init__(self, cst: Any, module: Any, to: str, version: Any, imported: Any,
                 bound: dict[str, tuple[str, int]]) -> None:
        self.cst, self.module, self.to, self.version = cst, module, to, version
        self.imported, self.bound = imported, bound
        self.at = 0  # the index of the top-level statement being ported
        self.once: dict[str, Any] = {}  # what a writer reads of the whole file, read once
        self.needed: dict[str, int] = {}  # target module -> first statement that uses it
        # The variables each constructor call is assigned to (x = ..., self.x = y = ...,
        # x = given or GradScaler()), and each `target = name_or_attribute` (aliases).
        self.assigned: dict[Any, list[str]] = {}
        self.aliases: list[tuple[str, str]] = []
        for node in _walk(cst, module):
            if isinstance(node, cst.Assign):
                targets = [module.code_for_node(t.target) for t in node.targets]
            elif isinstance(node, cst.AnnAssign) and node.value is not None:
                targets = [module.code_for_node(node.target)]
            else:
                continue
            for expr in _branches(cst, node.value):
                self.assigned[expr] = targets
            if isinstance(node.value, (cst.Name, cst.Attribute)):
                self.aliases += [(t, module.code_for_node(node.value)) for t in targets]

    def code(self, node: Any) -> str:
        return self.module.code_for_node(node)

    def scaler(self, node: Any) -> str | None:
        """The NATIVE_SCALERS key of the class ``node`` names through an import, or None."""
        # Sorted: a name bound by two imports (try: ... except ImportError: ...) reads the
        # same in every run.
        return next((_normalise(q) for q in sorted(self.imported(node)) if _normalise(q)), None)

    def prefix(self, target: str) -> str:
        """The name the target module goes by in this file: its import where one comes
        before the statement being ported, else the one added (see add_imports)."""
        module, alias = _IMPORTS[target]
        if module in self.bound and self.bound[module][1] < self.at:
            return self.bound[module][0]
        self.needed[target] = min(self.needed.get(target, self.at), self.at)
        return alias or module

    def add_imports(self, module: Any) -> Any:
        """The module with one ``import`` line per target module it lacks, before the first
        top-level statement that uses it: after the last top-level import above that
        statement (or the docstring), so that a script that builds its scaler before a later
        import still runs; nothing else moves."""
        cst = self.cst
        body = list(module.body)
        # The lowest first: inserting there leaves the indices above it valid.
        for target, first in sorted(self.needed.items(), key=lambda item: -item[1]):
            at = 0
            for index, stmt in enumerate(body[:first]):
                if isinstance(stmt, cst.SimpleStatementLine) and (
                        isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))
                        or index == 0 and isinstance(stmt.body[0], cst.Expr)
                        and isinstance(stmt.body[0].value, cst.SimpleString)):
                    at = index + 1
            name, alias = _IMPORTS[target]
            line = f"import {name} as {alias}\n" if alias else f"import {name}\n"
            body.insert(at, cst.parse_statement(line))
        return module.with_changes(body=body)

    def literal(self, node: Any) -> Any:
        """The value of a literal argument (2**16, -1.0, "cuda", jnp.float32(1024)...)."""
        cst = self.cst
        if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
            return node.evaluated_value
        if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[node.value]
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator,
                                                                (cst.Minus, cst.Plus)):
            value = self.literal(node.expression)
            return -value if isinstance(node.operator, cst.Minus) else value
        if isinstance(node, cst.BinaryOperation):
            ops = {cst.Add: lambda a, b: a + b, cst.Subtract: lambda a, b: a - b,
                   cst.Multiply: lambda a, b: a * b, cst.Divide: lambda a, b: a / b,
                   cst.FloorDivide: lambda a, b: a // b, cst.Power: lambda a, b: a ** b}
            op = ops.get(type(node.operator))
            if op is not None:
                return op(self.literal(node.left), self.literal(node.right))
        if isinstance(node, cst.Call) and len(node.args) == 1 and not node.args[0].keyword:
            cast = next((_CASTS[q] for q in self.imported(node.func) if q in _CASTS), None)
            if cast is None and self.code(node.func) in ("float", "int"):
                cast = {"float": float, "int": int}[self.code(node.func)]
            if cast is not None:
                return cast(self.literal(node.args[0].value))
        raise _NotLiteral
