"""One module or package per framework; each imports its framework and nothing else does.

Shared by the backends: ``_imperative`` (what the imperative backends share, their
diagnostics mixin), ``_functional`` (the immutable scaler of JAX and MLX), and here
:func:`show_as_public`, for a backend package's ``__init__``.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any


def show_as_public(obj: Any, package: str) -> None:
    """Names ``package`` as where ``obj`` (a class or function a backend package re-exports)
    lives, and the methods a class defines: repr, pickle, docs and error messages show the
    public path, and doctest finds the examples of the methods in the package."""
    defined_in = obj.__module__
    obj.__module__ = package
    for member in vars(obj).values() if isinstance(obj, type) else ():
        function = getattr(member, "__func__", member)  # a staticmethod's or classmethod's
        if isinstance(function, FunctionType) and function.__module__ == defined_in:
            function.__module__ = package
