"""Every explained cause of the zoo's adapters is one the suite can name, and links to a
snippet that exists (the snippets themselves run in their framework's session)."""

from __future__ import annotations

import importlib
import pathlib

import pytest

from unifiedamp.conformance._causes import DEPARTURES
from unifiedamp.conformance.zoo import ZOO, Difference

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = sorted({e.target.partition(":")[0] for e in ZOO.values()})
#: Where a contract test names its cause in its own message (not a departure of a run).
CONTRACT = [ROOT / "src" / "unifiedamp" / "conformance" / name
            for name in ("contract.py", "_state_checks.py")]


@pytest.mark.parametrize("module", MODULES)
def test_every_difference_is_a_cause_the_suite_names_with_a_snippet(module: str) -> None:
    differences = importlib.import_module(module).DIFFERENCES
    columns = {e.name for e in ZOO.values() if e.target.startswith(f"{module}:")}
    contract = "".join(path.read_text() for path in CONTRACT)
    assert differences, f"{module} lists no differences"
    for d in differences:
        assert isinstance(d, Difference)
        known = d.cause in DEPARTURES or f"[{d.cause}]" in contract or d.cause.startswith(
            ("raises ", "load does not restore the ", "a disabled scaler reports a scale of "))
        assert known, f"{module}: {d.cause!r} is no cause the suite names"
        assert all(len(field) > 20 for field in (d.sentence, d.matters, d.checked)), d.cause
        assert set(d.columns) <= columns, f"{module}: {d.cause!r} names columns {d.columns}"
        snippet = ROOT / d.snippet
        assert d.snippet.startswith("docs/snippets/zoo/") and snippet.is_file(), (
            f"{module}: {d.cause!r}: no snippet {d.snippet}")
        assert "unifiedamp" not in snippet.read_text(), f"{d.snippet} uses unifiedamp"
