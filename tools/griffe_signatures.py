"""A griffe extension for the API reference (mkdocs.yml): the scalers' real constructors.

A backend's scaler takes ``__init__(self, *args, **kwargs)`` and reads its config from
them (``unifiedamp.spec.config_from_args``), so static analysis would show the reference
``JaxGradScaler(*args, **kwargs)``. At run time ``inspect.signature`` and ``help()`` show
``unifiedamp._scaler._constructor_signature``: the spec's five positional parameters, its
keyword-only ones, the class's own options, then ``**aliases``. This extension gives each
subclass of ``unifiedamp.GradScaler`` that signature, built the same way from the spec's
names and the class's ``__init__`` as written. The docstring's ``*args:`` entry, which the
signature now spells out, becomes a sentence before ``Args:``, and ``**kwargs:`` is named
``**aliases:`` as in the signature.

A member a backend overrides without a docstring (``config``, torch's ``get_growth_factor``)
takes the docstring of the member it overrides, so that the reference lists every member
users call, each with its description; ``GradScaler``'s class attributes take their ``#:``
comment as docstring.

JAX's and MLX's diagnostics functions (``overflow_report``...), which
``public_functions(...)`` makes at import time, become functions with the signature and
docstring they have at run time (see the comment above :func:`_diagnostics_functions`).
"""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

import griffe

from unifiedamp.spec._config import CANONICAL, POSITIONAL, ScalerConfig

_BASE = "unifiedamp._scaler.GradScaler"
# An Args entry and its more indented continuation lines (docstrings are dedented).
_ARGS_ENTRY = re.compile(r"^( +)\*args: *(.*(?:\n\1 +\S.*)*)\n", re.M)
_KWARGS_ENTRY = re.compile(r"^( +)\*\*kwargs:", re.M)


def docstring(text: str) -> str:
    r"""The docstring ``text`` of a scaler class, for the signature :func:`constructor` gives.

    Example:
        >>> print(docstring("A scaler.\n\nArgs:\n    *args: ``a, b``,\n        or ``b``.\n"
        ...                 "    **kwargs: The others.\n"))
        A scaler.
        <BLANKLINE>
        Positionally: ``a, b``, or ``b``.
        <BLANKLINE>
        Args:
            **aliases: The others.
        <BLANKLINE>
    """
    entry = _ARGS_ENTRY.search(text)
    if entry:
        said = " ".join(line.strip() for line in entry[2].splitlines())
        text = text[:entry.start()] + text[entry.end():]
        text = text.replace("\nArgs:\n", f"\nPositionally: {said}\n\nArgs:\n", 1)
    return _KWARGS_ENTRY.sub(r"\1**aliases:", text)


def _param(name: str, kind: griffe.ParameterKind, default: Any) -> griffe.Parameter:
    return griffe.Parameter(name, kind=kind, annotation=ScalerConfig.__annotations__[name],
                            default=repr(default))


def constructor(init: griffe.Function) -> list[griffe.Parameter]:
    """The parameters a scaler class whose ``__init__`` is ``init`` really takes."""
    kind = griffe.ParameterKind
    defaults = ScalerConfig()
    params = [init.parameters[0]]  # self
    params += [_param(name, kind.positional_or_keyword, getattr(defaults, name))
               for name in POSITIONAL]
    params += [_param(name, kind.keyword_only, getattr(defaults, name))
               for name in CANONICAL if name not in POSITIONAL]
    params += [p for p in init.parameters
               if p.kind is kind.keyword_only and p.name not in CANONICAL]
    params.append(griffe.Parameter("aliases", kind=kind.var_keyword, annotation="Any",
                                   default="{}"))
    return params


def _is_scaler(cls: griffe.Class) -> bool:
    try:
        return any(base.path == _BASE for base in cls.mro())
    except (griffe.AliasResolutionError, griffe.CyclicAliasError, ValueError):
        return False


class ScalerSignatures(griffe.Extension):
    """Gives each scaler class an ``__init__`` with the parameters it really takes, and its
    undocumented overrides and class attributes the description they have in the source."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        if pkg.path == "unifiedamp":
            _diagnostics_functions(pkg, loader)
            scalers = _scalers(pkg)
            for cls in [pkg[_BASE.removeprefix("unifiedamp.")], *scalers]:
                _attribute_docstrings(cls)
            # Each class's __init__ as written before any is replaced: a subclass that
            # inherits __init__ would otherwise meet its base's replacement.
            inits = {cls: _written(cls.all_members.get("__init__")) for cls in scalers}
            for cls in inits:
                _inherit_docstrings(cls)
            for cls, init in inits.items():
                if init is not None and init.is_function:
                    _fix(cls, init)


def _written(member: Any) -> Any:
    # An inherited member is an alias of the base's, resolved when read: read it now.
    return member.final_target if member is not None and member.is_alias else member


def _scalers(module: griffe.Module) -> list[griffe.Class]:
    found = []
    for member in module.members.values():
        if member.is_alias:
            continue
        if member.is_module:
            found += _scalers(member)
        elif member.is_class and _is_scaler(member):
            found.append(member)
    return found


def _fix(cls: griffe.Class, init: griffe.Function) -> None:
    if not any(p.kind is griffe.ParameterKind.var_positional for p in init.parameters):
        return
    if cls.docstring is not None:
        cls.docstring.value = docstring(cls.docstring.value)
    cls.set_member("__init__", griffe.Function(
        "__init__", lineno=init.lineno, endlineno=init.endlineno,
        parameters=griffe.Parameters(*constructor(init)),
        docstring=init.docstring, parent=cls))


def _attribute_docstrings(cls: griffe.Class) -> None:
    # A class attribute's docstring: its entry in the class's Attributes: section, or the
    # #: comment above it.
    described = {}
    if cls.docstring is not None:
        for section in griffe.parse_google(cls.docstring):
            if section.kind is griffe.DocstringSectionKind.attributes:
                described.update({item.name: item.description for item in section.value})
    lines = cls.module.lines
    for name, member in cls.members.items():
        if member.is_alias or not member.is_attribute or member.docstring is not None:
            continue
        if name in described:
            member.docstring = griffe.Docstring(described[name], lineno=member.lineno,
                                                parent=member)
            continue
        above: list[str] = []
        for line in reversed(lines[:member.lineno - 1]):
            if not line.strip().startswith("#:"):
                break
            above.insert(0, line.strip()[2:].strip())
        if above:
            text = _ROLE.sub(r"`\1`", " ".join(above))
            member.docstring = griffe.Docstring(text, lineno=member.lineno, parent=member)


# :data:`~pkg.NAME` -> `pkg.NAME`, as tools/griffe_docstrings.py reads docstrings' roles.
_ROLE = re.compile(r":\w+:`~?([^`]+)`")


def _inherit_docstrings(cls: griffe.Class) -> None:
    for name, member in cls.members.items():
        if name.startswith("_") or member.is_alias or member.docstring is not None:
            continue
        for base in cls.mro():
            written = _written(base.members.get(name))
            if written is not None and written.docstring is not None:
                member.docstring = griffe.Docstring(written.docstring.value,
                                                    lineno=member.lineno, parent=member)
                break


# ------------------------------------------------ the functional backends' diagnostics
#
# The JAX and MLX backends bind their six diagnostics functions at import time:
#
#     (overflow_report, ..., check_collapse) = public_functions(JaxGradScaler, words=Words(...))
#
# (unifiedamp.backends._functional_diagnostics), which names the inner functions it defines,
# annotates their ``scaler`` parameter with the backend's class and formats their docstrings
# from templates (``_OVERFLOW_REPORT``...) with the backend's words. Static analysis sees
# neither the inner functions nor the tuple's names, so the reference would show nothing
# for them (and it imports no framework, so it cannot ask the functions themselves). The
# extension does what ``public_functions`` does, from the source: each name of such an
# assignment becomes a function with the signature of its inner function and the docstring
# its template formats, the ``Words(...)`` keywords being literals in the backend's module.

_FUNCTIONAL = "unifiedamp.backends._functional_diagnostics"
_BACKENDS_WITH_DIAGNOSTICS = ("unifiedamp.backends.jax._diagnostics", "unifiedamp.backends.mlx")


class _PublicFunctions:
    """What ``public_functions`` defines, read from its module's source: each public name's
    inner function (an ``ast.FunctionDef``) and docstring template."""

    def __init__(self, module: griffe.Module) -> None:
        self.module = module
        tree = ast.parse(module.source)
        self.templates = {node.targets[0].id: ast.literal_eval(node.value)
                          for node in tree.body if isinstance(node, ast.Assign)
                          and isinstance(node.targets[0], ast.Name)
                          and node.targets[0].id.isupper()}
        outer = next(node for node in tree.body
                     if isinstance(node, ast.FunctionDef) and node.name == "public_functions")
        inner = {node.name: node for node in outer.body if isinstance(node, ast.FunctionDef)}
        # functions = ((overflow_report, _OVERFLOW_REPORT), (history_init_, ...), ...)
        pairs = next(node.value for node in outer.body if isinstance(node, ast.Assign)
                     and getattr(node.targets[0], "id", None) == "functions")
        self.defs = {}  # public name -> (inner function, template)
        for pair in pairs.elts:  # type: ignore[attr-defined]
            function, template = pair.elts
            self.defs[function.id.rstrip("_")] = (inner[function.id], template.id)

    def function(self, name: str, backend: str, words: dict[str, str], *, lineno: int,
                 parent: griffe.Module, loader: griffe.GriffeLoader) -> griffe.Function:
        """The public function ``name`` as ``public_functions`` binds it to ``backend``, its
        docstring parsed as ``loader`` parses those it reads (mkdocstrings: Google style)."""
        node, template = self.defs[name]

        def annotation(expr: Any) -> Any:
            return griffe.safe_get_annotation(expr, parent=self.module, member=node.name)

        parameters = [
            griffe.Parameter(
                param, kind=kind, default=default if default is None or isinstance(default, str)
                else griffe.safe_get_expression(default, parent=self.module),
                # help() shows the backend's class, not the type variable Scaler
                annotation=griffe.ExprName(backend, parent=parent) if param == "scaler"
                else annotation(expr))
            for param, expr, kind, default in griffe.get_parameters(node.args)]
        function = griffe.Function(name, lineno=lineno, endlineno=lineno,
                                   parameters=griffe.Parameters(*parameters),
                                   returns=annotation(node.returns), parent=parent)
        text = self.templates[template].format(**words, scaler=backend)
        function.docstring = griffe.Docstring(
            inspect.cleandoc(text), lineno=lineno, parent=function,
            parser=loader.docstring_parser, parser_options=loader.docstring_options)
        return function


def _public_function_calls(module: griffe.Module) -> list[tuple[ast.Assign, ast.Call]]:
    # The module's ``(names...) = public_functions(...)`` assignments.
    return [(node, node.value) for node in ast.parse(module.source).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "public_functions"]


def _diagnostics_functions(pkg: griffe.Module, loader: griffe.GriffeLoader) -> None:
    defined = _PublicFunctions(pkg[_FUNCTIONAL.removeprefix("unifiedamp.")])
    for path in _BACKENDS_WITH_DIAGNOSTICS:
        module = pkg[path.removeprefix("unifiedamp.")]
        for node, call in _public_function_calls(module):
            backend = call.args[0].id  # type: ignore[attr-defined]
            words_call = next(k.value for k in call.keywords if k.arg == "words")
            words = {k.arg: ast.literal_eval(k.value)
                     for k in words_call.keywords}  # type: ignore[attr-defined]
            for target in node.targets[0].elts:  # type: ignore[attr-defined]
                function = defined.function(target.id, backend, words, lineno=node.lineno,
                                            parent=module, loader=loader)
                module.set_member(target.id, function)
                # As griffe's visitor does for what it creates: the other extensions
                # (tools/griffe_docstrings.py) see the new function.
                loader.extensions.call("on_instance", node=node, obj=function, agent=loader)
