"""Untrusted checkpoint files: each crafted attack is refused with a clear error, by the
Python API and by ``unifiedamp port-state``, leaving the file as it was; a fuzz run feeds
thousands of mutated and generated pickles, zip archives and JSON texts to the readers in
a child process under memory and CPU limits (the behaviour under test includes crashes):
each ends in the data the trusted path reads, or in a clear error, never in code, a crash
or work past the caps.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import subprocess
import sys
import time

import crafted_checkpoints as crafted
import numpy as np
import pytest

from unifiedamp.porting import ReadLimits, load_file

CASES = {
    # name: (bytes builder of a marker path for code to touch, words the error holds)
    "void-dtype.pdparams": (lambda m: crafted.void_dtype_resized(), "numpy.dtype('V8'"),
    "dtype-twice.pdparams": (lambda m: crafted.numeric_dtype_resized(), "numpy dtype state"),
    "ordered-dict-build.pdparams": (lambda m: crafted.ordered_dict_attribute(), "BUILD"),
    "shared-children.pdparams": (lambda m: crafted.shared_children(), "max_entries"),
    "zero-stride-set.pdparams": (lambda m: crafted.zero_stride_set(), "a call of numpy.ndarray"),
    "huge-frame.pdparams": (lambda m: crafted.huge_frame(), "cannot be read as a paddle.save file"),
    "huge-bytes.pdopt": (lambda m: crafted.huge_bytes(), "cannot be read as a paddle.save file"),
    "eval-code.pdparams": (crafted.eval_payload, "eval() call"),
    "eval-namespace.pdparams": (lambda m: crafted.eval_extra_namespace(), "eval() call"),
    "system.pdckpt": (crafted.system_payload, "posix.system"),
    "bomb.pt": (lambda m: crafted.zip_bomb(".pt"), "max_unpack_ratio"),
    "bomb.npz": (lambda m: crafted.zip_bomb(".npz"), "max_unpack_ratio"),
    "npy-header.npz": (lambda m: crafted.npy_header_lies(),
                       "declares an array of 4,398,046,511,104"),
    "bytearray.pt": (lambda m: crafted.torch_bytearray(), "builtins.bytearray"),
    "zero-stride-set.pt": (lambda m: crafted.torch_zero_stride(), "1,000,000,000 elements"),
}


def _write(tmp_path, name):
    build, words = CASES[name]
    marker = tmp_path / "code-ran"
    path = tmp_path / name
    path.write_bytes(build(str(marker)))
    return path, marker, words


@pytest.mark.framework("torch")
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_crafted_file_is_refused_clearly_by_the_api_and_the_cli(tmp_path, name):
    path, marker, words = _write(tmp_path, name)
    before = path.read_bytes()
    started = time.monotonic()
    with pytest.raises(ValueError) as info:
        load_file(path)
    message = str(info.value)
    assert str(path) in message and words in message and "nothing was read" in message
    assert time.monotonic() - started < 5
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", str(path),
                           "--to", "torch", "--in-place"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert str(path) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert path.read_bytes() == before and not marker.exists()


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


# ================================================================ the fuzz run

FUZZ_CHILD = r'''
import json, os, random, resource, sys, time, traceback
import numpy as np
frameworks = sys.argv[2].split(",")
for name in frameworks:
    __import__(name)
from unifiedamp.porting import load_file
folder = sys.argv[1]
# The bounds: what the process has now plus 3 GiB of address space; 240 s of CPU.
with open("/proc/self/statm") as f:
    pages = int(f.read().split()[0])
resource.setrlimit(resource.RLIMIT_AS, (pages * resource.getpagesize() + (3 << 30),) * 2)
resource.setrlimit(resource.RLIMIT_CPU, (240, 240))

def trusted(path):
    if path.endswith((".pdparams", ".pdopt")):
        import paddle
        return paddle.load(path, return_numpy=True)
    return load_file(path, trusted=True)

def same(a, b):
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)) \
            or hasattr(a, "numpy"):
        a, b = (x.numpy() if hasattr(x, "numpy") else np.asarray(x) for x in (a, b))
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if type(a) is not type(b) and not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b

failures, slowest = [], 0.0
outcomes = {"data": 0, "error": 0, "data, refused by the trusted path": 0}
for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name)
    started = time.process_time()
    try:
        ours = load_file(path)
    except ValueError as exc:
        outcomes["error"] += 1
        if path not in str(exc):
            failures.append(f"{name}: an error that does not name the file: {exc}")
    except BaseException as exc:
        failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
    else:
        outcomes["data"] += 1
        try:
            theirs = trusted(path)
        except Exception:  # paddle.load refuses some plain data (bytes): nothing to compare
            outcomes["data, refused by the trusted path"] += 1
        else:
            if not same(ours, theirs):
                failures.append(f"{name}: {str(ours)[:150]} != trusted {str(theirs)[:150]}")
    slowest = max(slowest, time.process_time() - started)
print(json.dumps({"failures": failures[:60], "count": len(failures), "outcomes": outcomes,
                  "slowest": slowest}))
'''


def _paddle_seeds():
    """Pickles as paddle.save writes them (protocols 2-4), and plain data at protocols 0-5."""
    from numpy._core.multiarray import _reconstruct

    f32 = crafted.Reduce(np.dtype, ("f4", False, True), (3, "<", None, None, None, -1, -1, 0))
    arr = crafted.Reduce(_reconstruct, (np.ndarray, (0,), b"b"),
                         (1, (2,), f32, False, np.array([1.0, 2.0], np.float32).tobytes()))
    tensor = crafted.Reduce(tuple, (("generated_tensor_0", arr),))
    dense = crafted.Reduce(eval, ("data", {"data": arr}))
    states = [
        {"scale": tensor, "incr_count": 3, "decr_count": 0},
        {"m": {"w": tensor, "b": [tensor, 1.5, None, True, "x", (1, 2)]}, "d": dense},
        {"big": np.arange(40, dtype=np.float64).reshape(5, 8), "f": np.asfortranarray(
            np.arange(12, dtype=np.int16).reshape(3, 4)), "s": np.float32(3.5),
         "c": np.complex64(1 + 2j), "set": {1, 2, 3}, "fs": frozenset({"a"}),
         "bytes": b"\x00\xff", "long": 2**80, "neg": -7, "cx": 1 - 1j},
    ]
    seeds = [pickle.dumps(state, protocol=p) for p in range(6) for state in states]
    # Opcodes today's pickler no longer writes (or writes only for huge values), by hand:
    # Python 2's strings, 8-byte lengths, 2-byte ints, long memo slots, DUP and the POPs.
    seeds += [
        b"\x80\x02(S'py2'\nU\x03abcT\x02\x00\x00\x00hiM\x01\x02t.",
        b"\x80\x04\x8d\x03\x00\x00\x00\x00\x00\x00\x00abc"
        b"\x8e\x02\x00\x00\x00\x00\x00\x00\x00xy\x86.",
        b"\x80\x02\x8b\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"
        b"r\x05\x00\x00\x00j\x05\x00\x00\x00\x86.",
        b"\x80\x02]K\x010(K\x0312K\x05a0.",
    ]
    return seeds


def _opcode_payloads(marker):
    """One pickle per way a pickle can name or call code: each must be refused."""
    class Obj:  # INST / OBJ (protocols 0 and 1 of an old-style __reduce__-less class)
        pass

    touch = f"touch {marker}"
    payloads = [
        pickle.dumps(crafted.Reduce(os.system, (touch,)), protocol=p) for p in range(6)]
    payloads += [
        pickle.dumps(crafted.Reduce(eval, (f"__import__('os').system({touch!r})", {})),
                     protocol=4),
        pickle.dumps(crafted.Reduce(eval, ("data", {"data": crafted.Reduce(
            os.system, (touch,))})), protocol=4),
        pickle.dumps(crafted.Reduce(getattr, (crafted.Reduce(__import__, ("os",)), "system")),
                     protocol=4),
        pickle.dumps(crafted.Reduce(subprocess.call, ([touch],)), protocol=2),
        b"(i__main__\nObj\n(dp0\nb.", b"\x80\x02(c__main__\nObj\noq\x00}b.",
        b"\x80\x02c__main__\nObj\n)\x81.", b"\x80\x04c__main__\nObj\n)}\x92.",
        b"\x80\x02\x82\x01.", b"\x80\x02\x83\x01\x00.", b"\x80\x02\x84\x01\x00\x00\x00.",
        b"Pabc\n.", b"\x80\x02X\x03\x00\x00\x00abcQ.", b"\x80\x05\x97.", b"\x80\x05\x98.",
        b"\x80\x05\x96\x03\x00\x00\x00\x00\x00\x00\x00abc.",
    ]
    del Obj
    return payloads


def _mutants(seeds, count, rng):
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            where = rng.randrange(max(len(data), 1))
            kind = rng.random()
            if kind < 0.4 and data:
                data[where] = rng.randrange(256)
            elif kind < 0.55:
                data[where:where] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
            elif kind < 0.7:
                del data[where:where + rng.randint(1, 16)]
            elif kind < 0.8:
                data = data[:where]
            elif kind < 0.9:  # a length field made huge
                data[where:where + 4] = b"\xff\xff\xff\x7f"
            else:
                other = rng.choice(seeds)
                start = rng.randrange(max(len(other), 1))
                data[where:where] = other[start:start + rng.randint(1, 40)]
        out.append(bytes(data))
    return out


def _run_child(folder, frameworks):
    proc = subprocess.run([sys.executable, "-c", FUZZ_CHILD, str(folder), frameworks],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the reader's process died ({proc.returncode}): " \
                                 f"{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_fuzzed_pickles_and_json_end_in_the_trusted_data_or_a_clear_error(tmp_path):
    import random

    rng = random.Random(57)
    marker = tmp_path / "code-ran"
    folder = tmp_path / "inputs"
    folder.mkdir()
    seeds = _paddle_seeds()
    payloads = _opcode_payloads(marker)
    # Every opcode pickle has is in the corpus, so each is interpreted or refused.
    seen = {op.name for data in seeds + payloads for op, _, _ in pickletools.genops(data)}
    assert {op.name for op in pickletools.opcodes} - seen == set()
    corpus = seeds + payloads + _mutants(seeds + payloads, 8000, rng)
    for i, data in enumerate(corpus):
        (folder / f"p{i:05d}.pdparams").write_bytes(data)
    texts = [json.dumps({"scale": 8.0, "x": [1, {"y": None}], "s": "\u00e9"}),
             "[" * 5000 + "]" * 5000, '{"a": 1e999999}', '{"a": "\\ud800"}']
    for i, text in enumerate(_mutants([t.encode() for t in texts], 1000, rng) + texts):
        (folder / f"j{i:05d}.json").write_bytes(text if isinstance(text, bytes)
                                                else text.encode())
    result = _run_child(folder, "paddle")
    assert result["count"] == 0, result
    assert not marker.exists()
    assert result["outcomes"]["data"] > 50 and result["outcomes"]["error"] > 1000, result
    assert result["slowest"] < 2.0, result


@pytest.mark.slow
@pytest.mark.framework("torch")
def test_fuzzed_zip_archives_end_in_the_trusted_data_or_a_clear_error(tmp_path):
    import io
    import random

    import torch

    rng = random.Random(58)
    folder = tmp_path / "inputs"
    folder.mkdir()
    seeds = []
    for state in ({"scaler": {"scale": 1024.0, "_growth_tracker": 2}, "w": torch.arange(6.0)},
                  {"MixedPrecision": {"scale": 8.0}, "o": {"m": [torch.ones(2, 2), 3]}}):
        for zipped in (True, False):  # torch's format, and the legacy one before 1.6
            buf = io.BytesIO()
            torch.save(state, buf, _use_new_zipfile_serialization=zipped)
            seeds.append(buf.getvalue())
    buf = io.BytesIO()
    np.savez(buf, scale=np.float32(8.0), _growth_tracker=np.int64(1), w=np.arange(5.0))
    npz = buf.getvalue()
    for i, data in enumerate(seeds + _mutants(seeds, 1500, rng)):
        (folder / f"t{i:05d}.pt").write_bytes(data)
    for i, data in enumerate([npz, *_mutants([npz], 500, rng)]):
        (folder / f"n{i:05d}.npz").write_bytes(data)
    result = _run_child(folder, "torch")
    assert result["count"] == 0, result
    assert result["outcomes"]["data"] >= 4 and result["outcomes"]["error"] > 1000, result
    assert result["slowest"] < 2.0, result


# ================================================================ writes


def _canonical_file(path):
    from unifiedamp import spec
    from unifiedamp.porting import save_file
    from unifiedamp.spec import ScalerConfig, ScalerState

    save_file({"step": 3, "scaler": spec.to_state_dict(
        ScalerConfig(1024.0, growth_interval=3), ScalerState(1024.0, 1, 0), "numpy")}, path)


def _port_state(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", *map(str, args)],
                          capture_output=True, text=True, timeout=120, **kwargs)


def test_a_rewrite_keeps_the_files_mode_and_a_new_file_follows_the_umask(tmp_path):
    from unifiedamp.porting import port_state_file

    path = tmp_path / "ckpt.json"
    _canonical_file(path)
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
    _canonical_file(path)
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
    _canonical_file(path)
    os.link(path, tmp_path / "other-name.json")
    before = path.read_bytes()
    proc = _port_state(path, "--to", "torch", "--in-place")
    assert proc.returncode == 2 and "has 2 hard links" in proc.stderr, proc.stderr
    assert path.read_bytes() == before == (tmp_path / "other-name.json").read_bytes()
    assert os.stat(path).st_ino == os.stat(tmp_path / "other-name.json").st_ino


def test_in_place_with_an_output_is_refused_and_nothing_is_written(tmp_path):
    path = tmp_path / "s.json"
    _canonical_file(path)
    before = path.read_bytes()
    proc = _port_state(path, "--to", "torch", "--in-place", "-o", tmp_path / "other.json")
    assert proc.returncode == 2 and "give one of them" in proc.stderr, proc.stderr
    assert path.read_bytes() == before and not (tmp_path / "other.json").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")
def test_a_link_another_user_planted_in_a_sticky_shared_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    victim = tmp_path / "victim.json"
    _canonical_file(victim)
    before = victim.read_bytes()
    link = shared / "ckpt.json"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    proc = _port_state(link, "--to", "torch", "--in-place")
    assert proc.returncode == 2 and "fs.protected_symlinks" in proc.stderr, proc.stderr
    assert victim.read_bytes() == before
    os.lchown(link, os.geteuid(), os.getegid())  # this user's own link is written through
    assert _port_state(link, "--to", "torch", "--in-place").returncode == 0
    assert link.is_symlink() and b"_growth_tracker" in victim.read_bytes()


def test_config_fields_the_file_carries_are_refused_when_they_differ(tmp_path):
    path = tmp_path / "s.json"
    _canonical_file(path)  # carries growth_interval=3
    before = path.read_bytes()
    proc = _port_state(path, "--to", "torch", "--in-place", "--config",
                       '{"growth_interval": 5}')
    assert proc.returncode == 2, proc.stderr
    assert "growth_interval=5 (the file's: 3)" in proc.stderr and path.read_bytes() == before
    agree = _port_state(path, "--to", "torch", "--in-place", "--config",
                        '{"growthInterval": 3}')
    assert agree.returncode == 0, agree.stderr
    from unifiedamp.porting import port_state_file
    from unifiedamp.spec import ScalerConfig

    with pytest.raises(ValueError, match=r"config says growth_interval=5 \(the file's: 3\)"):
        port_state_file(path, to="torch", in_place=True,
                        config=ScalerConfig(growth_interval=5), config_fields=["growth_interval"])
    deep = _port_state(path, "--to", "torch", "--config", "[" * 5000)
    assert deep.returncode == 2 and "Traceback" not in deep.stderr, deep.stderr
    assert "--config is nested deeper" in deep.stderr


@pytest.mark.framework("torch")
def test_a_writers_own_failure_names_the_file_and_leaves_it_whole(tmp_path):
    import resource

    import torch

    path = tmp_path / "ck.pt"
    torch.save({"scaler": {"scale": 1024.0, "_growth_tracker": 0},
                "w": torch.zeros(4096)}, path)
    before = path.read_bytes()

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    proc = _port_state(path, "--to", "canonical", "--in-place", preexec_fn=limit)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{path}: writing it failed" in proc.stderr and "nothing was written" in proc.stderr
    assert path.read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if "unifiedamp-tmp-" in p]


@pytest.mark.slow
def test_fuzzed_msgpack_files_end_in_data_or_a_clear_error(tmp_path):
    import random

    serialization = pytest.importorskip("flax.serialization")
    rng = random.Random(59)
    folder = tmp_path / "inputs"
    folder.mkdir()
    seeds = [serialization.msgpack_serialize(state) for state in (
        {"scale": np.float32(1024.0), "growth_tracker": np.int32(3)},
        {"opt": {"mu": [np.arange(6.0).reshape(2, 3), np.ones(4, np.float16)]}, "step": 7},
        {"dynamic_scale": {"scale": np.float32(8.0), "fin_steps": np.int32(1)}})]
    deep = b"\x91" * 5000 + b"\xc0"  # 5,000 nested one-element arrays
    for i, data in enumerate([*seeds, deep, *_mutants(seeds, 1500, rng)]):
        (folder / f"m{i:05d}.msgpack").write_bytes(data)
    result = _run_child(folder, "flax")
    assert result["count"] == 0, result
    assert result["outcomes"]["data"] >= 3 and result["outcomes"]["error"] > 500, result
    assert result["slowest"] < 2.0, result
