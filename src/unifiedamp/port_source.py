"""``unifiedamp port``: rewrite the loss-scaler constructors of a Python source file.

Finds every call of a native scaler constructor (torch's ``GradScaler``s, FSDP's
``ShardedGradScaler``, paddle's ``GradScaler`` / ``AmpScaler``, Keras's
``LossScaleOptimizer``, jmp's ``DynamicLossScale`` / ``StaticLossScale``), however it was
imported, and writes the call that builds the same behaviour with unifiedamp or another
framework's native scaler, every value explicit. The semantics are
:func:`unifiedamp.port.config_from_call` and :func:`unifiedamp.port.native_call`; this module
only reads and writes source, with libcst, which keeps everything outside the rewritten calls
byte for byte (comments and formatting included). Whatever the target cannot express is a
problem, one line per call site; nothing is dropped silently.

No framework is imported here (the source is read, never run), and libcst only when a
source is ported: ``pip install 'unifiedamp[port]'``.
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import keyword
import sys
import tokenize
from dataclasses import dataclass, field
from typing import Any

from unifiedamp import _files, port
from unifiedamp.spec import ScalerConfig

__all__ = ["CallSite", "PortResult", "TARGETS", "port_source"]

#: What ``to=`` takes.
TARGETS = ("unifiedamp", "torch", "paddle", "keras", "jmp")

# The module each target's call needs, and the name it is imported as when the file has none.
_IMPORTS = {"unifiedamp": ("unifiedamp", "ua"), "torch": ("torch", None),
            "paddle": ("paddle", None), "keras": ("keras", None), "jmp": ("jmp", None)}

# Calls that hold a literal (jmp's README writes jmp.DynamicLossScale(jnp.float32(2 ** 15))).
_CASTS = {"builtins.float": float, "builtins.int": int, "numpy.float32": float,
          "numpy.float64": float, "jax.numpy.float32": float, "jax.numpy.asarray": float,
          "jax.numpy.array": float, "numpy.asarray": float, "numpy.array": float}

# torch's verb -> paddle's (None: paddle has none). Both sides are exact where named: same
# arguments, same effect. state_dict formats differ: a note (unifiedamp port-state converts).
_TORCH_TO_PADDLE = {
    "scale": "scale", "unscale_": "unscale_", "step": "step", "update": "update",
    "is_enabled": "is_enable", "state_dict": "state_dict", "load_state_dict": "load_state_dict",
    "get_scale": None, "get_growth_factor": "get_incr_ratio", "set_growth_factor": "set_incr_ratio",
    "get_backoff_factor": "get_decr_ratio", "set_backoff_factor": "set_decr_ratio",
    "get_growth_interval": "get_incr_every_n_steps",
    "set_growth_interval": "set_incr_every_n_steps",
}
_PADDLE_TO_TORCH = {v: k for k, v in _TORCH_TO_PADDLE.items() if v}
# paddle verbs torch has no counterpart for; unifiedamp's paddle backend keeps them (under
# the second name).
_PADDLE_ONLY = {"minimize": "minimize", "is_use_dynamic_loss_scaling":
                "is_use_dynamic_loss_scaling", "get_init_loss_scaling": "get_init_loss_scaling",
                "set_init_loss_scaling": "set_init_loss_scaling",
                "get_decr_every_n_nan_or_inf": "get_hysteresis",
                "set_decr_every_n_nan_or_inf": "set_hysteresis"}
_JMP_VERBS = ("scale", "unscale", "adjust")
_USAGE = {
    "keras": "Keras scales inside the optimizer: there is no scale/unscale_/step/update; "
             "the wrapped optimizer's apply() does it all",
    "jmp": "jmp's loss scale is an immutable value: loss_scale.scale(loss), "
           "loss_scale.unscale(grads), jmp.all_finite(grads), loss_scale = "
           "loss_scale.adjust(finite)",
    "torch": "torch's loop: scaler.scale(loss).backward(); scaler.step(opt); scaler.update()",
    "paddle": "paddle's loop: scaler.scale(loss).backward(); scaler.step(opt); "
              "scaler.update() (or scaler.minimize(opt, scaled))",
}


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


@dataclass
class PortResult:
    """What :func:`port_source` did: the new source and one :class:`CallSite` per change.

    Example:
        >>> r = port_source("import torch\\ns = torch.amp.GradScaler('cpu')\\n", "paddle")
        >>> r.ok, r.sites[0].line, r.sites[0].source
        (True, 2, 'torch.amp.GradScaler')
    """

    original: str
    code: str
    target: str
    sites: list[CallSite]

    @property
    def problems(self) -> list[str]:
        """Every problem as ``"line N: ..."``, in source order."""
        return [f"line {s.line}: {p}" for s in self.sites for p in s.problems]

    @property
    def ok(self) -> bool:
        """Whether the target expresses everything (no problem reported)."""
        return not self.problems

    def diff(self, name: str = "<source>") -> str:
        """The change as a unified diff (``a/name`` -> ``b/name``), headed as ``git diff``
        heads it: an absolute ``/x/train.py`` is ``a/x/train.py``, which ``git apply`` and
        ``patch -p1`` run from ``/`` apply (``a//x/train.py`` is an invalid path to git)."""
        path = name.lstrip("/")
        return "".join(difflib.unified_diff(
            self.original.splitlines(keepends=True), self.code.splitlines(keepends=True),
            f"a/{path}", f"b/{path}"))

    def plan(self, name: str = "<source>") -> str:
        """Each call site: line, the call before and after, the config, notes and problems."""
        out = []
        for s in self.sites:
            out.append(f"{name}:{s.line}: {s.kind} {s.source} -> {s.target}")
            out.append(f"  before: {s.before}")
            out.append(f"  after:  {s.after}")
            if s.config:
                out.append("  config: " + ", ".join(f"{k}={v}" for k, v in s.config.items()))
            out += [f"  note: {n}" for n in s.notes]
            out += [f"  PROBLEM: {p}" for p in s.problems]
        count = {kind: sum(s.kind == kind for s in self.sites)
                 for kind in ("constructor", "verb", "reference")}
        out.append(f"{count['constructor']} constructor call(s), {count['verb']} verb call(s), "
                   f"{count['reference']} other mention(s) of a scaler class, "
                   f"{len(self.problems)} problem(s)")
        return "\n".join(out) + "\n"


class _Expr:
    """An argument that is not a literal: kept as its source text."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __repr__(self) -> str:  # config_from_call's notes show it as written
        return self.code


class _NotLiteral(Exception):
    pass


def _cst() -> Any:
    try:
        import libcst
    except ImportError as exc:
        raise ImportError("unifiedamp port rewrites source with libcst: "
                          "pip install 'unifiedamp[port]'") from exc
    return libcst


def port_source(code: str | bytes, to: str, from_version: Any = None,
                filename: str = "<source>") -> PortResult:
    """Rewrites every native scaler constructor in ``code`` for the target ``to``.

    A UTF-8 byte order mark and the file's line endings (``\\r\\n`` included) are kept, and
    an added line ends as the file's lines do.

    Args:
        code: Python source, as text or as UTF-8 bytes.
        to: ``"unifiedamp"`` (``ua.GradScaler(..., backend=<the source's backend>)``),
            ``"torch"``, ``"paddle"``, ``"keras"`` or ``"jmp"``.
        from_version: The source framework's version where its defaults depend on it
            (paddle 2.x or 3.x, tf-keras 2 or Keras 3); default: the installed one.
        filename: Named in a syntax error.

    Returns:
        A :class:`PortResult`: ``code`` is the new source (``code`` unchanged where nothing
        was found), ``sites`` the plan, ``problems`` what needs a human.

    Raises:
        SyntaxError: ``code`` does not parse, is not UTF-8, holds a NUL byte, or nests
            deeper than port reads (more than 200 brackets, which Python refuses too, or
            1000 levels: libcst's parser would overflow the stack and crash).
        ValueError: ``to`` is not a target, or ``from_version`` not a version number.

    Example:
        >>> src = '''import torch
        ... scaler = torch.amp.GradScaler("cuda", 1024.0)  # keep this comment
        ... '''
        >>> r = port_source(src, "paddle")
        >>> print(r.code)  # doctest: +NORMALIZE_WHITESPACE
        import torch
        import paddle
        scaler = paddle.amp.GradScaler(enable=True, init_loss_scaling=1024.0, incr_ratio=2.0,
            decr_ratio=0.5, incr_every_n_steps=2000, decr_every_n_nan_or_inf=1,
            use_dynamic_loss_scaling=True)  # keep this comment
        >>> r.ok
        True
    """
    if to not in TARGETS:
        raise ValueError(f"to must be one of {', '.join(TARGETS)}, got {to!r}")
    port._check_version(from_version)
    if isinstance(code, bytes):
        code = _decode(code, filename)
    bom = "\ufeff" if code.startswith("\ufeff") else ""  # libcst drops it
    depth, line = _check_source(code[len(bom):], filename)
    cst = _cst()
    try:
        result = _port(cst, code[len(bom):], to, from_version, filename)
    except RecursionError:
        # libcst's visitors recurse in Python: a RecursionError, which leaves nothing behind.
        raise SyntaxError(f"nested {depth} levels deep: too deep for port to read within "
                          "Python's recursion limit", (filename, line, None, None)) from None
    result.original, result.code = bom + result.original, bom + result.code
    return result


def _decode(data: bytes, filename: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SyntaxError(f"not UTF-8 text (byte 0x{data[exc.start]:02x}): port reads Python "
                          "source encoded as UTF-8; convert it first (iconv -t UTF-8)",
                          (filename, line, None, None)) from None


_MAX_BRACKETS = 200  # CPython's own limit (its tokenizer refuses more)
_MAX_DEPTH = 1000  # libcst's parser crashes from about 1500 brackets or 3500 lambdas
_SEPARATORS = frozenset({",", ";", "=", "+=", "-=", "*=", "/=", "//=", "%=", "@=", "&=", "|=",
                         "^=", ">>=", "<<=", "**="})
_NOT_COUNTED = frozenset({":", "->", ")", "]", "}"})
_STRINGS = {tokenize.STRING, getattr(tokenize, "FSTRING_START", tokenize.STRING)}


def _check_source(code: str, filename: str) -> tuple[int, int]:
    """Refuses what libcst's native parser must not see: a NUL byte, and nesting deep
    enough to overflow its stack (it recurses without a limit: a segfault, not an error).
    Returns the nesting depth and its line, for a later RecursionError's message."""
    nul = code.find("\0")
    if nul >= 0:
        raise SyntaxError("a NUL byte: not Python source",
                          (filename, code.count("\n", 0, nul) + 1, None, None))
    (brackets, at), (depth, line) = _nesting(code)
    if brackets > _MAX_BRACKETS:
        raise SyntaxError(f"{brackets} nested brackets (Python allows at most {_MAX_BRACKETS})",
                          (filename, at, None, None))
    if depth > _MAX_DEPTH:
        raise SyntaxError(f"nested {depth} levels deep (port reads at most {_MAX_DEPTH})",
                          (filename, line, None, None))
    return depth, line


def _nesting(code: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((brackets, line), (depth, line))``: the deepest bracket nesting, and a bound on how
    deep the syntax tree nests, with their lines, read with the tokenize module (Python,
    no recursion).

    The bound: a path down an expression's tree passes, at each bracket level, through at
    most the operators, keywords and strings of one comma-separated segment, and into one
    bracket; a statement adds its indentation, an ``elif`` its place in the chain.

    Example:
        >>> _nesting("x = [-1, -2, -3]\\nif a:\\n    y = not not f(g(1))\\n")
        ((2, 3), (5, 3))
    """
    brackets, deepest = (0, 1), (0, 1)
    indent, first, start, chain = 0, True, 1, 0
    elifs: dict[int, int] = {}  # indentation -> length of the if/elif chain there
    # Per open bracket: [counted tokens in the segment, deepest bracket in it, deepest
    # segment so far, inside a lambda's parameters].
    levels: list[list[Any]] = [[0, 0, 0, False]]

    def fold(level: list[Any]) -> int:
        return max(level[2], level[0] + level[1])

    def close() -> None:
        inner = fold(levels.pop())
        levels[-1][1] = max(levels[-1][1], inner)

    def end() -> None:
        nonlocal deepest, levels, first
        while len(levels) > 1:
            close()
        depth = indent + chain + fold(levels[0])
        if depth > deepest[0]:
            deepest = (depth, start)
        levels, first = [[0, 0, 0, False]], True

    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            kind, text = tok.type, tok.string
            if kind == tokenize.INDENT:
                indent += 1
            elif kind == tokenize.DEDENT:
                indent -= 1
            elif kind == tokenize.NEWLINE:
                end()
            elif kind not in (tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
                if first:
                    first, start = False, tok.start[0]
                    elifs[indent] = elifs.get(indent, 0) + 1 if text == "elif" else 0
                    chain = elifs[indent]
                level = levels[-1]
                if kind == tokenize.OP and text in "([{":
                    level[0] += 1
                    levels.append([0, 0, 0, False])
                    if len(levels) - 1 > brackets[0]:
                        brackets = (len(levels) - 1, tok.start[0])
                elif kind == tokenize.OP and text in ")]}" and len(levels) > 1:
                    close()
                elif kind == tokenize.OP and text in _SEPARATORS and not level[3]:
                    level[0], level[1], level[2] = 0, 0, fold(level)
                elif text == ":" and level[3]:
                    level[3] = False
                elif (kind == tokenize.OP and text not in _NOT_COUNTED) or kind in _STRINGS \
                        or (kind == tokenize.NAME and keyword.iskeyword(text)):
                    level[0] += 1
                    level[3] = level[3] or text == "lambda"
    except (tokenize.TokenError, SyntaxError):
        # The parser reports the error. Python 3.12's tokenize module (the C tokenizer) stops
        # at 200 nested brackets, libcst's does not: count the brackets of the whole text.
        brackets = max(brackets, _raw_brackets(code))
    end()
    return brackets, deepest


def _raw_brackets(code: str) -> tuple[int, int]:
    """The deepest nesting of bracket characters anywhere in ``code`` (strings and comments
    included: a bound for text the tokenizer did not read), and its line."""
    depth, deepest, line = 0, (0, 1), 1
    for char in code:
        if char in "([{":
            depth += 1
            if depth > deepest[0]:
                deepest = (depth, line)
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif char == "\n":
            line += 1
    return deepest


def _port(cst: Any, code: str, to: str, from_version: Any, filename: str) -> PortResult:
    from libcst.metadata import (
        MetadataWrapper,
        PositionProvider,
        QualifiedNameProvider,
        QualifiedNameSource,
    )

    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError as exc:
        raise SyntaxError(f"cannot parse: {exc.message}",
                          (filename, exc.raw_line, exc.raw_column + 1, None)) from None
    wrapper = MetadataWrapper(module)
    qualnames = wrapper.resolve(QualifiedNameProvider)
    positions = wrapper.resolve(PositionProvider)
    module = wrapper.module  # the nodes the metadata is keyed on

    def imported(node: Any) -> set[str]:
        names = qualnames.get(node, ())
        names = names() if callable(names) else names  # libcst computes them lazily
        return {q.name for q in names if q.source == QualifiedNameSource.IMPORT}

    ctx = _Context(cst, module, to, from_version, imported, _module_imports(cst, module))
    replacements: dict[Any, Any] = {}
    scalers: dict[str, tuple[str, bool]] = {}  # variable -> (source qualname, rewritten)
    sites: list[CallSite] = []
    site: CallSite | None  # the verbs' may be None
    for index, stmt in enumerate(module.body):
        ctx.at = index  # an import the call needs must come before this statement
        for node in _walk(cst, stmt):
            if not isinstance(node, cst.Call):
                continue
            name = ctx.scaler(node.func)
            if name is None:
                continue
            site, new = _port_call(ctx, node, name)
            site.line = positions[node].start.line
            sites.append(site)
            if new is not None:
                replacements[node] = new
            for variable in ctx.assigned.get(node, ()):
                scalers[variable] = (name, new is not None)
    _follow_aliases(ctx.aliases, scalers)
    sites += _references(ctx, positions)
    for node in _walk(cst, module):
        verb = _verb_of(cst, module, node, scalers)
        if verb is None:
            continue
        variable, method = verb
        source, rewritten = scalers[variable]
        site, new_name = _port_verb(ctx, node, source, method)
        if site is None or not rewritten:
            continue  # not a verb that changes, or its constructor stayed: so does the verb
        site.line = positions[node].start.line
        if new_name and new_name != method:
            replacements[node] = node.with_changes(
                func=node.func.with_changes(attr=cst.Name(new_name)))
            site.after = module.code_for_node(replacements[node])
        sites.append(site)
    sites.sort(key=lambda s: s.line)
    if replacements:
        module = module.visit(_Replace(cst, replacements))
        module = ctx.add_imports(module)
    return PortResult(code, module.code, to, sites)


def _Replace(cst: Any, replacements: dict[Any, Any]) -> Any:
    # libcst is imported only when a source is ported, so the transformer class is made here.
    class Replace(cst.CSTTransformer):
        def on_leave(self, original: Any, updated: Any) -> Any:
            return replacements.get(original, updated)

    return Replace()


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


def _follow_aliases(aliases: list[tuple[str, str]], scalers: dict[str, tuple[str, bool]]
                    ) -> None:
    """Adds each variable a scaler variable is assigned to (``self.s = s``, ``t = self.s``),
    until none is new: its verbs are the scaler's."""
    changed = True
    while changed:
        changed = False
        for target, value in aliases:
            if value in scalers and target not in scalers:
                scalers[target] = scalers[value]
                changed = True


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
            framework = port.NATIVE_SCALERS[name]["framework"]
            site(node, name, f"{name}{where} is used here as a value, not called: port cannot "
                             "follow it to the call that builds the scaler, and this line keeps "
                             f"meaning {framework}'s class; port that code by hand")
    for local, (name, line) in reexports.items():
        if local not in used and name not in _STAYS[ctx.to]:
            sites.append(CallSite(line, "reference", name, ctx.to, local, local, problems=[
                f"imports {name} and never uses it here: port cannot follow it to the files "
                "that import it from here (a re-export?); port those files"]))
    return sites


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
    name = port._QUALNAMES.get(qualname, qualname) if "." in qualname else qualname
    if name.startswith("tensorflow.keras."):  # `import tensorflow as tf`: tf.keras...
        name = port._QUALNAMES.get(name, name)
    if name in port.NATIVE_SCALERS and not name.startswith("unifiedamp"):
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


# ------------------------------------------------------------------ constructors


def _port_call(ctx: _Context, node: Any, name: str) -> tuple[CallSite, Any]:
    """The plan for one constructor call, and the call node to put in its place (or None)."""
    site = CallSite(0, "constructor", name, name, ctx.code(node), ctx.code(node))
    args, kwargs = [], {}
    for arg in node.args:
        if arg.star:
            site.problems.append(f"{ctx.code(arg)}: arguments unpacked at run time cannot be "
                                 "read from the source; write them out")
            return site, None
        try:
            value = ctx.literal(arg.value)
        except (_NotLiteral, ArithmeticError, TypeError, ValueError):
            value = _Expr(ctx.code(arg.value))
        if arg.keyword is None:
            args.append(value)
        else:
            kwargs[arg.keyword.value] = value
    try:
        # The private helpers bind as config_from_call does, to know which parameter each
        # non-literal argument is.
        row = port._spec(port.NATIVE_SCALERS[name],
                         port._version(name, port.NATIVE_SCALERS[name], ctx.version)[0])
        bound = port._bind(name, row, tuple(args), kwargs)
        exprs, values = _placeholders(row, bound)
        config, notes = port.config_from_call(name, (), values, version=ctx.version)
    except (TypeError, ValueError) as exc:
        site.problems.append(f"{exc}: left as it is")
        return site, None
    site.notes += notes
    site.config = {k: exprs[k].code if k in exprs else repr(v)
                   for k, v in config.to_dict().items()}
    callee, kwargs_text, extra = _target_call(ctx, site, node, row, bound, config, exprs)
    text = f"{callee}({', '.join(kwargs_text)}){extra}"
    new = ctx.cst.parse_expression(text)
    # Keep the call's own parentheses and whitespace around it.
    new = new.with_changes(lpar=node.lpar, rpar=node.rpar)
    site.after = ctx.code(new)
    return site, new


def _placeholders(row: dict[str, Any], bound: dict[str, Any]) -> tuple[dict[str, _Expr],
                                                                          dict[str, Any]]:
    """Non-literal canonical arguments by canonical name, and the values to read a config
    from: each non-literal stands in as the default (the config then holds it as written)."""
    exprs, values = {}, {}
    defaults = ScalerConfig().to_dict()
    for param, value in bound.items():
        canonical = "factor" if param == "factor" else row["names"].get(param)
        if isinstance(value, _Expr) and canonical is not None:
            exprs[canonical] = value
            default = row["defaults"].get(param)
            value = default if default != port._REQUIRED else defaults[canonical]
        values[param] = value
    return exprs, values


def _fmt(value: Any) -> str:
    if isinstance(value, _Expr):
        return value.code
    if isinstance(value, str):
        return json.dumps(value)  # "cuda", as torch's documentation writes it
    return repr(value)


def _target_call(ctx: _Context, site: CallSite, node: Any, row: dict[str, Any],
                 bound: dict[str, Any], config: ScalerConfig,
                 exprs: dict[str, _Expr]) -> tuple[str, list[str], str]:
    """The callee, its arguments as text, and what follows the call (``.wrap(...)``)."""
    framework, to, name = row["framework"], ctx.to, site.source
    inner = bound.get("inner_optimizer")  # Keras's: the optimizer the scaler wraps
    leading: list[str] = []  # positional arguments with no canonical meaning
    extras: dict[str, Any] = {}  # keyword arguments with no canonical meaning
    carried: set[str] = set()  # the source's arguments with no canonical meaning, kept
    extra = ""
    if to == "unifiedamp" or (to == "keras" and inner is None):
        # Keras's class needs the optimizer it wraps: without one, unifiedamp's keras
        # backend holds the scaler until wrap(optimizer).
        qualname = "unifiedamp.GradScaler"
        callee = f"{ctx.prefix('unifiedamp')}.GradScaler"
        kwargs, problems = port.native_call(config, "unifiedamp")
        site.problems += problems
        if framework == "torch" and to == "unifiedamp":  # the torch backend takes both
            extras.update({p: bound[p] for p in ("device", "process_group") if p in bound})
            site.notes += _cuda_note(name, bound)
        extras["backend"] = row["backend"] if to == "unifiedamp" else "keras"
        if inner is not None:
            extra = f".wrap({_fmt(inner)})"
            carried.add("inner_optimizer")
            site.notes.append("a Keras LossScaleOptimizer is an optimizer: "
                              f"ua.GradScaler(..., backend='keras').wrap({_fmt(inner)}) is the "
                              "optimizer that replaces it")
        if to == "keras":
            native, problems = port.native_call(config, "keras")
            site.problems.append(
                f"keras.optimizers.LossScaleOptimizer wraps an optimizer, and a {framework} "
                "scaler has none: wrote ua.GradScaler(..., backend='keras'); call "
                "scaler.wrap(optimizer) and train with the optimizer it returns (Keras's own "
                "class: keras.optimizers.LossScaleOptimizer(optimizer, "
                + ", ".join(f"{k}={_fmt(v)}" for k, v in native.items()) + "))")
            site.problems += problems
    else:
        qualname = {"torch": "torch.amp.GradScaler", "paddle": "paddle.amp.GradScaler",
                    "keras": "keras.optimizers.LossScaleOptimizer",
                    "jmp": "jmp.DynamicLossScale"}[to]
        if to == "torch" and name.endswith("ShardedGradScaler"):
            qualname = name  # FSDP's scaler stays FSDP's: it agrees on found_inf across ranks
            if "process_group" in bound:
                extras["process_group"] = bound["process_group"]
        if to == "jmp" and not config.dynamic:
            qualname = "jmp.StaticLossScale"
        kwargs, problems = port.native_call(config, qualname)
        site.problems += problems
        if qualname == name:
            callee = ctx.code(node.func)  # the same class: as the file spells it
        else:
            module, _, rest = qualname.partition(".")
            callee = f"{ctx.prefix(module)}.{rest}"
        if to == "torch":
            # The device is kept as written; without one, torch's own default "cuda".
            leading.append(_fmt(bound.get("device", "cuda")))
            if name == "torch.cuda.amp.GradScaler":
                site.notes.append('device "cuda": torch.cuda.amp.GradScaler is CUDA\'s')
            elif "device" not in bound:
                site.notes.append('device "cuda": torch.amp.GradScaler\'s default; torch '
                                  'disables the scaler where CUDA is not available: write "cpu" '
                                  "or another device there")
        if to == "keras":
            leading.append(_fmt(inner))
        _usage_problem(site, framework, to)
    carried |= set(extras)
    if to == "torch":
        carried.add("device")
    if to == "keras" and inner is not None:
        carried.add("inner_optimizer")
    # A parameter with no canonical meaning that the target class of the same framework
    # takes too (jmp's counter, Keras's name) keeps its value.
    target_row = port.NATIVE_SCALERS[qualname]
    if target_row["framework"] == framework:
        target_row = port._spec(target_row, sorted(target_row["versions"], key=int)[-1])
        shared = (*target_row["params"], *target_row.get("keyword_only", ()))
        for param, value in bound.items():
            if row["names"].get(param) is None and param not in carried and param in shared:
                extras[param] = value
                carried.add(param)
    for param, value in bound.items():
        if row["names"].get(param) is None and param != "factor" and param not in carried:
            site.notes.append(f"dropped {param}={_fmt(value)}: {qualname} has no such "
                              "parameter")
    kwargs = _keep_expressions(site, qualname, kwargs, exprs)
    site.target = qualname
    text = leading + [f"{k}={_fmt(v)}" for k, v in {**kwargs, **extras}.items()]
    return callee, text, extra


def _cuda_note(name: str, bound: dict[str, Any]) -> list[str]:
    """torch disables its scaler where CUDA is not available; unifiedamp's does not."""
    device = bound.get("device")
    enabled = bound.get("enabled", True)
    if enabled is False:
        return []  # off everywhere, before and after
    text = _fmt(enabled)
    if not (text.isidentifier() or _grouped(text)):
        text = f"({text})"
    keep = ("enabled=torch.cuda.is_available()" if enabled is True
            else f"enabled={text} and torch.cuda.is_available()")
    if name == "torch.cuda.amp.GradScaler" or device is None:
        what = name if name == "torch.cuda.amp.GradScaler" else f'{name}\'s default device "cuda"'
        return [f"{what} disables the scaler where CUDA is not available (a CPU-only run "
                "trains unscaled); ua.GradScaler without device= scales on the parameters' "
                f"device, the CPU included: write {keep} to keep the original behaviour"]
    if isinstance(device, str) and device.startswith("cuda"):
        return [f'device="{device}": where CUDA is not available torch disables its scaler, '
                f"unifiedamp's raises (naming the fix): write {keep} to keep the original "
                "behaviour"]
    return []


def _grouped(text: str) -> bool:
    """Whether ``text`` is one parenthesised group, ``(a == b)`` (not ``(a) or (b)``)."""
    depth = 0
    for index, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth == 0 and index < len(text) - 1:
            return False
    return text.startswith("(")


def _usage_problem(site: CallSite, framework: str, to: str) -> None:
    # An imperative scaler, a Keras optimizer and a jmp value are used differently: the
    # constructor alone does not port the training loop.
    kinds = {"torch": "imperative", "paddle": "imperative", "keras": "keras", "jmp": "jmp"}
    if kinds[framework] != kinds[to]:
        site.problems.append(f"a {framework} scaler is used differently from a {to} one: "
                             f"port the training loop too ({_USAGE[to]})")


def _keep_expressions(site: CallSite, qualname: str, kwargs: dict[str, Any],
                      exprs: dict[str, _Expr]) -> dict[str, Any]:
    """Puts each non-literal argument back where the target has a parameter of the same
    meaning; reports the others (their value is unknown, so the port cannot be checked)."""
    names = port.NATIVE_SCALERS[qualname]
    row = port._spec(names, sorted(names["versions"], key=int)[-1])
    by_canonical = {canonical: param for param, canonical in row["names"].items()}
    out = dict(kwargs)
    for canonical, expr in exprs.items():
        param = by_canonical.get(canonical)
        if canonical == "factor" and "factor" in out:
            param = "factor"
        if param is None or param not in out or (canonical in ("growth_factor",
                                                               "backoff_factor")
                                                 and "factor" in out):
            site.problems.append(f"{canonical if canonical != 'factor' else 'factor'}="
                                 f"{expr.code} is not a literal, and {qualname} has no "
                                 "parameter of the same meaning: write the value")
            continue
        out[param] = expr
    return out


# ------------------------------------------------------------------ verbs


def _verb_of(cst: Any, module: Any, node: Any,
             scalers: dict[str, tuple[str, bool]]) -> tuple[str, str] | None:
    """``(variable, method)`` when ``node`` is a method call on a ported scaler variable."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return None
    variable = module.code_for_node(node.func.value)
    if variable not in scalers:
        return None
    return variable, node.func.attr.value


def _verb_name(framework: str, method: str, to: str) -> str | None:
    """A torch or paddle scaler method's name in the target (None: no counterpart)."""
    if framework == "paddle" and method in _PADDLE_ONLY:
        return {"paddle": method, "unifiedamp": _PADDLE_ONLY[method]}.get(to)
    canonical = method if framework == "torch" else _PADDLE_TO_TORCH[method]
    if to in ("torch", "unifiedamp"):  # unifiedamp's torch and paddle backends: torch's verbs
        return canonical
    if to == "paddle":
        return _TORCH_TO_PADDLE[canonical]
    return None  # Keras and jmp have no scaler verbs


def _port_verb(ctx: _Context, node: Any, source: str,
               method: str) -> tuple[CallSite | None, str | None]:
    """The plan for one method call on a scaler (None: not a scaler verb), and the
    method's new name (None: it has none)."""
    framework = port.NATIVE_SCALERS[source]["framework"]
    to = ctx.to
    text = ctx.code(node)
    site = CallSite(0, "verb", f"{source}.{method}", to, text, text)
    if framework == "keras":
        return None, None  # an optimizer's methods: the replacing optimizer has them too
    if framework == "jmp":
        if method not in _JMP_VERBS or to == "jmp":
            return None, None
        if to != "unifiedamp":
            site.problems.append(f"jmp's {method}() has no {to} counterpart: {_USAGE[to]}")
            return site, None
        if method == "unscale":
            site.problems.append("unscale(grads) returns (grads, finite) in unifiedamp "
                                 "(jmp: grads): unpack it")
            return site, None
        new: str | None = {"scale": "scale", "adjust": "update"}[method]
        if new != method:
            site.notes.append(f"jmp's {method}(finite) is unifiedamp's {new}(finite): both "
                              "return the new scaler")
        return site, new
    verbs = _TORCH_TO_PADDLE if framework == "torch" else {**_PADDLE_TO_TORCH, **_PADDLE_ONLY}
    if method not in verbs or framework == to:
        return None, None  # not a scaler verb, or the same framework's verbs
    new = _verb_name(framework, method, to)
    if new is None:
        usage = _USAGE[to] if to in ("keras", "jmp") else f"{_USAGE[to]}; or keep unifiedamp's " \
            f"{framework} backend (--to unifiedamp), which has it"
        site.problems.append(f"{method}() has no {to} counterpart: {usage}")
        return site, None
    if method == "update" and node.args and to == "paddle":
        site.problems.append("update(new_scale): paddle's update() takes no argument; "
                             "set the scale another way")
        return site, None
    if method in ("state_dict", "load_state_dict") and to != "unifiedamp":
        site.notes.append(f"{method}(): a {to} state dict's format differs from {framework}'s: "
                          "convert checkpoints with `unifiedamp port-state`")
    site.notes.append(f"{method}() is {new}() in {to}" if new != method
                      else f"{method}(): the same in {to}")
    return site, new


# ------------------------------------------------------------------ command line


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp port`` to the ``unifiedamp`` parser."""
    p = sub.add_parser(
        "port", help="rewrite a source file's loss-scaler constructors for another framework",
        description="Rewrites every native loss-scaler constructor (torch, paddle, Keras, jmp) "
                    "in a Python file for unifiedamp or another framework's native scaler, "
                    "every value explicit, and the scaler's method calls where the mapping is "
                    "exact. Everything else in the file is kept byte for byte.",
        epilog="exit status: 0 when the target expresses everything (also for a file with no "
               "scaler at all: a note says so); 1 when a problem was reported (one line per "
               "problem, on stderr, or in the --check plan), a scaler class port cannot follow "
               "to the call that builds it included (used as a value, as in scaler_type = "
               "GradScaler; looked up with getattr; imported and never used); 2 for an "
               "error that stops it, with nothing written (a file that does not exist, is not "
               "UTF-8 Python source, does not parse or nests too deeply; a bad --from-version; "
               "-o into a missing folder or onto a directory; a write that fails: the target "
               "is left as it was). Writes go to a temp file renamed over the target.")
    p.add_argument("file", help="the Python file, or - for standard input")
    p.add_argument("--to", required=True, choices=TARGETS, help="the target")
    p.add_argument("--from-version", metavar="V", default=None, type=_version_arg,
                   help="the source framework's version where its defaults depend on it "
                        "(paddle 2.x: 32768 / 1000 / 2, 3.x: 65536 / 2000 / 1; tf-keras 2 or "
                        "Keras 3); default: the installed one")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="print the plan (each call site, before and after, notes and "
                           "problems); write nothing")
    mode.add_argument("--diff", action="store_true", help="print a unified diff")
    mode.add_argument("-o", "--output", metavar="OUT", help="write the result to OUT")
    mode.add_argument("--in-place", action="store_true", help="rewrite FILE itself")
    p.set_defaults(func=_cmd_port)


def _version_arg(value: str) -> str:
    try:
        port._check_version(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _emit(text: str) -> None:
    """Writes ``text`` to stdout as UTF-8 bytes: a BOM and ``\\r\\n`` as they are."""
    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write(text.encode("utf-8"))
        out.flush()


def _error(message: str) -> int:
    print(f"unifiedamp port: {message}", file=sys.stderr)
    return 2


def _cmd_port(args: argparse.Namespace) -> int:
    name = "<stdin>" if args.file == "-" else args.file
    if args.in_place and args.file == "-":
        return _error("--in-place needs a file, not -")
    try:
        if args.file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as f:
                data = f.read()
        result = port_source(data, args.to, args.from_version, filename=name)
    except OSError as exc:
        return _error(f"{name}: {exc.strerror or exc}")
    except SyntaxError as exc:
        where = ":".join(str(p) for p in (name, exc.lineno, exc.offset) if p is not None)
        return _error(f"{where}: {exc.msg}")
    except ImportError as exc:
        return _error(str(exc))
    if args.check:
        _emit(result.plan(name))
        return 0 if result.ok else 1
    if args.diff:
        _emit(result.diff(name))
    elif args.output or args.in_place:
        target = args.output or args.file
        try:
            _files.write_bytes(target, result.code.encode("utf-8"))
        except OSError as exc:
            # A missing folder or a directory (the message names it), or a failed write
            # (a full disk, a file-size limit): the target is as it was.
            return _error(str(exc) if exc.strerror is None else
                          f"cannot write {target}: {exc.strerror} (nothing was written)")
    else:
        _emit(result.code)
    if not any(s.kind == "constructor" for s in result.sites):
        print(f"{name}: no native loss-scaler constructor call found", file=sys.stderr)
    for problem in result.problems:
        print(f"{name}:{problem.removeprefix('line ').replace(': ', ': problem: ', 1)}",
              file=sys.stderr)
    return 0 if result.ok else 1
