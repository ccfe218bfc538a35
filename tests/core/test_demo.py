"""unifiedamp demo: every framework trains through the scaler and follows the spec's trajectory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from unifiedamp import cli, spec
from unifiedamp.cli import demo
from unifiedamp.diagnostics import ScaleHistory

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "unifiedamp.cli", "demo", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def test_numpy_torch_and_jax_follow_the_spec_and_the_plot_is_written(tmp_path):
    png = tmp_path / "scale.png"
    histories = tmp_path / "histories"
    proc = run_demo("--backend", "numpy", "--backend", "torch", "--backend", "jax",
                    "--out", str(png), "--history", str(histories), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] and report["plot"] == str(png) and report["steps"] == 40
    assert report["overflow_steps"] == list(demo.OVERFLOW_STEPS)
    expected = demo.reference(40)
    for name in ("numpy", "torch", "jax"):
        result = report["backends"][name]
        assert result["matches_spec"] and result["first_divergence"] is None, name
        assert result["dtype"] == "float16" and result["skips"] == len(demo.OVERFLOW_STEPS)
        # Checked here too, not only by the demo's own comparison.
        assert [r["scale_hex"] for r in result["records"]] == [
            spec.f32_hex(s.scale) for s in expected]
        assert [r["step"] for r in result["records"] if r["skipped"]] == list(demo.OVERFLOW_STEPS)
        # The scaler's own ring (device-side on torch and JAX) holds each step's number
        # (from 1), the scale its update left and whether it skipped; --history wrote it
        # for `plot`.
        assert result["history_matches"]
        assert result["history"] == [[k, s.scale, demo.forced_overflow(k)]
                                     for k, s in enumerate(expected, start=1)], name
        saved = ScaleHistory.from_json(histories / f"{name}.json")
        assert saved.as_list() == [tuple(row) for row in result["history"]]
        # It trains: the loss of the finite steps goes down.
        losses = [r["loss"] for r in result["records"] if r["loss"] is not None]
        assert sum(losses[-5:]) < sum(losses[:5]), name
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    # --json: the report alone (test_cli_progress.py has the progress on a terminal).
    assert proc.stderr == ""


def test_the_config_shows_growth_hysteresis_and_backoff():
    scales = [s.scale for s in demo.reference(demo.PERIOD)]
    assert scales[3] == 2 * scales[0]                         # growth after 4 finite steps
    assert scales[9] == scales[8]                             # one overflow: held (hysteresis)
    assert scales[15] == scales[13] / 2                       # two in a row: a backoff
    assert max(scales) == demo.CONFIG["max_scale"]            # capped: fp16 never overflows alone


def test_the_table_and_a_not_installed_backend(monkeypatch, capsys, tmp_path):
    # Pretend only numpy is installed: the default run lists the others as not run and
    # passes; naming one with --backend fails the run.
    monkeypatch.setattr(demo, "_found", lambda name: name == "numpy")
    assert cli.main(["demo", "--steps", "12", "--out", "none"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["backend", "device", "dtype", "steps", "skips", "final", "scale",
                                "time", "matches", "spec", "history"]
    assert lines[2].split()[:6] == ["numpy", "cpu", "float16", "12", "1", "4096"]
    assert lines[2].split()[-2:] == ["yes", "matches"]
    torch_row = next(line for line in lines if line.startswith("torch "))
    assert torch_row.split("  not run ")[1].split(")")[0] == \
        "(not installed: pip install 'unifiedamp[torch]'"
    assert torch_row.split()[1:7] == ["-"] * 6 and torch_row.endswith(" -")
    assert "plot: not drawn (--out none)" in out and lines[-1] == "result: PASS"

    assert cli.main(["demo", "--backend", "numpy", "--backend", "mlx", "--steps", "3",
                     "--out", "none", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["not_run"] == ["mlx"] and not report["passed"]
    assert report["backends"]["numpy"]["matches_spec"] and report["plot"] is None


def test_usage_errors_exit_2(monkeypatch, capsys):
    for argv in (["--backend", "nosuch"], ["--steps", "0"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["demo", *argv])
        assert exc.value.code == 2
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err
    real_find_spec = demo.importlib.util.find_spec
    monkeypatch.setattr(demo.importlib.util, "find_spec",
                        lambda name: None if name == "matplotlib" else real_find_spec(name))
    assert cli.main(["demo", "--backend", "numpy"]) == 2
    assert "pip install 'unifiedamp[demo]'" in capsys.readouterr().err


def test_an_output_it_could_not_write_is_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "history.json").write_text("{}")
    for argv, message in ((["--out", str(tmp_path / "missing" / "x.png")], "does not exist"),
                          (["--history", str(tmp_path / "history.json")], "is a file")):
        assert cli.main(["demo", "--backend", "numpy", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_a_diverging_trajectory_is_reported_with_its_step():
    records = [{"scale_hex": spec.f32_hex(s.scale), "growth_tracker": s.growth_tracker,
                "hysteresis_tracker": s.hysteresis_tracker, "skipped": demo.forced_overflow(k)}
               for k, s in enumerate(demo.reference(20), start=1)]
    assert demo.first_divergence(records, 20) is None
    # A scaler that backs off at the first overflow (hysteresis ignored): scale from step 10.
    records[10 - 1] = {**records[10 - 1], "scale_hex": spec.f32_hex(2048.0),
                       "hysteresis_tracker": 0}
    diverged = demo.first_divergence(records, 20)
    assert diverged["step"] == 10
    assert diverged["expected"]["scale_hex"] == "0x45800000"
    assert diverged["got"]["scale_hex"] == "0x45000000"


def test_a_history_that_differs_from_the_records_fails_the_run(monkeypatch, capsys):
    # A scaler whose ring recorded the scale an update started from, not the one it left.
    real = demo._run_child

    def shifted(name, steps, *progress):
        result = real(name, steps, *progress)
        before = [demo.CONFIG["init_scale"]] + [r["scale"] for r in result["records"][:-1]]
        result["history"] = [[k, b, s] for (k, _, s), b in
                             zip(result["history"], before, strict=True)]
        return result

    monkeypatch.setattr(demo, "_run_child", shifted)
    assert cli.main(["demo", "--backend", "numpy", "--steps", "12", "--out", "none"]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS" in out and out.splitlines()[-1] == "result: FAIL"


def test_a_crashing_child_is_reported_not_fatal():
    result = demo._run_child("nosuch", 3)  # the child has no trainer of that name: KeyError
    assert result["status"] == "error" and result["records"] == []
    assert result["detail"] == "child exited with 1: KeyError: 'nosuch'"


def test_demo_plot_and_history_number_steps_and_scales_alike(tmp_path, capsys):
    """One convention: at step n (the n-th update, from 1) the scale after it. The demo's
    records, the scaler's history() it wrote, what `plot` draws from that file and what the
    demo draws are the same (step, scale) pairs, and the last scale is among them."""
    pytest.importorskip("matplotlib")
    from unifiedamp.diagnostics import _history_figure

    histories = tmp_path / "histories"
    assert cli.main(["demo", "--backend", "numpy", "--steps", "12", "--out",
                     str(tmp_path / "demo.png"), "--history", str(histories), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    records = report["backends"]["numpy"]["records"]
    pairs = [(r["step"], r["scale"]) for r in records]
    final = report["backends"]["numpy"]["final_scale"]
    assert [n for n, _ in pairs] == list(range(1, 13)) and pairs[-1] == (12, final)
    assert [s for _, s in pairs] == [s.scale for s in demo.reference(12)]
    assert report["overflow_steps"] == [10]
    assert [r["step"] for r in records if r["skipped"]] == [10]
    # The scaler's history(), through the file `plot` reads.
    history = ScaleHistory.from_json(histories / "numpy.json")
    assert [(n, s) for n, s, _ in history.as_list()] == pairs
    assert [n for n, _, skipped in history.as_list() if skipped] == [10]
    # What `plot` draws from it: every pair, the last one marked.
    line, last = _history_figure(history).axes[0].lines
    assert list(zip(line.get_xdata(), line.get_ydata(), strict=True)) == pairs
    assert (last.get_xdata()[0], last.get_ydata()[0]) == (12, final)
    # What the demo draws: the same pairs after the initial scale at step 0.
    drawn = {ln.get_label(): ln for ln in demo._figure(report).axes[0].lines}
    numpy_line = next(ln for label, ln in drawn.items() if label.startswith("numpy "))
    assert list(zip(numpy_line.get_xdata(), numpy_line.get_ydata(), strict=True)) == [
        (0, demo.CONFIG["init_scale"])] + pairs
    assert cli.main(["plot", str(histories / "numpy.json"), "-o",
                     str(tmp_path / "plot.png")]) == 0
    assert (f"12 updates (from 1 to 12), 1 skipped, scale 1024 to 4096, {final:g} after the "
            "last") in capsys.readouterr().out
