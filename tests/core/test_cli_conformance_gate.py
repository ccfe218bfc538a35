"""``unifiedamp conformance`` as a CI gate: it never passes having checked nothing, refuses
before the run an option it would drop or a path it could not use, stops a column at
``--timeout`` naming the test it was in, and shows every failure Hypothesis found.

The scalers under test are numpy scalers written into a temporary folder, run by the real
suite in the command's own subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from unifiedamp.cli import _parser
from unifiedamp.cli.conformance import Job, conformance_report, print_report


def cli(*args: str, env: dict | None = None, timeout: float = 600
        ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "unifiedamp.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def scalers(tmp_path, source: str) -> dict[str, str]:
    """``source`` as the module ``scalers`` on the PYTHONPATH of the command's processes."""
    (tmp_path / "scalers.py").write_text(textwrap.dedent(source))
    return {"PYTHONPATH": str(tmp_path)}


# ---------------------------------------------------------------- a run that checks nothing


def test_a_k_that_selects_no_test_fails_the_run_and_says_so():
    proc = cli("conformance", "--backend", "numpy", "-k", "no_such_test_xyz")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == (
        "result: FAIL (no test ran: -k 'no_such_test_xyz' selects none of the suite's tests)")
    report = json.loads(cli("conformance", "--backend", "numpy", "-k", "no_such_test_xyz",
                            "--json").stdout)
    assert report["passed"] is False and report["tests_run"] == 0


def test_a_run_whose_every_selected_test_is_skipped_fails():
    # numpy has no compiler: every compiled vector is skipped, so nothing was checked.
    proc = cli("conformance", "--backend", "numpy", "-k", "vector_compiled[interval")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "skipped: numpy does not declare capability 'jit'" in proc.stdout
    assert proc.stdout.splitlines()[-1] == (
        "result: FAIL (no test ran: every test it selected was skipped)")


def test_a_zoo_run_in_which_no_column_could_run_fails(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    proc = cli("conformance", "--zoo", "torch", env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "torch: not installed (listed, not a failure)" in proc.stdout
    assert proc.stdout.splitlines()[-1] == (
        "result: ERROR (no test ran: no column could run) (not run: torch: not installed)")


def test_a_column_that_pytest_ended_before_its_tests_is_an_error(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("numpy test_vector[interval_one] extra-field  # a malformed line\n")
    proc = cli("conformance", "--backend", "numpy", "-k", "round_trip",
               env={"UNIFIEDAMP_XFAILS": str(xfails)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"numpy: error: pytest exited with 4: ERROR: {xfails}:1: expected '<backend> <test "
            "pattern>  # reason'") in proc.stdout


# ---------------------------------------------------------------- refused before the run


@pytest.mark.parametrize("keyword, pytest_says", [
    ("(", "at column 2: expected not OR left parenthesis OR identifier; got end of input"),
    ("vector and", "at column 11: expected not OR left parenthesis OR identifier; got end of "
                   "input"),
])
def test_a_k_that_pytest_cannot_parse_is_a_usage_error_naming_it(keyword, pytest_says):
    proc = cli("conformance", "--backend", "numpy", "-k", keyword, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"unifiedamp conformance: error: argument -k: {keyword!r} is not a pytest -k expression "
        f"({pytest_says}): give test names joined by and, or, not and parentheses, e.g. "
        "'test_vector and hysteresis'")


@pytest.mark.parametrize("argv, message", [
    (["--zoo", ","], "argument --zoo: ',' has an empty name: give comma-separated names"),
    (["--zoo", "jmp,"], "argument --zoo: 'jmp,' has an empty name"),
    (["--zoo", ""], "argument --zoo: '' has an empty name"),
    (["--zoo", "jmp", "--backend", "numpy"],
     "--zoo and --backend numpy both choose the columns"),
])
def test_an_option_the_run_would_drop_is_a_usage_error_naming_it(argv, message):
    proc = cli("conformance", *argv, timeout=60)  # the zoo would run for minutes
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(f"unifiedamp conformance: error: {message}")


def test_repeated_zoo_options_add_up():
    parser = _parser()
    assert parser.parse_args(["conformance", "--zoo", "jmp", "--zoo", "torch,paddle"]).zoo == [
        "jmp", "torch", "paddle"]
    assert parser.parse_args(["conformance", "--zoo"]).zoo == []  # the whole zoo


@pytest.mark.parametrize("option, path, message", [
    ("--markdown", "no_such_folder/scalers.md", "is in no folder: 'no_such_folder' does not "
                                               "exist; create it first"),
    ("--markdown", ".", "is a folder: give a file"),
    ("--check", "missing.md", "does not exist: write it first with --zoo --markdown FILE"),
    ("--check", ".", "is a folder: give a file"),
])
def test_an_output_path_is_checked_before_the_run(option, path, message, tmp_path):
    # The whole zoo would run for minutes before writing or reading the file.
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "conformance", "--zoo",
                           option, path], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"unifiedamp conformance: error: argument {option}: {path!r} {message}")


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan", "inf"])
def test_the_timeout_must_be_a_number_of_seconds_above_zero(value):
    proc = cli("conformance", "--backend", "numpy", "--timeout", value)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == (
        "unifiedamp conformance: error: argument --timeout: must be a number of seconds > 0 "
        f"(each backend's run), got {value!r}")


# ---------------------------------------------------------------- a column past --timeout


def test_a_column_stuck_before_its_first_test_stops_at_the_timeout_option(tmp_path):
    env = scalers(tmp_path, """
        import time
        from unifiedamp.backends.numpy import NumpyGradScaler

        time.sleep(600)

        class Scaler(NumpyGradScaler):
            pass
    """)
    # Within two minutes, not the default ten.
    proc = cli("conformance", "--backend", "scalers:Scaler", "-k", "round_trip", "--timeout",
               "2.5", env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("scalers:Scaler: error: timed out after 2.5 s before its first test (importing the "
            "framework, collecting the suite); a busy machine may need a longer --timeout; the "
            "run: `python -m pytest --pyargs unifiedamp.conformance --unifiedamp-backend "
            "scalers:Scaler -k round_trip -v`") in proc.stdout


def test_a_column_past_its_timeout_names_its_test_and_the_command_that_reruns_it(tmp_path):
    # The scaler waits in load_state_dict while the file `hang` exists: long enough for the
    # timeout, and not when the printed command runs the test again.
    env = scalers(tmp_path, f"""
        import os, time
        from unifiedamp.backends.numpy import NumpyGradScaler

        class HangsOnLoad(NumpyGradScaler):
            def load_state_dict(self, state_dict):
                while os.path.exists({str(tmp_path / "hang")!r}):
                    time.sleep(0.1)
                super().load_state_dict(state_dict)
    """)
    (tmp_path / "hang").touch()
    job = Job("hangs", "scalers:HangsOnLoad", ("numpy",), "", {"KERAS_BACKEND": "jax", **env})
    report = conformance_report(jobs=[job], keyword="state_dict", timeout=20)
    detail = report["backends"]["hangs"]["detail"]
    assert report["backends"]["hangs"]["status"] == "error" and not report["passed"]
    match = re.fullmatch(r"timed out after 20 s in (test_\w+) \(test 1 of \d+\); a busy machine "
                         r"may need a longer --timeout; that test alone: `(.*)`", detail)
    assert match, detail
    command = match.group(2)
    assert command == (
        f"KERAS_BACKEND=jax PYTHONPATH={shlex.quote(str(tmp_path))} python -m pytest --pyargs "
        f"unifiedamp.conformance.test_conformance::TestConformance::{match.group(1)} "
        "--unifiedamp-backend scalers:HangsOnLoad -v")
    (tmp_path / "hang").unlink()
    bindir = os.path.dirname(sys.executable)  # `python` is this interpreter
    rerun = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=600,
                           cwd=tmp_path, env={**os.environ, "PATH": bindir + os.pathsep
                                              + os.environ["PATH"]})
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr
    assert re.search(rf"::{re.escape(match.group(1))} PASSED", rerun.stdout), rerun.stdout
    assert "1 passed" in rerun.stdout


# ---------------------------------------------------------------- several failures at once


def test_every_failure_of_a_hypothesis_multi_failure_is_reported(tmp_path, capsys):
    # Two bugs in one property: Hypothesis raises an ExceptionGroup of both.
    env = scalers(tmp_path, """
        from unifiedamp._tree import tree_map
        from unifiedamp.backends.numpy import NumpyGradScaler

        class TwoFaults(NumpyGradScaler):
            # An empty tree is "not finite", and every gradient comes back halved.
            def unscale(self, grads):
                out, finite = super().unscale(grads)
                return tree_map(lambda g: g / 2, out), finite and bool(grads)
    """)
    proc = cli("conformance", "--backend", "scalers:TwoFaults", "-k", "scale_then_unscale",
               "--max-examples", "20", "--json", env=env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr
    report = json.loads(proc.stdout)
    test = report["backends"]["scalers:TwoFaults"]["tests"][
        "test_scale_then_unscale_is_identity_and_keeps_dtype"]
    firsts = sorted(failure.splitlines()[0] for failure in test["failures"])
    assert firsts == ["AssertionError: [reports finite gradients non-finite] after scale()",
                      "AssertionError: [unscale(scale(x)) is not x] with scale 1.0"], test
    assert all(failure in test["detail"] for failure in test["failures"])
    assert "tree=[]" in test["detail"]  # each one's falsifying example
    print_report(report)
    out = capsys.readouterr().out
    assert "Hypothesis found 2 distinct failures" in out
    for first in firsts:
        assert re.search(rf"\n      failure \d of 2: {re.escape(first)}\n", out), out
