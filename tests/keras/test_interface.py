"""The Keras backend has every member GradScaler declares, with its signature and its
read-only-ness, and no public member GradScaler does not declare beyond those listed in
tests/support/interface_checks.py, on the session's ``KERAS_BACKEND`` (the other backends:
tests/cross/test_interface.py)."""

from __future__ import annotations

from interface_checks import InterfaceContract


class TestKerasInterface(InterfaceContract):
    backend = "keras"
