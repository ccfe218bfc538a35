"""``unifiedamp port-state``, framework-free: a scaler state between canonical, torch, Paddle,
Keras and jmp forms, in dicts and in JSON and ``.npz`` checkpoint files; a run killed with
SIGKILL resumes from its last checkpoint as if it had never been killed; untrusted and
damaged ``.npz`` and ``.json`` files; writes that fail or are killed leave the checkpoint
whole.

The same for the files a framework writes, a run checkpointed in one framework resumed in
another, Lightning's and Keras's files: tests/<framework>/test_port_state.py,
tests/cross/test_port_state.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from port_state_files import (
    PLAIN,
    RICH,
    STATE,
    bits,
    canonical,
    check_checksum_refused,
    check_damaged_refused,
    check_no_code_runs_unless_trusted,
)

from unifiedamp.porting import (
    FORMS,
    convert_state,
    load_file,
    port_state_file,
    read_state,
    save_file,
)
from unifiedamp.spec import ScalerConfig, ScalerState

# ================================================================ conversions


@pytest.mark.parametrize("to", FORMS)
def test_every_form_round_trips_bit_exact_scale_and_int_trackers(to):
    out = convert_state(canonical(), to)
    config, state, form = read_state(out, PLAIN)
    assert form == to
    assert bits(state) == bits(STATE)
    assert type(state.growth_tracker) is int and type(state.hysteresis_tracker) is int
    assert config == PLAIN
    assert convert_state(out, "canonical", PLAIN)["config"] == PLAIN.to_dict()


@pytest.mark.parametrize(("src", "dst"), [(a, b) for a in FORMS for b in FORMS])
def test_every_pair_of_forms_converts_through_json_and_keeps_the_state(src, dst):
    # Through JSON, as a checkpoint would: arrays become lists, numbers Python numbers.
    first = json.loads(json.dumps(convert_state(canonical(), src), default=lambda a: a.tolist()))
    _, state, _ = read_state(convert_state(first, dst, PLAIN), PLAIN)
    assert bits(state) == bits(STATE)


def test_the_canonical_form_carries_a_config_no_native_form_can():
    rich = canonical(RICH, ScalerState(1024.0, 1, 1))
    back = convert_state(convert_state(rich, "canonical"), "canonical")
    assert back["config"] == RICH.to_dict() and back["hysteresis_tracker"] == 1


@pytest.mark.parametrize("to", ["canonical", "paddle", "keras"])
def test_forms_with_a_hysteresis_counter_keep_a_nonzero_tracker(to):
    # Two infs of three seen: the next inf backs off. A form that dropped the count
    # would back off one inf late.
    config = ScalerConfig(1024.0, growth_interval=3, hysteresis=3)
    state = ScalerState(512.0, 0, 2)
    out = convert_state(canonical(config, state), to)
    assert read_state(out, config)[:2] == (config, state)
    assert read_state(convert_state(out, "canonical", config))[1] == state


@pytest.mark.parametrize(("to", "lost"), [
    ("torch", "hysteresis=2, min_scale=0.5, max_scale=1048576.0"),
    ("paddle", "min_scale=0.5, max_scale=1048576.0"),
    ("jmp", "backoff_factor=0.7, hysteresis=2, max_scale=1048576.0"),
    ("flax", "hysteresis=2, max_scale=1048576.0"),
])
def test_a_form_that_cannot_carry_the_config_raises_naming_what_is_lost(to, lost):
    saved = canonical(RICH)
    before = json.dumps(saved)
    with pytest.raises(ValueError, match=f"the {to} form cannot carry {lost}: .*to='canonical'"):
        convert_state(saved, to)
    assert json.dumps(saved) == before


def test_a_disabled_scaler_has_no_native_form():
    with pytest.raises(ValueError, match="enabled=False"):
        convert_state(canonical(ScalerConfig(enabled=False)), "torch")


@pytest.mark.parametrize(("bad", "message"), [
    ({"scale": 1.0}, r"matches none of the forms|match none of the forms"),
    ({"scale": -1.0, "_growth_tracker": 0}, r"scale must be finite and >= 0"),
    ({"dynamic_scale": 8.0, "step_counter": -1}, r"growth_tracker must be an int >= 0"),
    ({"dynamic_scale": 8.0, "step_counter": 0, "hysteresis_counter": 1},
     r"hysteresis_counter=1 needs a config with hysteresis > 1.*pass config="),
    ({"loss_scale": 8.0, "counter": 0, "period": 3, "factor": 0.0, "min_loss_scale": 0.0},
     r"factor must be > 0, got factor=0.0"),
    ({"loss_scale": 8.0, "counter": 0}, r"missing \['period', 'factor', 'min_loss_scale'\]"),
    # Flax grows only at fin_steps == growth_interval: from past it, never; the spec at once.
    ({"fin_steps": 4, "scale": 8.0, "growth_interval": 3},
     r"fin_steps=4 is past DynamicScale's growth_interval=3: Flax's DynamicScale never grows"),
    ({"fin_steps": 1, "scale": 8.0, "growth_interval": -1},
     r"DynamicScale's growth_interval must be an int >= 0, got -1"),
    ({"fin_steps": -1, "scale": 8.0}, r"growth_tracker must be an int >= 0, got "),
])
def test_bad_input_raises_naming_the_value_and_changes_nothing(bad, message):
    before = repr(bad)
    with pytest.raises(ValueError, match=message):
        convert_state(bad, "canonical")
    assert repr(bad) == before


def test_an_unknown_target_form_names_the_closest():
    with pytest.raises(ValueError, match=r"got 'pytorch' \(did you mean 'torch'\?\)"):
        convert_state(canonical(), "pytorch")


# ================================================================ files


def test_a_checkpoint_entry_is_found_and_rewritten_keeping_the_rest(tmp_path):
    path = tmp_path / "ckpt.json"
    save_file({"step": 7, "model": [1.0, 2.0], "scaler": canonical()}, path)
    report = port_state_file(path, to="torch", in_place=True)
    assert (report["key"], report["from"], report["whole"]) == ("scaler", "canonical", True)
    saved = load_file(path)
    assert saved["step"] == 7 and saved["model"] == [1.0, 2.0]
    assert saved["scaler"] == convert_state(canonical(), "torch")


def test_an_ambiguous_or_missing_entry_asks_for_key_and_writes_nothing(tmp_path):
    path = tmp_path / "ckpt.json"
    save_file({"a": canonical(), "b": canonical()}, path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"found several: \['a', 'b'\]; pass key="):
        port_state_file(path, to="torch", in_place=True)
    with pytest.raises(ValueError, match=r"no key 'c'"):
        port_state_file(path, to="torch", key="c", in_place=True)
    assert path.read_bytes() == before
    assert port_state_file(path, to="jmp", key="b")["state_dict"]["counter"] == 2


def test_npz_keeps_the_keras_scale_in_float32_and_refuses_the_canonical_form(tmp_path):
    save_file(convert_state(canonical(), "keras"), tmp_path / "k.npz")
    assert load_file(tmp_path / "k.npz")["dynamic_scale"].dtype == np.float32
    with pytest.raises(ValueError, match="flat numeric arrays.*json"):
        save_file(canonical(), tmp_path / "c.npz")
    assert os.listdir(tmp_path) == ["k.npz"]  # no temp file left behind


def test_cli_converts_prints_a_summary_and_reports_errors(tmp_path):
    src = tmp_path / "s.json"
    save_file({"opt": {"dynamic_scale": 512.0, "step_counter": 1}}, src)
    cli = [sys.executable, "-m", "unifiedamp.cli", "port-state"]
    ok = subprocess.run([*cli, str(src), "--to", "jmp", "-o", str(tmp_path / "j.json"),
                         "--config", '{"growth_interval": 3}'], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "entry 'opt', keras form" in ok.stdout and "wrote" in ok.stdout
    assert load_file(tmp_path / "j.json")["opt"]["period"] == 3
    bad = subprocess.run([*cli, str(src), "--to", "torch", "--key", "nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "error: " in bad.stderr and "no key 'nope'" in bad.stderr


# ================================================================ SIGKILL

KILLABLE = r'''
import json, os, sys, time
import numpy as np
import unifiedamp as ua
from unifiedamp.backends.numpy import SGD
from unifiedamp.porting import load_file, save_file

ckpt, pattern, every, stop_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = np.ones((2, 4), np.float32); y = np.ones((2, 1), np.float32)
w = np.full((4, 1), 0.1, np.float32); opt = SGD([w], lr=0.01)
scaler = ua.GradScaler(1024.0, growth_interval=3, hysteresis=2, backend="numpy")
start = 0
if os.path.exists(ckpt):
    saved = load_file(ckpt)
    start = saved["step"]
    w[...] = np.asarray(saved["w"], np.float32)
    scaler.load_state_dict(saved["scaler"])
for i in range(start, len(pattern)):
    xb = x.copy()
    if pattern[i] == "I":
        xb[0, 0] = np.inf
    with np.errstate(all="ignore"):
        opt.grads = [(xb.T @ (scaler.scale(np.float32(2.0)) * (xb @ w - y) / 2)).astype(np.float32)]
    scaler.step(opt); scaler.update()
    st = scaler.state
    if (i + 1) % every == 0:
        save_file({"step": i + 1, "w": w.tolist(), "scaler": scaler.state_dict()}, ckpt)
    print(json.dumps([i + 1, st.scale, st.growth_tracker, st.hysteresis_tracker,
                      w.ravel().tolist()]), flush=True)
    if i + 1 == stop_after:
        time.sleep(600)  # the parent kills it here, between two checkpoints
'''


def test_a_run_killed_with_sigkill_resumes_from_its_last_checkpoint_as_if_never_killed(tmp_path):
    pattern, every = "FFIFFIIFFFFIFIIFFFFF", 4
    ckpt = tmp_path / "ckpt.json"
    run = [sys.executable, "-c", KILLABLE, str(ckpt), pattern, str(every)]

    never_killed = subprocess.run([*run, "0"], capture_output=True, text=True, timeout=120,
                                  cwd=tmp_path)
    assert never_killed.returncode == 0, never_killed.stderr
    reference = [json.loads(line) for line in never_killed.stdout.splitlines()]
    ckpt.unlink()

    proc = subprocess.Popen([*run, "10"], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    seen = []
    for line in proc.stdout:
        seen.append(json.loads(line))
        if seen[-1][0] == 10:  # checkpointed at 8, two steps since
            os.kill(proc.pid, signal.SIGKILL)
            break
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert load_file(ckpt)["step"] == 8
    assert [p for p in os.listdir(tmp_path) if "unifiedamp-tmp-" in p] == []

    resumed = subprocess.run([*run, "0"], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    after = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert after[0][0] == 9
    assert seen == reference[:10]
    assert after == reference[8:]  # scale, trackers and weights, step by step


# ================================================================ untrusted files
# (the files torch, paddle and flax write: tests/torch, tests/paddle, tests/jax)


@pytest.mark.parametrize("name", ["f.npz"])
def test_no_checkpoint_runs_code_unless_the_user_trusts_it(tmp_path, name):
    check_no_code_runs_unless_trusted(tmp_path, name)


def test_the_trust_flags_help_says_it_runs_the_files_code():
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", "--help"],
                          capture_output=True, text=True)
    help_text = " ".join(proc.stdout.split())
    assert "--trust run the file's own code" in help_text
    # format by format, what it runs
    for words in ("torch.load(weights_only=False)", "paddle.load", ".npz object arrays are "
                  "unpickled (np.load(allow_pickle=True))", "safe_mode=False",
                  ".json and .msgpack run no code"):
        assert words in help_text, words


@pytest.mark.parametrize("name,member", [("w.npz", "weight.npy")])
def test_a_checkpoint_whose_data_fails_its_own_checksum_is_refused(tmp_path, name, member):
    check_checksum_refused(tmp_path, name, member)


@pytest.mark.parametrize("ext", [".npz", ".json"])
def test_an_empty_truncated_or_foreign_file_is_refused_naming_it(tmp_path, ext):
    check_damaged_refused(tmp_path, ext)


def test_deeply_nested_json_is_refused_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested deeper than Python's recursion limit"):
        port_state_file(path, to="canonical")


@pytest.mark.parametrize("form", [
    {"_growth_tracker": 1, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3},
    {"incr_count": 1, "decr_count": 0, "incr_ratio": 2.0},
])
def test_a_native_state_without_scale_is_refused_naming_the_key(form):
    with pytest.raises(ValueError, match=r"needs 'scale'.*nothing was loaded"):
        convert_state(form, "canonical")


# ================================================================ writes


def _checkpoint(path):
    save_file({"step": 3, "scaler": canonical(), "blob": np.zeros(100_000, np.float32)}
              if path.suffix == ".npz" else {"step": 3, "scaler": canonical(),
                                             "blob": list(range(20_000))}, path)


def _temps(folder):
    return [p for p in os.listdir(folder) if "unifiedamp-tmp-" in p]


def test_in_place_through_a_symlink_rewrites_the_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "store" / "ckpt.json"
    real.parent.mkdir()
    _checkpoint(real)
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    port_state_file(link, to="torch", in_place=True)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "_growth_tracker" in load_file(real)["scaler"]
    assert _temps(tmp_path) == [] and _temps(real.parent) == []


WRITE_UNDER_LIMIT = r'''
import resource, sys
from unifiedamp.porting import port_state_file
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    port_state_file(sys.argv[1], to="torch", in_place=True)
except OSError as exc:
    print("refused:", exc)
    sys.exit(3)
'''

KILLED_WHILE_WRITING = r'''
import os, signal, sys, json
from unifiedamp.porting import _checkpoints
real_dumps = json.dumps
def dumps_then_die(*args, **kwargs):
    text = real_dumps(*args, **kwargs)
    sys.stdout.write("writing\n"); sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
_checkpoints.json.dumps = dumps_then_die
_checkpoints.port_state_file(sys.argv[1], to="torch", in_place=True)
'''


def test_a_write_stopped_by_a_full_disk_or_sigkill_leaves_the_checkpoint_whole(tmp_path):
    path = tmp_path / "ckpt.json"
    _checkpoint(path)
    before = path.read_bytes()
    assert len(before) > 4096
    # A file-size limit (a full disk): the write fails, the original stays byte for byte.
    proc = subprocess.run([sys.executable, "-c", WRITE_UNDER_LIMIT, str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    assert path.read_bytes() == before and _temps(tmp_path) == []
    # SIGKILL after the temp file exists: the original is whole, the temp left behind...
    proc = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL and "writing" in proc.stdout
    assert path.read_bytes() == before and len(_temps(tmp_path)) == 1
    # ...and removed by the next write to that file.
    port_state_file(path, to="torch", in_place=True)
    assert _temps(tmp_path) == [] and "_growth_tracker" in load_file(path)["scaler"]
