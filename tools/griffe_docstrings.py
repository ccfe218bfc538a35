"""A griffe extension for the API reference (mkdocs.yml): reads the docstrings as written.

The docstrings follow Google style with reStructuredText touches that ``help()`` and
doctest read well: an ``Example:`` section of doctests, roles such as ``:class:`Name```
and literal blocks introduced by ``::``. mkdocstrings renders Google sections as Markdown,
where ``Example:`` is a plain admonition (its ``>>>`` lines would read as nested quotes)
and the roles and ``::`` would show as typed. Before griffe parses a docstring this
extension names the section ``Examples:`` (rendered as code), turns a role into a code
span and ``::`` into ``:`` (the indented block after it is then a Markdown code block).
The source is unchanged: doctest and ``help()`` read it as before.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)
# :class:`~pkg.Name` -> `Name`, :func:`pkg.f` -> `pkg.f`
_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::$", re.M)


def _role(match: re.Match[str]) -> str:
    target = match[2].rsplit(".", 1)[-1] if match[1] else match[2]
    return f"`{target}`"


def readable(text: str) -> str:
    """The docstring ``text`` as mkdocstrings should read it.

    Example:
        >>> print(readable("See :class:`~a.b.C`::\\n\\n    x = 1\\n\\nExample:\\n    f(2)"))
        See `C`:
        <BLANKLINE>
            x = 1
        <BLANKLINE>
        Examples:
            f(2)
    """
    text = _EXAMPLE.sub(r"\1Examples:", text)
    text = _ROLE.sub(_role, text)
    return _LITERAL.sub(r"\1:", text)


class ReadableDocstrings(griffe.Extension):
    """Rewrites each docstring with :func:`readable` as its object is created (packages
    included, which ``on_object`` does not see); the rewrite is idempotent."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = readable(obj.docstring.value)
