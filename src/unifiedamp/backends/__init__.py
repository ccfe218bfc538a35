"""One module or package per framework; each imports its framework and nothing else does.

A backend that is big is a package with the same file names everywhere: ``__init__``
(the public names), ``_scaler`` (the class), ``_diagnostics``, ``_compat`` (the one
module that touches the framework's private API, with the supported versions), and
modules named for what they hold. Shared by the backends: ``_imperative`` (what the
imperative backends share, their diagnostics mixin), ``_functional`` (the immutable
scaler of JAX and MLX) and ``_functional_diagnostics``, ``_float32`` (float32 arithmetic
on bit patterns, for JAX and Keras), and here :func:`show_as_public`, for a backend
package's ``__init__``. A backend package imports no other backend's package, but for
the modules ``tests/core/test_architecture.py`` declares shared (Keras on torch runs the torch
backend's kernel).
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
