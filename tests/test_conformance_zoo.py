"""The zoo: planted bugs are named by the rule they break; the zoo's page is generated."""

from __future__ import annotations

import json
import pathlib

import pytest
from zoo_copies import PLANTED

from unifiedamp.conformance._pytest_process import run_pytest

HERE = pathlib.Path(__file__).resolve().parent


def suite_report(tmp_path: pathlib.Path, bug: str = "") -> dict:
    out = tmp_path / f"report{bug}.json"
    run_pytest(["--pyargs", "unifiedamp.conformance", "--unifiedamp-backend",
                "zoo_copies:PaddleRuleCopy", "--unifiedamp-json", str(out),
                "--unifiedamp-max-examples", "30"], rootdir=tmp_path,
               env={"PYTHONPATH": str(HERE), "UNIFIEDAMP_PLANTED_BUG": bug})
    return json.loads(out.read_text())


def failing(report: dict) -> dict[str, str]:
    return {name: t["rule"] for name, t in report["tests"].items() if t["outcome"] == "failed"}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> dict[str, str]:
    """What the copy of Paddle's rule already does differently (its floor of 1, its ==)."""
    return failing(suite_report(tmp_path_factory.mktemp("baseline")))


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_named_by_its_rule(bug, baseline, tmp_path):
    new = {name: rule for name, rule in failing(suite_report(tmp_path, bug)).items()
           if name not in baseline}
    assert new, f"planting {bug} failed no test that the unplanted copy passes"
    assert PLANTED[bug] in set(new.values()), (
        f"{bug}: the newly failing tests name the rules {sorted(set(new.values()))}, "
        f"not {PLANTED[bug]!r}: {sorted(new)}")


def test_the_copy_without_a_bug_differs_only_where_paddle_does(baseline):
    # Paddle's floor of 1, its == tests against the counters, and a static scaler that
    # leaves its counters alone; nothing else.
    assert set(baseline.values()) <= {"backoff", "clamps", "float32 multiply", "growth timing",
                                      "reciprocal overflow", "static mode",
                                      "random sequences"}, baseline
