"""Reading torch and Paddle checkpoints without running the file's code.

A pickle names the functions that rebuild its objects, and a full unpickle calls them: any
code the file names runs. Without ``trusted=True``:

- a Paddle file is read by :func:`read_plain_pickle`, which interprets the pickle's
  opcodes itself and builds plain data only: containers, numbers, strings, bytes and NumPy
  arrays of numeric dtypes, each array's size checked against the bytes the file holds
  for it. No function the file names is ever called: a name the reader knows selects one
  of its own builders, which checks its arguments; any other name, and any opcode that
  would call or configure an object (``BUILD`` on anything but an array or dtype being
  rebuilt, ``INST``, ``OBJ``, ``NEWOBJ``, persistent ids, extensions), is refused;
- a torch file is checked by the same interpreter for the objects that make a small
  file expensive (a huge ``bytearray``, a set of a tensor, a tensor viewing more
  elements than its storage holds) and then loaded with ``torch.load(weights_only=True)``.

A refusal raises :class:`_Refused`, which :func:`~unifiedamp.porting.load_file` reports
naming the file, the byte offset and the trust flag.
"""

from __future__ import annotations

import io
import math
import os
import pickletools
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, BinaryIO, NamedTuple, cast

from unifiedamp.porting._limits import ReadLimits, check_tree


class _Refused(Exception):
    """A file holds objects that only an unrestricted (code-running) load builds."""


def _refusal(path: Any, what: str) -> ValueError:
    return ValueError(
        f"{path} is refused: it holds {what}; reading without trust builds plain data "
        "only, and a full unpickle runs code the file names, so it is not done unless you "
        "trust where the file comes from (trusted=True; CLI: --trust); nothing was read")


# ------------------------------------------------------------------ the interpreter

# NumPy dtypes a state dict holds; void, object, string, datetime and structured dtypes
# are refused (numpy's own __setstate__ of a void dtype changes its item size in place,
# past the array's buffer).
_DTYPES = ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8",
           "c16")


Builder = Callable[[tuple, int], Any]


class _Global(NamedTuple):
    """A name the pickle refers to, and the reader's own builder for it."""

    name: str
    build: Builder | None  # None: only an argument of another builder


class _Dtype:
    """A numpy dtype being rebuilt: ``dtype(str, align, copy)``, then its state."""

    __slots__ = ("built", "code", "order")

    def __init__(self, code: str):
        self.code, self.order, self.built = code, "=", False

    def dtype(self) -> Any:
        import numpy as np

        return np.dtype(self.code).newbyteorder(self.order)  # type: ignore[arg-type]


class _Array:
    """A numpy array being rebuilt: ``_reconstruct(ndarray, (0,), b'b')``, then its state."""

    __slots__ = ("array",)

    def __init__(self) -> None:
        self.array: Any = None


class _Bounded(io.RawIOBase):
    """A file whose reads never ask for more than what is left: a length field of 2**60
    in the pickle reads the rest of the file, not 2**60 bytes of memory."""

    def __init__(self, f: BinaryIO, size: int):
        super().__init__()
        self._f, self._left = f, size

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._f.read(n)
        self._left -= len(data)
        return data

    def readline(self, limit: int | None = -1) -> bytes:
        data = self._f.readline(self._left)
        self._left -= len(data)
        return data

    def tell(self) -> int:
        return self._f.tell()


def _expect(ok: bool, what: str) -> None:
    """Refuses an object outside plain data (a full unpickle would build it)."""
    if not ok:
        raise _Refused(what)


def _intact(ok: bool, what: str) -> None:
    """A pickle no pickler writes, which no reader can read: the file is damaged."""
    if not ok:
        raise ValueError(what)


def _as_sequence(args: tuple, pos: int, name: str) -> Any:
    _expect(len(args) == 1 and type(args[0]) in (list, tuple),
            f"a call of builtins.{name} on something other than a list or tuple "
            f"(at byte {pos})")
    return args[0]


def _ordered_dict(args: tuple, pos: int) -> Any:
    _expect(args == (), f"collections.OrderedDict called with arguments (at byte {pos})")
    return OrderedDict()


def _complex(args: tuple, pos: int) -> complex:
    _expect(len(args) == 2 and all(type(a) in (int, float) for a in args),
            f"builtins.complex called with other than two numbers (at byte {pos})")
    return complex(*args)


def _encode(args: tuple, pos: int) -> bytes:
    # Protocol 2 writes bytes as _codecs.encode(text, "latin1").
    _expect(len(args) == 2 and type(args[0]) is str and args[1] in ("latin1", "latin-1"),
            f"a call of _codecs.encode other than protocol 2's bytes (at byte {pos})")
    return args[0].encode("latin1")


def _dtype(args: tuple, pos: int) -> _Dtype:
    _expect(len(args) == 3 and args[0] in _DTYPES and type(args[1]) is bool
            and type(args[2]) is bool,
            f"numpy.dtype{args!r:.80} (at byte {pos}): only the numeric dtypes "
            f"{', '.join(_DTYPES)} are read")
    return _Dtype(args[0])


def _reconstruct(args: tuple, pos: int) -> _Array:
    _expect(len(args) == 3 and isinstance(args[0], _Global) and args[0].name == "numpy.ndarray"
            and args[1] == (0,) and args[2] == b"b",
            f"numpy's _reconstruct called other than for an ndarray (at byte {pos})")
    return _Array()


def _scalar(args: tuple, pos: int) -> Any:
    import numpy as np

    _expect(len(args) == 2 and isinstance(args[0], _Dtype) and type(args[1]) is bytes,
            f"numpy's scalar called other than with a dtype and its bytes (at byte {pos})")
    dtype = args[0].dtype()
    _intact(len(args[1]) == dtype.itemsize,
            f"a numpy {dtype} scalar of {len(args[1])} bytes (at byte {pos})")
    return np.frombuffer(args[1], dtype)[0]


def _dense_tensor_data(args: tuple, pos: int) -> _Array:
    # paddle.save writes a DenseTensor as eval('data', {'data': array}); this is the only
    # eval the reader knows, and it evaluates nothing.
    _expect(len(args) == 2 and args[0] == "data" and type(args[1]) is dict
            and list(args[1]) == ["data"] and isinstance(args[1]["data"], _Array),
            f"an eval() call that is not paddle's DenseTensor record (at byte {pos})")
    return args[1]["data"]


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
        raise _Refused(f"a reference to {name}")
    return _PADDLE[name]


def _build(target: Any, state: Any, pos: int) -> None:
    """``BUILD``: the state of a dtype or an array being rebuilt, checked field by field."""
    import numpy as np

    if isinstance(target, _Dtype) and not target.built:
        canonical = np.dtype(target.code).__reduce__()[2]
        _expect(type(state) is tuple and len(state) == len(canonical)
                and state[1] in "<>|=" and len(state[1]) == 1
                and state[:1] + state[2:] == canonical[:1] + canonical[2:],
                f"a numpy dtype state {state!r:.80} that is not a plain numeric dtype's "
                f"(at byte {pos})")
        target.order, target.built = state[1], True
        return
    if isinstance(target, _Array) and target.array is None:
        _expect(type(state) is tuple and len(state) == 5 and state[0] == 1
                and type(state[1]) is tuple and len(state[1]) <= 32
                and all(type(n) is int and n >= 0 for n in state[1])
                and isinstance(state[2], _Dtype) and type(state[3]) is bool
                and type(state[4]) in (bytes, bytearray),
                f"an ndarray state that is not (1, shape, numeric dtype, fortran, bytes) "
                f"(at byte {pos})")
        shape, dtype, fortran, raw = state[1], state[2].dtype(), state[3], state[4]
        need = math.prod(shape) * dtype.itemsize
        _intact(len(raw) == need, f"an ndarray of shape {shape} and dtype {dtype} "
                                  f"({need:,} bytes) over {len(raw):,} bytes (at byte {pos})")
        target.array = np.frombuffer(raw, dtype).reshape(
            shape, order="F" if fortran else "C").copy(order="K")
        return
    raise _Refused(f"a BUILD (an object's __setstate__) on an object of type "
                   f"{type(target).__name__} (at byte {pos})")


_VALUE_OPS = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
    "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"})
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_EMPTY = {"EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_TUPLE": tuple, "EMPTY_SET": set}
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


def read_plain_pickle(f: BinaryIO, size: int, lookup: Callable[[str], Builder | None],
                      lenient: bool = False) -> Any:
    """Interprets a pickle of at most ``size`` bytes, building plain data and calling only
    the builders ``lookup("module.name")`` returns (it raises :class:`_Refused` for a name
    it does not know). ``lenient`` (a scan ahead of torch's reader): objects built by
    name are :class:`_Opaque`, and may be built, filled and called as torch allows."""
    import _compat_pickle

    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}

    def since_mark() -> list[Any]:
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    def global_(module: Any, name: Any, pos: int) -> _Global:
        _intact(type(module) is str and type(name) is str,
                f"a global named by non-strings (at byte {pos})")
        # Protocol 2 names Python 2's modules (__builtin__, copy_reg).
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full = f"{module}.{name}"
        try:
            return _Global(full, lookup(full))
        except _Refused as exc:
            raise _Refused(f"{exc} (at byte {pos})") from None

    ops: Any = pickletools.genops(cast(BinaryIO, _Bounded(f, size)))
    for op, arg, at in ops:
        code, pos = op.name, at or 0
        if code in _VALUE_OPS:
            stack.append(arg)
        elif code in _CONSTANTS:
            stack.append(_CONSTANTS[code])
        elif code in _EMPTY:
            stack.append(_EMPTY[code]())
        elif code in ("PROTO", "FRAME"):
            continue
        elif code == "STOP":
            _intact(len(stack) == 1 and not marks, f"a pickle that ends with {len(stack)} "
                                                   f"values on its stack (at byte {pos})")
            return stack[0]
        elif code == "MARK":
            marks.append(len(stack))
        elif code == "POP":
            stack.pop()
        elif code == "POP_MARK":
            since_mark()
        elif code == "DUP":
            stack.append(stack[-1])
        elif code == "BYTEARRAY8":
            stack.append(bytearray(arg))
        elif code in ("LIST", "TUPLE"):
            items = since_mark()
            stack.append(items if code == "LIST" else tuple(items))
        elif code in _TUPLE_N:
            n = _TUPLE_N[code]
            _intact(len(stack) - (marks[-1] if marks else 0) >= n,
                    f"a TUPLE{n} with too few values (at byte {pos})")
            items = stack[-n:]
            del stack[-n:]
            stack.append(tuple(items))
        elif code == "DICT":
            items = since_mark()
            stack.append(dict(zip(items[::2], items[1::2], strict=True)))
        elif code in ("APPEND", "APPENDS"):
            items = [stack.pop()] if code == "APPEND" else since_mark()
            if not (lenient and isinstance(stack[-1], _Opaque)):
                _expect(type(stack[-1]) is list, f"an APPEND to a "
                                                 f"{type(stack[-1]).__name__} (at byte {pos})")
                stack[-1].extend(items)
        elif code in ("SETITEM", "SETITEMS"):
            items = stack[-2:] if code == "SETITEM" else since_mark()
            if code == "SETITEM":
                del stack[-2:]
            target = stack[-1]
            if lenient and isinstance(target, _Opaque):
                continue
            _expect(type(target) in (dict, OrderedDict),
                    f"a SETITEM on a {type(target).__name__} (at byte {pos})")
            for key, value in zip(items[::2], items[1::2], strict=True):
                _expect(not isinstance(key, (_Array, _Dtype, _Global)),
                        f"an array, dtype or global as a dict key (at byte {pos})")
                target[key] = value
        elif code in ("ADDITEMS", "FROZENSET"):
            items = since_mark()
            _expect(not any(isinstance(x, (_Array, _Dtype, _Global)) for x in items),
                    f"an array, dtype or global in a set (at byte {pos})")
            if code == "FROZENSET":
                stack.append(frozenset(items))
            else:
                _expect(type(stack[-1]) is set, f"an ADDITEMS to a "
                                                f"{type(stack[-1]).__name__} (at byte {pos})")
                stack[-1].update(items)
        elif code in ("GET", "BINGET", "LONG_BINGET"):
            _intact(arg in memo, f"a memo entry {arg} that was never stored (at byte {pos})")
            stack.append(memo[arg])
        elif code in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1]
        elif code == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif code == "GLOBAL":
            module, _, name = str(arg).partition(" ")
            stack.append(global_(module, name, pos))
        elif code == "STACK_GLOBAL":
            name = stack.pop()
            stack.append(global_(stack.pop(), name, pos))
        elif code == "REDUCE":
            args = stack.pop()
            func = stack.pop()
            _expect(isinstance(func, _Global) and func.build is not None,
                    f"a call of {func.name if isinstance(func, _Global) else 'a value'} "
                    f"(at byte {pos})")
            _expect(type(args) is tuple, f"a call of {func.name} with arguments that are "
                                         f"not a tuple (at byte {pos})")
            stack.append(func.build(args, pos))
        elif code == "BUILD":
            state = stack.pop()
            if not (lenient and isinstance(stack[-1], (_Opaque, OrderedDict))):
                _build(stack[-1], state, pos)
        elif lenient and code in ("NEWOBJ", "NEWOBJ_EX"):
            del stack[-3 if code == "NEWOBJ_EX" else -2:]
            stack.append(_Opaque())
        elif lenient and code == "BINPERSID":
            pid = stack.pop()
            numel = pid[4] if type(pid) is tuple and len(pid) >= 5 else None
            stack.append(_Storage(numel) if type(numel) is int else _Opaque())
        else:  # INST, OBJ, NEWOBJ(_EX), PERSID, BINPERSID, EXT1/2/4, out-of-band buffers
            raise _Refused(f"the pickle opcode {code}, which calls or looks up an object "
                           f"(at byte {pos})")
    raise ValueError("a pickle without its STOP opcode")


def _arrays(obj: Any) -> Any:
    """The records replaced by their arrays; each container once, shared ones kept shared."""
    done: dict[int, Any] = {}

    def walk(x: Any) -> Any:
        if isinstance(x, _Array):
            _intact(x.array is not None, "an ndarray whose data never came (no BUILD)")
            return x.array
        if isinstance(x, (_Dtype, _Global)):
            raise _Refused(f"a {'numpy dtype' if isinstance(x, _Dtype) else x.name} "
                           "kept as a value")
        if type(x) not in (dict, OrderedDict, list, tuple, set, frozenset):
            return x
        if id(x) not in done:
            if isinstance(x, dict):
                for k in list(x):
                    x[k] = walk(x[k])
                done[id(x)] = x
            elif type(x) is list:
                done[id(x)] = x
                x[:] = [walk(v) for v in x]
            else:
                done[id(x)] = type(x)(walk(v) for v in x)
        return done[id(x)]

    return walk(obj)


def _load_paddle(path: Any, trusted: bool, limits: ReadLimits) -> Any:
    if trusted:
        import paddle

        # return_numpy: arrays, not paddle Tensors (tensors would need a device).
        return paddle.load(os.fspath(path), return_numpy=True)
    with open(path, "rb") as f:
        obj = read_plain_pickle(f, os.fstat(f.fileno()).st_size, _paddle_name)
    check_tree(obj, limits)
    return _paddle_numpy(_arrays(obj))


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

    def tensor_record(x: Any) -> bool:
        return (type(x) is tuple and len(x) == 2 and isinstance(x[0], str)
                and isinstance(x[1], np.ndarray))

    done: dict[int, Any] = {}

    def walk(x: Any) -> Any:
        if tensor_record(x):
            return x[1]
        if type(x) not in (dict, OrderedDict, list, tuple, set):
            return x
        if id(x) not in done:
            if type(x) in (dict, OrderedDict):
                for k in list(x):
                    x[k] = walk(x[k])
                done[id(x)] = x
            else:
                done[id(x)] = type(x)(walk(v) for v in x)
        return done[id(x)]

    return walk(obj)


# ------------------------------------------------------------------ torch

class _Opaque:
    """An object torch's own weights_only reader builds (and vets); the scan only counts."""


class _Storage(NamedTuple):
    numel: int


def _opaque(args: tuple, pos: int) -> _Opaque:
    return _Opaque()


def _bytearray(args: tuple, pos: int) -> bytearray:
    _expect(len(args) == 1 and type(args[0]) in (bytes, list),
            f"builtins.bytearray of a size the file chooses (at byte {pos})")
    return bytearray(args[0])


# An expanded tensor (stride 0) may view more elements than its storage holds; past this
# many, a file is refused (a set() of it would iterate them all).
_VIEW_SLACK = 1 << 24


def _rebuild_tensor(args: tuple, pos: int) -> _Opaque:
    # _rebuild_tensor_v2(storage, offset, size, stride, ...): a zero stride lets a tensor
    # of a billion elements view a storage of one, and a set() of it iterates them all.
    if len(args) >= 4 and isinstance(args[0], _Storage) and type(args[2]) is tuple:
        numel = math.prod(n for n in args[2] if type(n) is int)
        _expect(numel <= max(args[0].numel, _VIEW_SLACK),
                f"a tensor of {numel:,} elements over a storage of {args[0].numel:,} "
                f"(at byte {pos})")
    return _Opaque()


_TORCH_CHECKED = {"builtins.bytearray": _bytearray, "builtins.set": _builtin(set),
                  "builtins.frozenset": _builtin(frozenset),
                  "torch._utils._rebuild_tensor_v2": _rebuild_tensor}


def _torch_pickles(path: Any) -> list[bytes]:
    """The pickle of a zip-based torch file; the whole file for the legacy format."""
    import zipfile

    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            return [f.read()]
    with zipfile.ZipFile(path) as z:
        return [z.read(n) for n in z.namelist()
                if n.count("/") == 1 and n.endswith("/data.pkl")]


def _scan_torch(path: Any) -> None:
    """Refuses the few objects that make a small weights_only file expensive (a bytearray
    of a size the file picks, a set of a tensor, a tensor larger than its storage)
    before torch builds them; every other object is left to torch's own allow-list."""
    for data in _torch_pickles(path):
        f = io.BytesIO(data)
        # The legacy format: a magic number, a version, system info, then the data.
        for _ in range(4 if data[:2] == b"\x80\x02" and len(data) > 2 else 1):
            if f.tell() < len(data):
                read_plain_pickle(f, len(data) - f.tell(),
                                  lambda name: _TORCH_CHECKED.get(name, _opaque),
                                  lenient=True)


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
        return _Refused(f"an object of {name.group(1)}, outside torch's weights_only "
                        "allow-list")
    cause = re.search(r"WeightsUnpickler error: (.*)", message)
    why = cause.group(1).strip() if cause else "torch could not read it"
    return ValueError(f"its pickle is damaged ({why})")
