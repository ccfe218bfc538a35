"""What the spec and the facade assume of a framework's native scaler class, checked against
the installed framework in its own session: a class each session's
``test_framework_assumptions.py`` instantiates with its ``framework`` (the row of
``spec.FRAMEWORKS``) and the native class."""

from __future__ import annotations

import inspect

import pytest

import unifiedamp as ua
from unifiedamp import spec


def signature_defaults(cls) -> dict:
    """{parameter name: default} of ``cls.__init__``, leaving out those without one or with
    ``None``."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in params
            if p.default is not inspect.Parameter.empty and p.default is not None}


class NativeScalerContract:
    """``framework``: the row of ``spec.FRAMEWORKS``; ``native``: ``"module:attribute.path"``
    of the framework's scaler class, which a backend derives from (Paddle's scaler, Keras's
    optimizer wrapper) or will."""

    framework: str | None = None
    native: str | None = None

    def native_class(self):
        module, _, path = self.native.partition(":")
        obj = pytest.importorskip(module, reason=f"{module} is not installed: its defaults "
                                                 f"were not checked")
        for name in path.split("."):
            obj = getattr(obj, name)
        return obj

    def test_the_framework_table_holds_the_installed_defaults(self):
        framework = self.framework
        native = signature_defaults(self.native_class())
        row = spec.FRAMEWORKS[framework]
        checked = {}
        for canonical, name in row["names"].items():
            if name in native:
                checked[canonical] = native[name]
                assert row["defaults"][canonical] == native[name], (
                    f"spec.FRAMEWORKS[{framework!r}]['defaults'][{canonical!r}] is "
                    f"{row['defaults'][canonical]!r}, the installed {row['api']} defaults "
                    f"{name} to {native[name]!r}")
        # Every native name in the table is a parameter of the installed constructor.
        assert set(checked) == set(row["names"]), (checked, row["names"])

    def test_framework_base_classes_combine_with_the_facade_metaclass(self):
        # Each must combine with unifiedamp.GradScaler's metaclass.
        base = self.native_class()

        class Probe(base, ua.GradScaler):
            pass

        assert [type(base).__name__, type(Probe).__name__, issubclass(Probe, ua.GradScaler)] \
            == ["type", "_FacadeMeta", True]
