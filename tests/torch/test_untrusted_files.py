"""Untrusted torch.save files (``.pt``; Lightning's ``.ckpt`` is the same format): each
crafted attack is refused with a clear error by the Python API and by ``unifiedamp
port-state``; a fuzz run feeds mutated torch and ``.npz`` archives to the readers in a child
process under memory and CPU limits (a crash or a memory blow-up there is the behaviour under
test): each ends in the data the trusted path reads, or in a clear error; a writer that fails
names the file and leaves it whole. The framework-free checks:
tests/core/test_untrusted_files.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from untrusted_files import (  # noqa: E402
    TORCH_CASES,
    check_crafted_refused,
    mutants,
    port_state,
    run_child,
)


@pytest.mark.parametrize("name", TORCH_CASES)
def test_a_crafted_file_is_refused_clearly_by_the_api_and_the_cli(tmp_path, name):
    check_crafted_refused(tmp_path, name)


# ================================================================ the fuzz run


@pytest.mark.slow
def test_fuzzed_zip_archives_end_in_the_trusted_data_or_a_clear_error(tmp_path):
    import io
    import random

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
    for i, data in enumerate(seeds + mutants(seeds, 1500, rng)):
        (folder / f"t{i:05d}.pt").write_bytes(data)
    for i, data in enumerate([npz, *mutants([npz], 500, rng)]):
        (folder / f"n{i:05d}.npz").write_bytes(data)
    result = run_child(folder, "torch")
    assert result["count"] == 0, result
    assert result["outcomes"]["data"] >= 4 and result["outcomes"]["error"] > 1000, result
    assert result["slowest"] < 2.0, result


# ================================================================ writes


def test_a_writers_own_failure_names_the_file_and_leaves_it_whole(tmp_path):
    import resource

    path = tmp_path / "ck.pt"
    torch.save({"scaler": {"scale": 1024.0, "_growth_tracker": 0},
                "w": torch.zeros(4096)}, path)
    before = path.read_bytes()

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    proc = port_state(path, "--to", "canonical", "--in-place", preexec_fn=limit)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{path}: writing it failed" in proc.stderr and "nothing was written" in proc.stderr
    assert path.read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if "unifiedamp-tmp-" in p]
