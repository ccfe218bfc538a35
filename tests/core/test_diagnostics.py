"""The framework-free diagnostics types, the collapse monitor's detail and ``unifiedamp plot``."""

from __future__ import annotations

import json
import math
import os
import re
import warnings

import numpy as np
import pytest

from unifiedamp import ScaleCollapseWarning
from unifiedamp._monitor import CollapseMonitor
from unifiedamp.cli import main
from unifiedamp.diagnostics import (
    FIXES,
    GradientOverflow,
    OverflowReport,
    ScaleHistory,
    count_overflow,
)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_count_overflow_counts_inf_and_nan_and_the_largest_finite_magnitude(dtype):
    rng = np.random.default_rng(0)
    g = rng.standard_normal((7, 5)).astype(dtype)
    g[0, 1], g[3, 3], g[6, 0] = np.inf, -np.inf, np.nan
    finite = np.isfinite(g)
    got = count_overflow("layer.weight", g)
    assert got == GradientOverflow("layer.weight", (7, 5), 2, 1,
                                   float(np.abs(g[finite]).max()))
    assert count_overflow("layer.weight", np.where(finite, g, 0)) is None


def test_count_overflow_of_an_all_nan_gradient_has_no_finite_magnitude():
    got = count_overflow("b", np.full(4, np.nan, np.float32))
    assert (got.inf, got.nan, got.max_finite) == (0, 4, 0.0)


@pytest.mark.parametrize("size", [1, 3, 8])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 8, 9, 25])
def test_history_from_ring_keeps_the_last_records_oldest_first(size, count):
    # Fill a ring as a backend does: record k in slot k % size.
    iterations, scales, skipped = [0] * size, [0.0] * size, [False] * size
    for k in range(count):
        iterations[k % size], scales[k % size], skipped[k % size] = k + 1, 2.0 ** k, k % 3 == 0
    got = ScaleHistory.from_ring(iterations, scales, skipped, count).as_list()
    expected = [(k + 1, 2.0 ** k, k % 3 == 0) for k in range(count)][-size:] if count else []
    assert got == expected


def test_history_json_round_trip_and_arrays(tmp_path):
    h = ScaleHistory([1, 2, 3], [65536.0, 32768.0, 32768.0], [True, False, False])
    path = tmp_path / "h.json"
    h.to_json(path)
    assert ScaleHistory.from_json(path).as_list() == h.as_list()
    assert json.loads(path.read_text())["skipped"] == [True, False, False]
    arrays = h.as_arrays()
    assert arrays["scale"].dtype == np.float32 and arrays["iteration"].tolist() == [1, 2, 3]


@pytest.mark.parametrize("text", ['{"iteration": [1], "scale": [2.0]}', "[1, 2]", "{not json"])
def test_history_from_bad_json_names_what_it_expects(text):
    with pytest.raises(ValueError, match="not a scale history"):
        ScaleHistory.from_json(text)


@pytest.mark.parametrize("field, values, message", [
    ("skipped", ["false"], "skipped 0 must be true or false, got 'false'"),
    ("skipped", [1], "skipped 0 must be true or false, got 1"),
    ("scale", [float("nan")], "scale 0 must be a finite number >= 0, got nan"),
    ("scale", [-4.0], "scale 0 must be a finite number >= 0, got -4.0"),
    ("iteration", [1e400], "iteration 0 must be an int >= 0, got inf"),
    ("iteration", [1.5], "iteration 0 must be an int >= 0, got 1.5"),
])
def test_history_from_json_refuses_a_record_it_would_misread(field, values, message):
    record = {"iteration": [1], "scale": [2.0], "skipped": [False], field: values}
    with pytest.raises(ValueError, match=re.escape(message)):
        ScaleHistory.from_json(json.dumps(record).replace("Infinity", "1e400"))


def test_history_iterations_must_increase():
    with pytest.raises(ValueError, match="iterations must increase, got 3 then 2 at record 1"):
        ScaleHistory([3, 2], [1.0, 1.0], [False, False])


def test_history_refuses_lists_of_different_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        ScaleHistory([1, 2], [1.0], [False, True])


def test_report_text_names_the_gradients_and_says_whose_fault_it_is():
    over = GradientOverflow("fc2.weight", (4, 3), 2, 1, 12.5)
    scale_fault = OverflowReport(5, 65536.0, [over], checked=4, loss_finite=True)
    model_fault = OverflowReport(5, 65536.0, [over], checked=4, loss_finite=False)
    assert scale_fault.names == ["fc2.weight"]
    assert "fc2.weight (4, 3): 2 inf, 1 NaN, largest finite |g| 12.5" in str(scale_fault)
    assert "1 of 4 gradients" in str(scale_fault)
    assert "backs off, as designed" in scale_fault.cause()
    assert "the model, not the scale" in model_fault.cause() and FIXES in model_fault.cause()
    assert model_fault.summary() == "step 5 at scale 65536: fc2.weight (2 inf, 1 NaN)"
    assert model_fault.collapse_detail() == (
        f"Last overflow: {model_fault.summary()}. {model_fault.cause()}")
    assert "The loss itself was inf/NaN before scaling" in model_fault.collapse_detail()
    assert OverflowReport.from_dict(json.loads(json.dumps(model_fault.to_dict()))) == model_fault


@pytest.mark.parametrize("count, ending", [(2, "g1 (1 inf, 0 NaN)"),
                                           (3, "g2 (1 inf, 0 NaN)"),
                                           (4, "g2 (1 inf, 0 NaN) and 1 more")])
def test_summary_names_limit_gradients_and_counts_only_the_rest(count, ending):
    overflows = [GradientOverflow(f"g{i}", (2,), 1, 0, 1.0) for i in range(count)]
    summary = OverflowReport(7, 1024.0, overflows, checked=count).summary(limit=3)
    assert summary.startswith("step 7 at scale 1024: g0 (1 inf, 0 NaN), ")
    assert summary.endswith(ending)


def test_collapse_message_ends_with_the_detail_which_is_built_only_then():
    calls = []

    def detail():
        calls.append(1)
        return "Last overflow: step 2 at scale 2: fc1.weight (1 inf, 0 NaN)."

    monitor = CollapseMonitor(max_consecutive_skips=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor.observe(1, 8.0, True, detail)
        monitor.observe(2, 4.0, True, detail)
        assert not caught and not calls  # no collapse yet: the detail is not built
        monitor.observe(3, 2.0, True, detail)
    assert calls == [1]
    assert len(caught) == 1 and caught[0].category is ScaleCollapseWarning
    assert str(caught[0].message).endswith(detail())


def test_plot_command_draws_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    history = tmp_path / "history.json"
    ScaleHistory(range(1, 41), [2.0 ** (10 - (i > 20)) for i in range(40)],
                 [i == 20 for i in range(40)]).to_json(history)
    out = tmp_path / "scale.png"
    assert main(["plot", str(history), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "40 updates (from 1 to 40), 1 skipped, scale 512 to 1024" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ('{"iteration": [1]}', "is not a scale history"),
    ('{"iteration": [], "scale": [], "skipped": []}', "holds no update"),
])
def test_plot_command_fails_clearly_and_writes_nothing(tmp_path, capsys, content, message):
    history = tmp_path / "history.json"
    if content is not None:
        history.write_text(content)
    out = tmp_path / "scale.png"
    assert main(["plot", str(history), "-o", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_max_finite_is_a_float_even_when_infinite_values_are_all_there_is():
    over = count_overflow("w", np.array([np.inf, -np.inf]))
    assert over.max_finite == 0.0 and not math.isnan(over.max_finite)


@pytest.mark.parametrize("output, message", [
    ("scale.notaformat", "not supported"), ("missing-folder/scale.png", "does not exist"),
    ("a-folder", "names no image file"), ("no-suffix", "names no image file")])
def test_plot_command_fails_clearly_when_it_cannot_write(tmp_path, capsys, output, message):
    pytest.importorskip("matplotlib")
    (tmp_path / "a-folder").mkdir()
    history = tmp_path / "history.json"
    ScaleHistory([1, 2], [2.0, 1.0], [True, False]).to_json(history)
    before = sorted(os.listdir(tmp_path))
    assert main(["plot", str(history), "-o", str(tmp_path / output)]) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and message in err, err
    assert sorted(os.listdir(tmp_path)) == before  # no adir.png, no temp file


def test_a_report_that_counted_nothing_does_not_blame_the_scale():
    # Gradients gone (zero_grad before asking): nothing supports "the scale overflowed".
    empty = OverflowReport(4, 1024.0, [], checked=0, loss_finite=True)
    assert empty.cause() == "" and "as designed" not in str(empty)
    nan_loss = OverflowReport(4, 1024.0, [], checked=0, loss_finite=False)
    assert "the model, not the scale" in nan_loss.cause()


def test_a_history_file_of_an_earlier_release_is_read_as_the_scale_after_each_update(tmp_path):
    # An earlier release wrote the scale each update started from, with no marker: that is
    # the scale the update before it left. Record n takes record n + 1's scale; the last
    # (and one before a gap in the iterations) has no scale after it in the file.
    old = tmp_path / "old.json"
    old.write_text('{"iteration": [1, 2, 3, 5, 6], "scale": [8.0, 8.0, 4.0, 4.0, 8.0], '
                   '"skipped": [false, true, false, false, false]}')
    assert ScaleHistory.from_json(old).as_list() == [(1, 8.0, False), (2, 4.0, True),
                                                     (5, 8.0, False)]
    new = ScaleHistory([1, 2, 3], [8.0, 4.0, 4.0], [False, True, False])
    assert json.loads(new.to_json())["scale_after_update"] is True
    assert ScaleHistory.from_json(new.to_json()).as_list() == new.as_list()
    with pytest.raises(ValueError, match="scale_after_update must be true or false"):
        ScaleHistory.from_json('{"iteration": [1], "scale": [8.0], "skipped": [false], '
                               '"scale_after_update": "yes"}')


@pytest.mark.parametrize("bad,message", [
    ({}, r"missing \['step', 'scale', 'overflows', 'checked'\]"),
    ({"step": 1, "scale": 8.0, "checked": 1, "overflows": [{"nom": "w"}]},
     r"unexpected keyword argument 'nom'.*OverflowReport.to_dict\(\)"),
    ([1, 2], r"missing .*got list"),
])
def test_a_report_dict_that_to_dict_did_not_write_is_named(bad, message):
    from unifiedamp.diagnostics import OverflowReport

    with pytest.raises(ValueError, match=message):
        OverflowReport.from_dict(bad)
