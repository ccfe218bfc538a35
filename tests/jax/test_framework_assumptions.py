"""What the spec assumes of jmp, checked against the installed one."""

from __future__ import annotations

import dataclasses

import pytest

from unifiedamp import spec


def native_jmp_defaults() -> dict:
    """The defaults of jmp.DynamicLossScale's fields the spec's row reads, as floats."""
    jmp = pytest.importorskip("jmp", reason="jmp is not installed: its defaults were not "
                                            "checked")
    fields = {f.name: f for f in dataclasses.fields(jmp.DynamicLossScale)}

    def value(f):
        return f.default_factory() if f.default is dataclasses.MISSING else f.default

    d = {n: float(value(f)) for n, f in fields.items() if n in ("period", "min_loss_scale")}
    d["factor"] = float(value(fields["factor"]))
    return d


def test_jmp_defaults_include_its_floor_of_one():
    native = native_jmp_defaults()
    defaults = spec.FRAMEWORKS["jmp"]["defaults"]
    assert defaults["growth_interval"] == native["period"]
    assert defaults["min_scale"] == native["min_loss_scale"] == 1.0
    assert defaults["growth_factor"] == native["factor"]
    assert defaults["backoff_factor"] == 1 / native["factor"]
