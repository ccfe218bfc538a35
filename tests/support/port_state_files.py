"""What the ``test_port_state.py`` files of the sessions share (``unifiedamp port-state``): the
configs and state the conversions use, and the checks of untrusted and damaged checkpoint
files, each run in the session of the framework that writes and reads the file (``.pt`` and
``.ckpt``: torch; ``.pdparams``, ``.pdopt`` and ``.pdckpt``: paddle; ``.msgpack``: flax, in
the jax session; ``.npz`` and ``.json``: core).

Imports no framework: each helper imports the one that writes its file.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from unifiedamp import spec
from unifiedamp.porting import load_file, save_file
from unifiedamp.spec import ScalerConfig, ScalerState

# A config every form carries, and one only the canonical form does.
PLAIN = ScalerConfig(1024.0, growth_interval=3)
RICH = ScalerConfig(1024.0, 1.5, 0.7, 3, hysteresis=2, min_scale=0.5, max_scale=2.0**20)
# A scale with every mantissa bit set (float32-exact), mid-interval trackers.
STATE = ScalerState(spec.f32_from_bits(0x447FFFFF), 2, 0)


def canonical(config=PLAIN, state=STATE):
    return spec.to_state_dict(config, state, "numpy")


def bits(state: ScalerState):
    return spec.f32_bits(state.scale), state.growth_tracker, state.hysteresis_tracker


# ---------------------------------------------------------------- code in a checkpoint


class _Payload:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant_payload(path, marker):
    state = {"scale": np.array([1024.0], np.float32), "incr_count": 0, "decr_count": 0}
    if path.suffix == ".npz":
        np.savez(path, scale=np.float32(1024.0), _growth_tracker=np.int64(0),
                 payload=np.array([_Payload(marker)], dtype=object))
    elif path.suffix in (".pdparams", ".pdopt", ".pdckpt"):
        import pickle

        with open(path, "wb") as f:  # paddle.save's own format: a protocol-4 pickle
            pickle.dump({"scaler": state, "payload": _Payload(marker)}, f, protocol=4)
    else:
        import torch

        torch.save({"scaler": {"scale": 1024.0, "_growth_tracker": 0},
                    "payload": _Payload(marker)}, path)


def check_no_code_runs_unless_trusted(tmp_path, name):
    """A checkpoint holding code is refused by the API and the CLI, nothing runs and the
    file stays as it was; the payload is live: the trust flag runs it, as its help says."""
    path, marker = tmp_path / name, tmp_path / "code-ran"
    _plant_payload(path, marker)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"(system|object arrays).*trusted=True; CLI: "
                                         r"--trust\); nothing was read"):
        load_file(path)
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", str(path),
                           "--to", "canonical", "--in-place"], capture_output=True, text=True)
    assert proc.returncode == 2 and str(path) in proc.stderr, proc.stderr
    assert not marker.exists() and path.read_bytes() == before
    load_file(path, trusted=True)
    assert marker.exists()


# ---------------------------------------------------------------- damaged files


def tensor_file(path):
    import torch

    torch.save({"scaler": {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                           "growth_interval": 3, "_growth_tracker": 1},
                "weight": torch.arange(4096, dtype=torch.float32)}, path)


def _flip_a_byte_inside(path, member_suffix):
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0x40
    path.write_bytes(bytes(data))


def check_checksum_refused(tmp_path, name, member):
    """A checkpoint whose data fails its own CRC-32 is refused, without suggesting trust."""
    path = tmp_path / name
    if name.endswith(".npz"):
        np.savez(path, scale=np.float32(8.0), _growth_tracker=np.int64(1),
                 growth_factor=2.0, backoff_factor=0.5, growth_interval=3,
                 weight=np.arange(4096, dtype=np.float32))
    else:
        tensor_file(path)
    assert load_file(path)  # whole, it loads
    _flip_a_byte_inside(path, member)
    with pytest.raises(ValueError, match=rf"{path}.*does not match the CRC-32") as info:
        load_file(path)
    assert "trust" not in str(info.value)


def _damaged(tmp_path, ext):
    whole = tmp_path / f"whole{ext}"
    if ext in (".pt", ".ckpt"):
        tensor_file(whole)
    elif ext == ".npz":
        np.savez(whole, scale=np.float32(8.0), _growth_tracker=np.int64(1))
    else:
        save_file({"scaler": {"scale": np.array([8.0], np.float32), "incr_count": 1,
                              "decr_count": 0}} if ext in (".pdparams", ".pdopt")
                  else {"scale": 8.0, "_growth_tracker": 1}, whole)
    data = whole.read_bytes()
    return {"empty": b"", "truncated": data[: len(data) // 2], "junk": b"hello world" * 3}


def check_damaged_refused(tmp_path, ext):
    """An empty, truncated or foreign file is refused naming it, without suggesting trust."""
    for what, data in _damaged(tmp_path, ext).items():
        path = tmp_path / f"{what}{ext}"
        path.write_bytes(data)
        with pytest.raises(ValueError) as info:
            load_file(path)
        message = str(info.value)
        assert str(path) in message and "nothing was read" in message, (what, message)
        assert "trust" not in message, (what, message)  # trusting a damaged file helps nothing
