"""Rewriting the loss-scaler constructors of a Python source file: :func:`port_source`.

Finds every call of a native scaler constructor (torch's ``GradScaler``s, FSDP's
``ShardedGradScaler``, paddle's ``GradScaler`` / ``AmpScaler``, Keras's
``LossScaleOptimizer``, jmp's ``DynamicLossScale`` / ``StaticLossScale``), however it was
imported, and writes the call that builds the same behaviour with unifiedamp or another
framework's native scaler, every value explicit. The semantics are
:func:`~unifiedamp.porting.config_from_call` and :func:`~unifiedamp.porting.native_call`;
this package only reads and writes source, with libcst, which keeps everything outside the
rewritten calls byte for byte (comments and formatting included). Whatever the target cannot
express is a problem, one line per call site; nothing is dropped silently.

This module holds the entry point, the checks a source passes before libcst parses it, and
the pass over the tree; ``_source_read`` resolves names and ``_source_write`` writes the
target's calls. No framework is imported (the source is read, never run), and libcst only
when a source is ported: ``pip install 'unifiedamp[port]'``.
"""

from __future__ import annotations

import difflib
import io
import keyword
import tokenize
from dataclasses import dataclass
from typing import Any

from unifiedamp.porting import _config
from unifiedamp.porting._source_flagged import _patching_wrappers, _static_amp
from unifiedamp.porting._source_flax import _port_flax_loop
from unifiedamp.porting._source_read import (
    CallSite,
    _Context,
    _module_imports,
    _references,
    _walk,
)
from unifiedamp.porting._source_write import _port_call, _port_verb, _verb_of

__all__ = ["CallSite", "PortResult", "TARGETS", "port_source"]

#: What ``to=`` takes.
TARGETS = ("unifiedamp", "torch", "paddle", "keras", "jmp")


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
    _config._check_version(from_version)
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
                flagged = _static_amp(ctx, node)  # Paddle's static graph: no scaler object
                if flagged is not None:
                    flagged.line = positions[node].start.line
                    sites.append(flagged)
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
    # Calls that patch a private method of a scaler (paddle's shard_scaler), once every
    # variable holding a ported scaler is known.
    sites += [s for node in _walk(cst, module) if isinstance(node, cst.Call)
              for s in [_patching_wrappers(ctx, node, positions, scalers)] if s is not None]
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
    flax_sites, flax_replacements = _port_flax_loop(ctx, positions, scalers, sites)
    sites += flax_sites
    replacements.update(flax_replacements)
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
