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
"""

from __future__ import annotations

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

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path == "unifiedamp":
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
