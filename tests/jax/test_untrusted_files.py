"""The fuzz run over flax's msgpack files: mutated files and a 5,000-deep nesting go to the
readers in a child process under memory and CPU limits (a crash or a memory blow-up there is
the behaviour under test): each ends in data or in a clear error."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flax")

from untrusted_files import mutants, run_child  # noqa: E402


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
    for i, data in enumerate([*seeds, deep, *mutants(seeds, 1500, rng)]):
        (folder / f"m{i:05d}.msgpack").write_bytes(data)
    result = run_child(folder, "flax")
    assert result["count"] == 0, result
    assert result["outcomes"]["data"] >= 3 and result["outcomes"]["error"] > 500, result
    assert result["slowest"] < 2.0, result
