"""Untrusted checkpoint files, framework-free: each crafted attack on a reader that needs no
framework (paddle.save's pickles, read by unifiedamp's own pickle reader; ``.npz``) is refused
with a clear error by the Python API and by ``unifiedamp port-state``, leaving the file as it
was; the caps name how to lift them; nesting past the depth cap is refused in every reader;
writes keep a file's mode, sweep only dead writers' temp files, refuse hard links, other
users' links and config fields the file contradicts.

torch.save's files, and the fuzz runs (a child process under memory and CPU limits, where a
crash is the behaviour under test): tests/torch, tests/paddle and tests/jax's
test_untrusted_files.py.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import crafted_checkpoints as crafted
import pytest
from untrusted_files import CORE_CASES, canonical_file, check_crafted_refused, port_state

from unifiedamp.porting import ReadLimits, load_file


@pytest.mark.parametrize("name", CORE_CASES)
def test_a_crafted_file_is_refused_clearly_by_the_api_and_the_cli(tmp_path, name):
    check_crafted_refused(tmp_path, name)


def test_a_cap_is_named_with_how_to_lift_it_and_lifting_it_reads_the_file(tmp_path):
    path = tmp_path / "shared.pdparams"
    path.write_bytes(crafted.shared_children(levels=12))  # 2**13 paths: a few thousand
    with pytest.raises(ValueError, match=r"max_entries=100 .*ReadLimits\(max_entries=\.\.\.\)"
                                         r" \(CLI: --limit max_entries=N"):
        load_file(path, limits=ReadLimits(max_entries=100))
    assert load_file(path)["tree"]["a"]["b"]["a"]  # within the default cap, read
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", str(path),
                           "--to", "canonical", "--limit", "max_entries=100"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--limit max_entries=N" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", str(path),
                           "--to", "canonical", "--limit", "max_entrees=100"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no cap named 'max_entrees'" in proc.stderr


def test_nesting_past_the_depth_cap_is_refused_in_every_reader(tmp_path):
    deep: list = []
    for _ in range(150):
        deep = [deep]
    (tmp_path / "deep.json").write_text(json.dumps({"scale": 8.0, "x": deep}))
    with open(tmp_path / "deep.pdparams", "wb") as f:
        pickle.dump({"scale": 8.0, "x": deep}, f, protocol=4)
    for name in ("deep.json", "deep.pdparams"):
        with pytest.raises(ValueError, match="max_depth=100"):
            load_file(tmp_path / name)
        assert load_file(tmp_path / name, limits=ReadLimits(max_depth=200))["scale"] == 8.0


# ================================================================ writes


def test_a_rewrite_keeps_the_files_mode_and_a_new_file_follows_the_umask(tmp_path):
    from unifiedamp.porting import port_state_file

    path = tmp_path / "ckpt.json"
    canonical_file(path)
    os.chmod(path, 0o640)
    port_state_file(path, to="torch", in_place=True)
    assert os.stat(path).st_mode & 0o7777 == 0o640
    old = os.umask(0o027)
    try:
        port_state_file(path, tmp_path / "new.json", to="torch")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "new.json").st_mode & 0o7777 == 0o640  # 0o666 & ~0o027


def test_the_temp_sweep_keeps_a_live_writers_file_and_a_stray_name_blocks_nothing(tmp_path):
    from unifiedamp.porting import port_state_file

    path = tmp_path / "st2.json"
    canonical_file(path)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    try:
        names = {"live": f".st2.json.unifiedamp-tmp-{live.pid}-abc.json",
                 "dead": f".st2.json.unifiedamp-tmp-{dead}-abc.json",
                 "stray": ".st2.json.unifiedamp-tmp-99999999999999999999-x.json"}
        for name in names.values():
            (tmp_path / name).write_text("partial")
        port_state_file(path, to="torch", in_place=True)
        left = set(os.listdir(tmp_path))
        assert names["live"] in left and names["stray"] in left
        assert names["dead"] not in left
    finally:
        live.kill()
        live.wait()


def test_a_hard_linked_target_is_refused_and_every_name_keeps_its_content(tmp_path):
    path = tmp_path / "ckpt.json"
    canonical_file(path)
    os.link(path, tmp_path / "other-name.json")
    before = path.read_bytes()
    proc = port_state(path, "--to", "torch", "--in-place")
    assert proc.returncode == 2 and "has 2 hard links" in proc.stderr, proc.stderr
    assert path.read_bytes() == before == (tmp_path / "other-name.json").read_bytes()
    assert os.stat(path).st_ino == os.stat(tmp_path / "other-name.json").st_ino


def test_in_place_with_an_output_is_refused_and_nothing_is_written(tmp_path):
    path = tmp_path / "s.json"
    canonical_file(path)
    before = path.read_bytes()
    proc = port_state(path, "--to", "torch", "--in-place", "-o", tmp_path / "other.json")
    assert proc.returncode == 2 and "give one of them" in proc.stderr, proc.stderr
    assert path.read_bytes() == before and not (tmp_path / "other.json").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")
def test_a_link_another_user_planted_in_a_sticky_shared_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    victim = tmp_path / "victim.json"
    canonical_file(victim)
    before = victim.read_bytes()
    link = shared / "ckpt.json"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    proc = port_state(link, "--to", "torch", "--in-place")
    assert proc.returncode == 2 and "fs.protected_symlinks" in proc.stderr, proc.stderr
    assert victim.read_bytes() == before
    os.lchown(link, os.geteuid(), os.getegid())  # this user's own link is written through
    assert port_state(link, "--to", "torch", "--in-place").returncode == 0
    assert link.is_symlink() and b"_growth_tracker" in victim.read_bytes()


def test_config_fields_the_file_carries_are_refused_when_they_differ(tmp_path):
    path = tmp_path / "s.json"
    canonical_file(path)  # carries growth_interval=3
    before = path.read_bytes()
    proc = port_state(path, "--to", "torch", "--in-place", "--config",
                       '{"growth_interval": 5}')
    assert proc.returncode == 2, proc.stderr
    assert "growth_interval=5 (the file's: 3)" in proc.stderr and path.read_bytes() == before
    agree = port_state(path, "--to", "torch", "--in-place", "--config",
                        '{"growthInterval": 3}')
    assert agree.returncode == 0, agree.stderr
    from unifiedamp.porting import port_state_file
    from unifiedamp.spec import ScalerConfig

    with pytest.raises(ValueError, match=r"config says growth_interval=5 \(the file's: 3\)"):
        port_state_file(path, to="torch", in_place=True,
                        config=ScalerConfig(growth_interval=5), config_fields=["growth_interval"])
    deep = port_state(path, "--to", "torch", "--config", "[" * 5000)
    assert deep.returncode == 2 and "Traceback" not in deep.stderr, deep.stderr
    assert "--config is nested deeper" in deep.stderr
