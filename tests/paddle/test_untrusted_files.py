"""The fuzz run over paddle.save's format: thousands of mutated and generated pickles (every
opcode pickle has, each way a pickle can name or call code) and JSON texts go to the readers
in a child process under memory and CPU limits (a crash or a memory blow-up there is the
behaviour under test): each ends in the data the trusted path (``paddle.load``) reads, or in
a clear error, never in code, a crash or work past the caps. The crafted files and the caps:
tests/core/test_untrusted_files.py."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import subprocess

import crafted_checkpoints as crafted
import numpy as np
import pytest

pytest.importorskip("paddle")

from untrusted_files import mutants, run_child  # noqa: E402


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
    corpus = seeds + payloads + mutants(seeds + payloads, 8000, rng)
    for i, data in enumerate(corpus):
        (folder / f"p{i:05d}.pdparams").write_bytes(data)
    texts = [json.dumps({"scale": 8.0, "x": [1, {"y": None}], "s": "\u00e9"}),
             "[" * 5000 + "]" * 5000, '{"a": 1e999999}', '{"a": "\\ud800"}']
    for i, text in enumerate(mutants([t.encode() for t in texts], 1000, rng) + texts):
        (folder / f"j{i:05d}.json").write_bytes(text if isinstance(text, bytes)
                                                else text.encode())
    result = run_child(folder, "paddle")
    assert result["count"] == 0, result
    assert not marker.exists()
    assert result["outcomes"]["data"] > 50 and result["outcomes"]["error"] > 1000, result
    assert result["slowest"] < 2.0, result
