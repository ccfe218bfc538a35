"""Reading torch and Paddle checkpoints without running the file's code.

Without ``trusted=True``:

- a Paddle file is read by :func:`~unifiedamp.porting._pickle_reader.read_plain_pickle`
  with the builders of what ``paddle.save`` writes for a state dict (:data:`_PADDLE`):
  containers, NumPy arrays and scalars of numeric dtypes, tensors as
  ``tuple((name, array))``, DenseTensors as ``eval('data', {'data': array})``; any other
  name is refused. The result is then what ``paddle.load(return_numpy=True)`` gives;
- a torch file's pickle is scanned by the same reader for the objects that make a small
  file expensive (a huge ``bytearray``, a set of a tensor, a tensor viewing more elements
  than its storage holds), every other name left to torch's own allow-list, and then
  loaded with ``torch.load(weights_only=True)``.

A refusal raises :class:`Refused`, which :func:`~unifiedamp.porting.load_file` reports
naming the file, the byte offset and the trust flag (:func:`_refusal`).
"""

from __future__ import annotations

import math
import os
import re
from collections import OrderedDict
from typing import Any, cast

from unifiedamp.porting._limits import ReadLimits, check_tree
from unifiedamp.porting._pickle_reader import (
    DTYPES,
    ArrayRecord,
    Builder,
    DtypeRecord,
    Global,
    Opaque,
    Refused,
    Storage,
    arrays_of,
    expect,
    intact,
    map_shared,
    read_plain_pickle,
)

__all__ = ["Refused", "_load_paddle", "_load_torch", "_refusal"]


def _refusal(path: Any, what: str) -> ValueError:
    return ValueError(
        f"{path} is refused: it holds {what}; reading without trust builds plain data "
        "only, and a full unpickle runs code the file names, so it is not done unless you "
        "trust where the file comes from (trusted=True; CLI: --trust); nothing was read")


def _as_sequence(args: tuple, pos: int, name: str) -> Any:
    expect(len(args) == 1 and type(args[0]) in (list, tuple),
           f"a call of builtins.{name} on something other than a list or tuple "
           f"(at byte {pos})")
    return args[0]


def _ordered_dict(args: tuple, pos: int) -> Any:
    expect(args == (), f"collections.OrderedDict called with arguments (at byte {pos})")
    return OrderedDict()


def _complex(args: tuple, pos: int) -> complex:
    expect(len(args) == 2 and all(type(a) in (int, float) for a in args),
           f"builtins.complex called with other than two numbers (at byte {pos})")
    return complex(*args)


def _encode(args: tuple, pos: int) -> bytes:
    # Protocol 2 writes bytes as _codecs.encode(text, "latin1").
    expect(len(args) == 2 and type(args[0]) is str and args[1] in ("latin1", "latin-1"),
           f"a call of _codecs.encode other than protocol 2's bytes (at byte {pos})")
    return args[0].encode("latin1")


def _dtype(args: tuple, pos: int) -> DtypeRecord:
    expect(len(args) == 3 and args[0] in DTYPES and type(args[1]) is bool
           and type(args[2]) is bool,
           f"numpy.dtype{args!r:.80} (at byte {pos}): only the numeric dtypes "
           f"{', '.join(DTYPES)} are read")
    return DtypeRecord(args[0])


def _reconstruct(args: tuple, pos: int) -> ArrayRecord:
    expect(len(args) == 3 and isinstance(args[0], Global) and args[0].name == "numpy.ndarray"
           and args[1] == (0,) and args[2] == b"b",
           f"numpy's _reconstruct called other than for an ndarray (at byte {pos})")
    return ArrayRecord()


def _scalar(args: tuple, pos: int) -> Any:
    import numpy as np

    expect(len(args) == 2 and isinstance(args[0], DtypeRecord) and type(args[1]) is bytes,
           f"numpy's scalar called other than with a dtype and its bytes (at byte {pos})")
    dtype = args[0].dtype()
    intact(len(args[1]) == dtype.itemsize,
           f"a numpy {dtype} scalar of {len(args[1])} bytes (at byte {pos})")
    return np.frombuffer(args[1], dtype)[0]


def _dense_tensor_data(args: tuple, pos: int) -> ArrayRecord:
    # paddle.save writes a DenseTensor as eval('data', {'data': array}); this is the only
    # eval the reader knows, and it evaluates nothing.
    expect(len(args) == 2 and args[0] == "data" and type(args[1]) is dict
           and list(args[1]) == ["data"] and isinstance(args[1]["data"], ArrayRecord),
           f"an eval() call that is not paddle's DenseTensor record (at byte {pos})")
    return cast(ArrayRecord, args[1]["data"])


def _builtin(kind: type) -> Builder:
    return lambda args, pos: kind(_as_sequence(args, pos, kind.__name__))


# What paddle.save writes for a state dict (protocols 2-4): containers, NumPy arrays and
# scalars, tensors as tuple((name, array)), DenseTensors as eval('data', {'data': array})
# (paddle/framework/io.py, _pickle_save).
_PADDLE: dict[str, Builder | None] = {
    "collections.OrderedDict": _ordered_dict,
    "builtins.tuple": _builtin(tuple), "builtins.list": _builtin(list),
    "builtins.set": _builtin(set), "builtins.frozenset": _builtin(frozenset),
    "builtins.complex": _complex, "_codecs.encode": _encode,
    "numpy.ndarray": None, "numpy.dtype": _dtype,
    "numpy.core.multiarray._reconstruct": _reconstruct,
    "numpy._core.multiarray._reconstruct": _reconstruct,
    "numpy.core.multiarray.scalar": _scalar, "numpy._core.multiarray.scalar": _scalar,
    "builtins.eval": _dense_tensor_data,
}


def _paddle_name(name: str) -> Builder | None:
    if name not in _PADDLE:
        raise Refused(f"a reference to {name}")
    return _PADDLE[name]


def _load_paddle(path: Any, trusted: bool, limits: ReadLimits) -> Any:
    if trusted:
        import paddle

        # return_numpy: arrays, not paddle Tensors (tensors would need a device).
        return paddle.load(os.fspath(path), return_numpy=True)
    with open(path, "rb") as f:
        obj = read_plain_pickle(f, os.fstat(f.fileno()).st_size, _paddle_name)
    check_tree(obj, limits)
    return _paddle_numpy(arrays_of(obj))


def _paddle_numpy(obj: Any) -> Any:
    """What ``paddle.load(path, return_numpy=True)`` makes of an unpickled object."""
    import numpy as np

    if isinstance(obj, dict):
        parts = obj.pop("UnpackBigParamInfor@@", {})  # arrays over 4 GB, split in slices
        for key, info in parts.items():
            obj[key] = np.concatenate([obj.pop(s) for s in info["slices"]]).reshape(
                info["OriginShape"])
        if "StructuredToParameterName@@" in obj:
            del obj["StructuredToParameterName@@"]
            return obj

    def array_of_tensor_record(x: Any) -> Any:
        tensor_record = (type(x) is tuple and len(x) == 2 and isinstance(x[0], str)
                         and isinstance(x[1], np.ndarray))
        return x[1] if tensor_record else x

    return map_shared(obj, array_of_tensor_record)


# ------------------------------------------------------------------ torch

def _opaque(args: tuple, pos: int) -> Opaque:
    return Opaque()


def _bytearray(args: tuple, pos: int) -> bytearray:
    expect(len(args) == 1 and type(args[0]) in (bytes, list),
           f"builtins.bytearray of a size the file chooses (at byte {pos})")
    return bytearray(args[0])


# An expanded tensor (stride 0) may view more elements than its storage holds; past this
# many, a file is refused (a set() of it would iterate them all).
_VIEW_SLACK = 1 << 24


def _rebuild_tensor(args: tuple, pos: int) -> Opaque:
    # _rebuild_tensor_v2(storage, offset, size, stride, ...): a zero stride lets a tensor
    # of a billion elements view a storage of one, and a set() of it iterates them all.
    if len(args) >= 4 and isinstance(args[0], Storage) and type(args[2]) is tuple:
        numel = math.prod(n for n in args[2] if type(n) is int)
        expect(numel <= max(args[0].numel, _VIEW_SLACK),
               f"a tensor of {numel:,} elements over a storage of {args[0].numel:,} "
               f"(at byte {pos})")
    return Opaque()


_TORCH_CHECKED = {"builtins.bytearray": _bytearray, "builtins.set": _builtin(set),
                  "builtins.frozenset": _builtin(frozenset),
                  "torch._utils._rebuild_tensor_v2": _rebuild_tensor}


def _scan_torch(path: Any) -> None:
    """Refuses the few objects that make a small weights_only file expensive (a bytearray
    of a size the file picks, a set of a tensor, a tensor larger than its storage)
    before torch builds them; every other object is left to torch's own allow-list."""
    import zipfile

    def scan(f: Any, size: int, pickles: int) -> None:
        for _ in range(pickles):
            if f.tell() < size:
                read_plain_pickle(f, size - f.tell(),
                                  lambda name: _TORCH_CHECKED.get(name, _opaque), lenient=True)

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.filename.count("/") == 1 and info.filename.endswith("/data.pkl"):
                    with z.open(info) as f:
                        scan(f, info.file_size, 1)
        return
    # The legacy format: pickles of a magic number, a version and system info, then the
    # data's, then the storages' bytes (not a pickle, not read).
    with open(path, "rb") as f:
        pickles = 4 if f.read(2) == b"\x80\x02" else 1
        f.seek(0)
        scan(f, os.fstat(f.fileno()).st_size, pickles)


def _load_torch(path: Any, trusted: bool, limits: ReadLimits) -> Any:
    import pickle

    import torch

    if trusted:
        return torch.load(path, map_location="cpu", weights_only=False)
    _scan_torch(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _torch_refusal(str(exc)) from None
    check_tree(obj, limits)
    return obj


def _torch_refusal(message: str) -> Exception:
    """torch's weights_only error, in the reader's terms. Only an object outside its
    allow-list is a reason to trust; a damaged pickle fails the same way in a full
    unpickle, so its error leaves out torch's advice to load with weights_only=False."""
    name = (re.search(r"GLOBAL ([\w.]+)", message)
            or re.search(r"[Uu]nsupported (?:global|class):? (?!GLOBAL)([\w.]+)", message))
    if name:
        return Refused(f"an object of {name.group(1)}, outside torch's weights_only "
                        "allow-list")
    cause = re.search(r"WeightsUnpickler error: (.*)", message)
    why = cause.group(1).strip() if cause else "torch could not read it"
    return ValueError(f"its pickle is damaged ({why})")
