"""Checkpoint files crafted to attack a reader: each is the bytes of one finding, kept as a
regression case (tests/core/test_untrusted_files.py and tests/torch/test_untrusted_files.py
run every one through the Python API and ``unifiedamp port-state``).

Pickles are written by Python's own pickler from objects whose ``__reduce__`` names the
functions a malicious file would name, so every opcode sequence is one a real pickler
emits; the few that no pickler emits are patched in by opcode.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import zipfile

import numpy as np


class Reduce:
    """Pickles as ``func(*args)`` followed by ``BUILD state`` when ``state`` is given."""

    def __init__(self, func, args, state=None):
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (
            self.func, self.args, self.state)


def _state(scale=1024.0):
    return {"scale": np.array([scale], np.float32), "incr_count": 1, "decr_count": 0}


def void_dtype_resized() -> bytes:
    """An array of dtype V8 whose dtype's state is sent again with an item size of 65536:
    numpy's own __setstate__ grows the item size past the 8-byte buffer (reading the
    process's memory). Only allowed names: numpy.dtype, _reconstruct, ndarray."""
    from numpy._core.multiarray import _reconstruct as rec

    dtype = Reduce(np.dtype, ("V8", False, True), (3, "|", None, None, None, 8, 1, 0))
    arr = Reduce(rec, (np.ndarray, (0,), b"b"), (1, (1,), dtype, False, b"\0" * 8))
    body = pickle.dumps({"scaler": _state(), "leak": arr}, protocol=4)
    # Before STOP: the dtype again (from the memo), a state of item size 65536, BUILD, POP.
    resend = pickle.dumps((3, "|", None, None, None, 65536, 1, 0), protocol=2)[2:-1]
    return (body[:-1] + pickle.LONG_BINGET + _dtype_slot(body).to_bytes(4, "little")
            + resend + pickle.BUILD + pickle.POP + pickle.STOP)


def _dtype_slot(data: bytes) -> int:
    """The memo slot of the first dtype built in ``data`` (MEMOIZE after its REDUCE)."""
    slot, strings, calls, reduced, previous = 0, [], [], "", ""
    for op, arg, _ in pickletools.genops(data):
        if op.name == "MEMOIZE":
            if previous == "REDUCE" and reduced == "dtype":
                return slot
            slot += 1
        elif op.name == "SHORT_BINUNICODE":
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            calls.append(strings[-1])
        elif op.name == "REDUCE":
            reduced = calls.pop()
        previous = op.name
    raise LookupError("no dtype in the pickle")


def numeric_dtype_resized() -> bytes:
    """A float32 dtype whose state is sent twice, the second time with another size."""
    from numpy._core.multiarray import _reconstruct as rec

    dtype = Reduce(np.dtype, ("f4", False, True), (3, "<", None, None, None, -1, -1, 0))
    arr = Reduce(rec, (np.ndarray, (0,), b"b"),
                 (1, (1,), dtype, False, b"\0" * 4))
    twice = Reduce(np.dtype, ("f4", False, True), (3, "<", None, None, None, 65536, 1, 0))
    return pickle.dumps({"scaler": _state(), "a": arr, "b": twice}, protocol=4)


def ordered_dict_attribute() -> bytes:
    """An OrderedDict whose BUILD sets an instance attribute ``items`` to an allowed
    callable, so later code calling ``.items()`` gets ``tuple``."""
    from collections import OrderedDict

    od = Reduce(OrderedDict, (), {"items": tuple})
    return pickle.dumps({"scaler": _state(), "od": od}, protocol=4)


def shared_children(levels: int = 40) -> bytes:
    """Dicts that share their children: 2**levels paths in a kilobyte."""
    node: dict = {"scale": np.array([8.0], np.float32)}
    for _ in range(levels):
        node = {"a": node, "b": node}
    return pickle.dumps({"scaler": _state(), "tree": node}, protocol=4)


def zero_stride_set(n: int = 10**8) -> bytes:
    """A set of an n-element array viewing one byte (stride 0): n iterations."""
    view = Reduce(np.ndarray, ((n,), "u1", b"x", 0, (0,)))
    return pickle.dumps({"scaler": _state(), "s": Reduce(set, (view,))}, protocol=4)


def huge_frame() -> bytes:
    """A protocol-4 FRAME whose length asks for 2**60 bytes."""
    return b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\x0f\x00"


def huge_bytes() -> bytes:
    """A BINBYTES8 whose length asks for 2**62 bytes."""
    return b"\x80\x04" + pickle.BINBYTES8 + (2**62).to_bytes(8, "little") + b"abc"


def eval_payload(marker: str) -> bytes:
    """paddle's DenseTensor record spelled with code in place of 'data'."""
    code = f"__import__('pathlib').Path({marker!r}).touch()"
    return pickle.dumps({"scaler": _state(), "x": Reduce(eval, (code, {}))}, protocol=4)


def eval_extra_namespace() -> bytes:
    """paddle's DenseTensor record with a namespace holding more than 'data'."""
    from numpy._core.multiarray import _reconstruct as rec

    dtype = Reduce(np.dtype, ("f4", False, True), (3, "<", None, None, None, -1, -1, 0))
    arr = Reduce(rec, (np.ndarray, (0,), b"b"), (1, (1,), dtype, False, b"\0" * 4))
    return pickle.dumps({"scaler": _state(), "x": Reduce(eval, ("data", {"data": arr,
                                                                         "os": 1}))},
                        protocol=4)


def system_payload(marker: str) -> bytes:
    """The classic: os.system called by REDUCE."""
    return pickle.dumps({"scaler": _state(), "x": Reduce(os.system, (f"touch {marker}",))},
                        protocol=2)


def zip_bomb(path_suffix: str, unpacked: int = 200 << 20) -> bytes:
    """A zip whose one extra member deflates ``unpacked`` zero bytes into ~1/1000 of that:
    for a torch file (``.pt``) added to a real torch.save archive, for ``.npz`` an array."""
    out = io.BytesIO()
    if path_suffix == ".npz":
        buf = io.BytesIO()
        np.save(buf, np.zeros(unpacked // 4, np.float32))
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("scale.npy", _npy(np.float32(8.0)))
            z.writestr("_growth_tracker.npy", _npy(np.int64(1)))
            z.writestr("weight.npy", buf.getvalue())
        return out.getvalue()
    import torch

    real = io.BytesIO()
    torch.save({"scaler": {"scale": 1024.0, "_growth_tracker": 0},
                "w": torch.zeros(4)}, real)
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            z.writestr(info, src.read(info.filename))
        prefix = src.namelist()[0].split("/")[0]
        z.writestr(zipfile.ZipInfo(f"{prefix}/data/99"), b"\0" * unpacked,
                   compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


def npy_header_lies() -> bytes:
    """An .npz member whose header declares 2**40 float32 elements over 8 bytes of data."""
    header = b"\x93NUMPY\x01\x00"
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }"
    text = text.ljust(118) + "\n"
    member = header + len(text).to_bytes(2, "little") + text.encode() + b"\0" * 8
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("scale.npy", _npy(np.float32(8.0)))
        z.writestr("weight.npy", member)
    return out.getvalue()


def _npy(value) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value)
    return buf.getvalue()


def torch_bytearray(size: int = 1 << 34) -> bytes:
    """A torch file whose weights_only-allowed bytearray REDUCE allocates ``size`` bytes."""
    import torch

    real = io.BytesIO()
    torch.save({"scaler": {"scale": 1024.0, "_growth_tracker": 0}, "b": bytearray(b"x")},
               real)
    # The pickle is replaced by one whose bytearray takes an int: the size to allocate.
    with zipfile.ZipFile(real) as src:
        name = next(n for n in src.namelist() if n.endswith("/data.pkl"))
        members = [(i, src.read(i.filename)) for i in src.infolist()]
    evil = pickle.dumps({"scaler": {"scale": 1024.0, "_growth_tracker": 0},
                         "b": Reduce(bytearray, (size,))}, protocol=2)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info, blob in members:
            z.writestr(info, evil if info.filename == name else blob)
    return out.getvalue()


def torch_zero_stride(n: int = 10**9) -> bytes:
    """A set of a torch tensor of ``n`` elements over a storage of one (stride 0):
    weights_only allows both, and building the set iterates the ``n`` elements."""
    import torch

    buf = io.BytesIO()
    t = torch.zeros(1).expand(n)
    torch.save({"scaler": {"scale": 1024.0, "_growth_tracker": 0},
                "t": Reduce(set, (t,))}, buf)
    return buf.getvalue()
