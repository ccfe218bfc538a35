"""The unifiedamp command: backends, spec, conformance."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from unifiedamp import spec
from unifiedamp.cli.backends import print_backends

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(*args: str, env: dict | None = None, cwd: str | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "unifiedamp.cli", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})}, cwd=cwd)


def test_console_script_is_installed():
    bindir = os.path.dirname(sys.executable)
    proc = subprocess.run([os.path.join(bindir, "unifiedamp"), "--version"], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("unifiedamp ")


def cells(lines: list[str], test: str) -> list[str]:
    """The cells of a matrix row after the test and its rule (columns are 2+ spaces apart)."""
    row = next(line for line in lines if line.startswith(f"{test} "))
    return re.split(r"\s{2,}", row)[2:]


#: The rows the matrix test reads: every vector, two of them compiled (compiling is what a
#: backend's column spends its time on), the run of several ranks.
MATRIX_ROWS = ("test_vector[ or vector_compiled[growth_on_nth or vector_compiled[backoff_resets "
               "or inf_on_one_rank")


@pytest.mark.slow
def test_conformance_prints_a_matrix_with_every_builtin_backend_passing():
    # The matrix, not the verdicts: the backends' whole suites run with their budgets in
    # test_conformance_builtin.py; here the rows this test reads, on every backend.
    proc = cli("conformance", "--max-examples", "3", "-k", MATRIX_ROWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith(f", only the tests -k {MATRIX_ROWS!r} selects")
    assert lines[1].split() == ["test", "rule", "numpy", "torch", "paddle", "keras", "jax", "mlx"]
    rows = [line.split()[0] for line in lines[2:] if line.startswith("test_")]
    assert len(rows) == len(spec.VECTORS) + 3, rows
    for vector in spec.VECTORS:
        assert cells(lines, f"test_vector[{vector.name}]") == ["pass"] * 6, vector.name
    for vector in ("growth_on_nth_finite", "backoff_resets_growth"):
        assert cells(lines, f"test_vector_compiled[{vector}]") == [
            "skip", "pass", "skip", "pass", "pass", "pass"], vector
    assert re.split(r"\s{2,}", next(line for line in lines if line.startswith(
        "test_vector[hysteresis_two] ")))[1] == "hysteresis"
    assert cells(lines, "test_inf_on_one_rank_skips_on_every_rank") == [
        "skip", "pass", "pass", "pass", "pass", "skip"]
    assert ("  skipped: numpy does not declare capability 'jit' (compiled_iterate(handle, "
            "kinds) runs the step under the framework's compiler)\n    "
            "test_vector_compiled[growth_on_nth_finite], "
            "test_vector_compiled[backoff_resets_growth]\n") in proc.stdout
    assert lines[-1] == "result: PASS"


def test_conformance_k_runs_only_the_tests_it_selects():
    proc = cli("conformance", "--backend", "numpy", "-k", "round_trip or vector[growth",
               "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["keyword"] == "round_trip or vector[growth" and report["passed"]
    tests = sorted(report["backends"]["numpy"]["tests"])
    assert tests and all("round_trip" in t or t.startswith("test_vector[growth")
                         for t in tests), tests
    assert "test_state_dict_round_trip_mid_interval" in tests
    refused = cli("conformance", "--zoo", "-k", "vector", "--check", "docs/scalers.md")
    assert refused.returncode == 2 and "drop -k" in refused.stderr, refused.stderr


BROKEN = {"PYTHONPATH": os.path.join(ROOT, "tests", "support")}  # broken_scalers


def test_conformance_reports_every_diverging_test_by_cause_and_fails():
    proc = cli("conformance", "--backend", "numpy", "--backend",
               "broken_scalers:NeverBacksOff", "--max-examples", "20", env=BROKEN)
    assert proc.returncode == 1 and proc.stderr == ""  # piped: the report, no progress
    out = proc.stdout
    assert cells(out.splitlines(), "test_vector[backoff_resets_growth]") == [
        "pass", "FAIL at step 1"]
    assert ("    test_vector[backoff_resets_growth]: AssertionError: [the update ignores "
            "overflows] "
            "backoff_resets_growth: diverged at step 1 of 'IFFFIIFFFF': expected scale 512.0 "
            "(float32 0x44000000), growth_tracker 0, hysteresis_tracker 0; got scale 1024.0 "
            "(float32 0x44800000), growth_tracker 1") in out
    # every failing test, grouped under its cause, whatever rule the test checks
    differs = [line for line in out.splitlines() if line.startswith("  differs: ")]
    assert differs[0].startswith("  differs: the update ignores overflows ("), differs
    assert out.splitlines()[-1] == "result: FAIL"


def test_native_torch_through_a_plain_adapter_and_a_relative_pythonpath():
    """docs/examples/native_torch.py: torch.amp.GradScaler itself, through ImperativeAdapter."""
    proc = cli("conformance", "--backend", "native_torch:NativeTorch", "--max-examples", "10",
               env={"PYTHONPATH": os.path.join("docs", "examples")}, cwd=ROOT)
    out, lines = proc.stdout, proc.stdout.splitlines()
    assert proc.returncode == 1 and "not installed" not in out, out + proc.stderr
    # torch multiplies by the float64 factor, grows on tracker + 1 == interval, steps with
    # NaN weights at scale 0 and has no hysteresis.
    assert cells(lines, "test_vector[factors_rounded_to_float32_before_multiplying]") == [
        "FAIL at step 1"]
    assert cells(lines, "test_vector[lowered_interval_grows_next_finite]") == ["FAIL at step 4"]
    assert ("backoff_reaches_zero_and_stays: diverged at step 3 of 'IIFF': a step with finite "
            "gradients left a parameter or optimizer-state value inf or NaN") in out
    assert cells(lines, "test_vector[hysteresis_two]") == ["skip"]
    assert ("skipped: torch.amp.GradScaler cannot run vector hysteresis_two: torch.amp.GradScaler "
            "has no hysteresis=2 (it behaves as hysteresis=1)") in out
    assert cells(lines, "test_vector[growth_on_nth_finite]") == ["pass"]
    assert "compares full; fixed: hysteresis=1, min_scale=None, max_scale=None, dynamic=True" \
        in out


def test_conformance_json_report():
    proc = cli("conformance", "--json", "--max-examples", "20", "--backend", "numpy",
               "--backend", "broken_scalers:NeverBacksOff", "--backend", "nosuchmodule:Scaler",
               env=BROKEN)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["passed"] is False
    assert report["spec_version"] == spec.SPEC_VERSION
    numpy_tests = report["backends"]["numpy"]["tests"]
    assert {f"test_vector[{v.name}]" for v in spec.VECTORS} <= set(numpy_tests)
    assert {t["outcome"] for t in numpy_tests.values()} == {"passed", "skipped"}
    assert report["backends"]["numpy"]["header"]["device"] == "cpu"
    broken = report["backends"]["broken_scalers:NeverBacksOff"]["tests"]
    assert broken["test_vector[growth_on_nth_finite]"]["outcome"] == "passed"
    # the hysteresis tracker already differs at step 1, before any scale does
    assert "hysteresis_two: diverged at step 1" in broken["test_vector[hysteresis_two]"]["detail"]
    missing = report["backends"]["nosuchmodule:Scaler"]
    assert missing["status"] == "not installed" and "nosuchmodule" in missing["detail"]


def test_a_crashing_backend_is_reported_not_fatal(tmp_path):
    (tmp_path / "crashscaler.py").write_text(textwrap.dedent("""
        import os
        from unifiedamp.backends.numpy import NumpyGradScaler

        class Crash(NumpyGradScaler):
            @classmethod
            def conformance_adapter(cls):
                os.abort()
    """))
    proc = cli("conformance", "--backend", "crashscaler:Crash", "--backend", "numpy",
               "--max-examples", "5", env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1
    assert "crashscaler:Crash: error: pytest exited with -6" in proc.stdout
    assert cells(proc.stdout.splitlines(), "test_vector[static_mode]") == ["error", "pass"]


@pytest.mark.slow
def test_backends_lists_each_backend_with_version_devices_and_install_hint(capsys):
    # One run that imports every framework; the table is printed from its report here
    # (tests/test_cli_progress.py runs the table's command itself, with numpy alone).
    proc = cli("backends", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report[0] == {**report[0], "backend": "numpy", "installed": True, "devices": ["cpu"]}
    print_backends(report)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["backend", "installed", "framework", "devices", "install"]
    numpy_row = next(line for line in lines if line.startswith("numpy "))
    assert numpy_row.split()[:4] == ["numpy", "yes", "numpy", __import__("numpy").__version__]
    assert "cpu" in numpy_row and "pip install numpy" in numpy_row


def test_spec_json_is_the_spec_document():
    proc = cli("spec", "--format", "json")
    doc = json.loads(proc.stdout)
    assert doc == json.loads(json.dumps(spec.spec_document()))
    assert doc["schema"] == "unifiedamp.spec" and doc["spec_version"] == spec.SPEC_VERSION
    assert doc["schema_version"] == spec.SCHEMA_VERSION == 1
    assert doc["frameworks"]["paddle"]["names"]["growth_interval"] == "incr_every_n_steps"


def test_spec_markdown_prints_the_tables():
    out = cli("spec", "--format", "markdown").stdout
    assert "| `init_scale` | `65536.0` | yes | a finite number > 0 that float32 can hold |" in out
    # paddle 3.x's defaults, then the paddle 2.x documentation's
    assert ("| `growth_interval` | `growth_interval` / 2000 / any | `incr_every_n_steps` / 2000 "
            "/ any | `incr_every_n_steps` / 1000 / any |" in out)
    assert "| hysteresis_two |" in out
    assert out == cli("spec").stdout  # markdown is the default


def test_unknown_command_exits_with_usage():
    proc = cli("frobnicate")
    assert proc.returncode == 2 and "invalid choice: 'frobnicate'" in proc.stderr
