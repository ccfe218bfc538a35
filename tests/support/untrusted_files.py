"""What the ``test_untrusted_files.py`` files of the sessions share: the crafted attack files
(each refused clearly by the API and the CLI), the fuzz run's reader process, and helpers of
the write checks. Each check runs in the session of the framework that writes and reads its
files (torch.save's zip: torch; paddle.save's pickles: the fuzz run's oracle is paddle.load;
flax msgpack: jax; pickles read without paddle, ``.npz`` and ``.json``: core).

The fuzz run feeds mutated and generated files to the readers in a child process under
memory and CPU limits on purpose: the behaviour under test includes crashes and memory
blow-ups, which must end there, reported, not in the test's process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import crafted_checkpoints as crafted
import pytest

from unifiedamp.porting import load_file

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


#: The crafted files each session reads: torch.save's (torch reads them) in torch's, the
#: rest (paddle.save's pickles, read without paddle, and .npz) in core.
TORCH_CASES = sorted(name for name in CASES if name.endswith(".pt"))
CORE_CASES = sorted(name for name in CASES if name not in TORCH_CASES)


def check_crafted_refused(tmp_path, name):
    """A crafted file is refused clearly (naming the file and what it holds, in under 5 s) by
    the API and by the CLI (exit status 2, no traceback), the file untouched, no code run."""
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


def run_child(folder, frameworks):
    """The reader's process over every file of ``folder``, ``frameworks`` imported first;
    its summary (failures, outcomes, the slowest read)."""
    proc = subprocess.run([sys.executable, "-c", FUZZ_CHILD, str(folder), frameworks],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the reader's process died ({proc.returncode}): " \
                                 f"{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mutants(seeds, count, rng):
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


def canonical_file(path):
    from unifiedamp import spec
    from unifiedamp.porting import save_file
    from unifiedamp.spec import ScalerConfig, ScalerState

    save_file({"step": 3, "scaler": spec.to_state_dict(
        ScalerConfig(1024.0, growth_interval=3), ScalerState(1024.0, 1, 0), "numpy")}, path)


def port_state(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", *map(str, args)],
                          capture_output=True, text=True, timeout=120, **kwargs)


