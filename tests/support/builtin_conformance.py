"""What every session's ``test_conformance.py`` shares: the conformance adapter of a built-in
backend and the Hypothesis budget the suite runs it with.

Each framework's folder subclasses ``unifiedamp.conformance.ScalerContract`` with the adapter
of its backend (``tests/core`` NumPy, ``tests/torch``, ``tests/paddle``, ``tests/jax``,
``tests/mlx``, and ``tests/keras`` once per ``KERAS_BACKEND``); the package's pytest plugin
applies the shipped xfails to those classes by their ``backend`` attribute.
"""

from __future__ import annotations

import importlib

import pytest

from unifiedamp import _registry

#: Hypothesis examples per property here. The suite is derandomized (the same examples on
#: every run); `unifiedamp conformance`, which README's install command and CI run, checks
#: every built-in backend with the full budget (200).
IN_SUITE_EXAMPLES = 50


def builtin_adapter(backend, needs=None, **options):
    """The conformance adapter of a built-in backend; skipped where ``needs`` is missing."""
    if needs:
        pytest.importorskip(needs)
    module, _, name = _registry.BUILTIN[backend].target.partition(":")
    return getattr(importlib.import_module(module), name).conformance_adapter(**options)
