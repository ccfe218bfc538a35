"""The zoo: planted bugs are named by their cause; the zoo's page is generated."""

from __future__ import annotations

import json
import pathlib

import pytest
from zoo_copies import PLANTED

from unifiedamp.conformance._pytest_process import run_pytest
from unifiedamp.conformance._rules import causes_of

SUPPORT = pathlib.Path(__file__).resolve().parents[1] / "support"  # zoo_copies


def suite_report(tmp_path: pathlib.Path, bug: str = "", **env: str) -> dict:
    out = tmp_path / f"report{bug}.json"
    run_pytest(["--pyargs", "unifiedamp.conformance", "--unifiedamp-backend",
                "zoo_copies:PaddleRuleCopy", "--unifiedamp-json", str(out),
                "--unifiedamp-max-examples", "30"], rootdir=tmp_path,
               env={"PYTHONPATH": str(SUPPORT), "UNIFIEDAMP_PLANTED_BUG": bug, **env})
    return json.loads(out.read_text())


def failing(report: dict) -> dict[str, list[str]]:
    """Each failing test -> the causes its message names."""
    return {name: causes_of(t["detail"]) for name, t in report["tests"].items()
            if t["outcome"] == "failed"}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> dict[str, str]:
    """What the copy of Paddle's rule already does differently (its floor of 1, its ==)."""
    return failing(suite_report(tmp_path_factory.mktemp("baseline")))


#: Tests that must each name the planted bug: a resume between backends that skipped
#: comparing the trackers would let a scaler that drops them through.
MUST_NAME = {"state_not_reloaded": ("test_state_dict_round_trip_mid_interval",
                                    "test_state_dict_moves_between_backends")}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_named_by_its_cause(bug, baseline, tmp_path):
    planted = failing(suite_report(tmp_path, bug))
    new = {name: causes for name, causes in planted.items() if causes != baseline.get(name)}
    assert new, f"planting {bug} failed no test that the unplanted copy passes"
    named = {cause for causes in new.values() for cause in causes}
    assert PLANTED[bug] in named, (
        f"{bug}: the newly failing tests name the causes {sorted(named)}, not "
        f"{PLANTED[bug]!r}: {sorted(new)}")
    for test in MUST_NAME.get(bug, ()):
        assert PLANTED[bug] in planted.get(test, []), (
            f"{bug}: {test} does not name it: {planted.get(test)}")


def test_the_copy_without_a_bug_differs_only_where_paddle_does(baseline):
    # Paddle's floor of 1, its == tests against the counters, its check of the scaled
    # gradients, and a static scaler that leaves its counters alone; nothing else.
    causes = {cause for causes in baseline.values() for cause in causes}
    assert causes <= {"floor of 1", "grows only when the tracker equals the interval",
                      "takes a finite step whose 1/scale overflows",
                      "static mode keeps the trackers"}, baseline


def test_parameters_show_a_skip_the_scale_does_not(tmp_path):
    # The bug keeps the scale and the trackers right.
    tests = suite_report(tmp_path, "skips_growth_step")["tests"]
    detail = tests["test_vector[growth_on_nth_finite]"]["detail"]
    assert ("diverged at step 3 of 'FFFFFF': the step was skipped; the reference takes it "
            "(finite gradients)") in detail


def test_scale_and_skip_mode_compares_no_tracker_and_still_sees_skips(tmp_path):
    clean = suite_report(tmp_path, UNIFIEDAMP_COPY_COMPARE="scale_and_skip")
    assert clean["header"]["compare"] == "scale_and_skip"
    # Trackers are not compared: the static-mode tracker reset is not seen.
    assert clean["tests"]["test_static_mode_resets_the_trackers_of_a_loaded_state"][
        "outcome"] == "passed"
    planted = suite_report(tmp_path, "skips_growth_step",
                           UNIFIEDAMP_COPY_COMPARE="scale_and_skip")
    assert planted["tests"]["test_vector[growth_on_nth_finite]"]["outcome"] == "failed"


def test_a_small_config_space_is_no_failure_and_gives_the_same_verdict_twice(tmp_path):
    first = suite_report(tmp_path / "1", UNIFIEDAMP_COPY_SPACE="tiny") if (
        tmp_path / "1").mkdir() is None else None
    second = suite_report(tmp_path / "2", UNIFIEDAMP_COPY_SPACE="tiny") if (
        tmp_path / "2").mkdir() is None else None
    def verdicts(report: dict) -> dict:  # pytest's later lines hold object addresses
        return {name: (t["outcome"], t["detail"].splitlines()[:1])
                for name, t in report["tests"].items()}

    assert verdicts(first) == verdicts(second)
    random = first["tests"]["test_random_configs_and_steps_match_reference"]
    assert random["outcome"] in ("passed", "failed"), random
    assert "FailedHealthCheck" not in json.dumps(first)
    skipped = first["tests"]["test_vector[non_power_of_two_factors_float32]"]
    assert skipped == {"outcome": "skipped", "rule": "float32 multiply", "detail": (
        "paddle-copy cannot run vector non_power_of_two_factors_float32: this copy runs only "
        "the factors 2 and 0.5")}


def test_the_zoo_page_refuses_a_difference_nobody_explained():
    from unifiedamp.conformance.zoo._doc import UnexplainedDifference, zoo_markdown

    detail = ("AssertionError: [grows one step late] growth_on_nth_finite: diverged at step 3 "
              "of 'FFF'")
    report = {"backends": {"torch": {"status": "ok", "header": {}, "tests": {
        "test_vector[growth_on_nth_finite]": {"outcome": "failed", "detail": detail,
                                              "rule": "growth timing"}}}}}
    with pytest.raises(UnexplainedDifference, match=r"torch: the cause 'grows one step late' "
                                                     r"\(seen in test_vector\[growth_on_nth_"
                                                     r"finite\].*zoo\.torch_grad_scaler\."
                                                     r"DIFFERENCES"):
        zoo_markdown(report)


def test_every_zoo_entry_is_a_plain_adapter_class_that_imports_no_framework(run_python):
    proc = run_python(
        "import importlib, sys\n"
        "from unifiedamp.conformance.zoo import ZOO\n"
        "for e in ZOO.values():\n"
        "    module, _, name = e.target.partition(':')\n"
        "    cls = getattr(importlib.import_module(module), name)\n"
        "    assert all(callable(getattr(cls, m, None)) for m in "
        "('new', 'iterate', 'read', 'snapshot')), e.name\n"
        "print(sorted(m for m in ('torch', 'jax', 'keras', 'paddle', 'deepspeed', 'megatron', "
        "'colossalai', 'jmp', 'tensorflow', 'flax', 'optax', 'mindspore') "
        "if m in sys.modules))")
    assert proc.stdout.strip() == "[]", proc.stderr


def test_the_zoo_page_does_not_hang_a_cause_on_a_hypothesis_example():
    # Which of a column's causes a drawn example meets first may change with unrelated code:
    # the page stays the same whichever it is.
    from unifiedamp.conformance.zoo._doc import zoo_markdown

    fixed = ("AssertionError: [multiplies by a float64 factor] factors_rounded_to_float32_"
             "before_multiplying: diverged at step 1 of 'FI'")
    pages = []
    for drawn in ("multiplies by a float64 factor", "takes a finite step whose 1/scale "
                                                    "overflows"):
        tests = {"test_vector[factors_rounded_to_float32_before_multiplying]": {
            "outcome": "failed", "detail": fixed, "rule": "float32 multiply"},
            "test_vector[reciprocal_overflow_skips_finite_steps]": {
            "outcome": "failed", "rule": "reciprocal overflow", "detail": (
                "AssertionError: [takes a finite step whose 1/scale overflows] reciprocal_"
                "overflow_skips_finite_steps: diverged at step 1 of 'FFF'")},
            "test_random_configs_and_steps_match_reference": {
            "outcome": "failed", "rule": "all rules",
            "detail": f"AssertionError: [{drawn}] random: diverged at step 1 of 'F'"}}
        pages.append(zoo_markdown({"backends": {"torch": {"status": "ok", "header": {},
                                                          "tests": tests}}}))
    assert pages[0] == pages[1]
    assert ("- Hypothesis tests that fail on the causes above: "
            "`test_random_configs_and_steps_match_reference`") in pages[0]
