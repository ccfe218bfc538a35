"""A pickle reader that builds plain data only and never calls what the file names.

A pickle names the functions that rebuild its objects, and a full unpickle calls them: any
code the file names runs. :func:`read_plain_pickle` interprets the opcodes itself
(``pickletools.genops``): containers, numbers, strings and bytes it builds directly; a name
(``GLOBAL``, ``STACK_GLOBAL``) selects one of the caller's builders, which checks its
arguments (a name without one is refused); NumPy arrays and dtypes are rebuilt as records
whose state (``BUILD``) is checked field by field, numeric dtypes only, an array's bytes
against its shape. Every other opcode that would call or configure an object is refused.
A refusal raises :class:`Refused`; a pickle no pickler writes raises ``ValueError``.
The readers of Paddle and torch files (``_safe_pickle``) give the builders.
"""

from __future__ import annotations

import io
import math
import pickletools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, BinaryIO, NamedTuple, cast


class Refused(Exception):
    """A file holds objects that only an unrestricted (code-running) load builds."""


# NumPy dtypes a state dict holds; void, object, string, datetime and structured dtypes
# are refused (numpy's own __setstate__ of a void dtype changes its item size in place,
# past the array's buffer).
DTYPES = ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8",
          "c16")


Builder = Callable[[tuple, int], Any]


class Global(NamedTuple):
    """A name the pickle refers to, and the reader's own builder for it."""

    name: str
    build: Builder | None  # None: only an argument of another builder


class DtypeRecord:
    """A numpy dtype being rebuilt: ``dtype(str, align, copy)``, then its state."""

    __slots__ = ("built", "code", "order")

    def __init__(self, code: str):
        self.code, self.order, self.built = code, "=", False

    def dtype(self) -> Any:
        import numpy as np

        return np.dtype(self.code).newbyteorder(self.order)  # type: ignore[arg-type]


class ArrayRecord:
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


def expect(ok: bool, what: str) -> None:
    """Refuses an object outside plain data (a full unpickle would build it)."""
    if not ok:
        raise Refused(what)


def intact(ok: bool, what: str) -> None:
    """A pickle no pickler writes, which no reader can read: the file is damaged."""
    if not ok:
        raise ValueError(what)


class Opaque:
    """An object torch's own weights_only reader builds (and vets); the scan only counts."""


class Storage(NamedTuple):
    numel: int


def _build(target: Any, state: Any, pos: int) -> None:
    """``BUILD``: the state of a dtype or an array being rebuilt, checked field by field."""
    import numpy as np

    if isinstance(target, DtypeRecord) and not target.built:
        canonical = np.dtype(target.code).__reduce__()[2]
        # (A local: pyright mis-narrows `type(state) is tuple` inside the call's argument.)
        plain = (type(state) is tuple and len(state) == len(canonical)
                 and state[1] in "<>|=" and len(state[1]) == 1
                 and state[:1] + state[2:] == canonical[:1] + canonical[2:])
        expect(plain, f"a numpy dtype state {state!r:.80} that is not a plain numeric dtype's "
               f"(at byte {pos})")
        target.order, target.built = state[1], True
        return
    if isinstance(target, ArrayRecord) and target.array is None:
        plain = (type(state) is tuple and len(state) == 5 and state[0] == 1
                 and type(state[1]) is tuple and len(state[1]) <= 32
                 and all(type(n) is int and n >= 0 for n in state[1])
                 and isinstance(state[2], DtypeRecord) and type(state[3]) is bool
                 and type(state[4]) in (bytes, bytearray))
        expect(plain, f"an ndarray state that is not (1, shape, numeric dtype, fortran, bytes) "
               f"(at byte {pos})")
        shape, dtype, fortran, raw = state[1], state[2].dtype(), state[3], state[4]
        need = math.prod(shape) * dtype.itemsize
        intact(len(raw) == need, f"an ndarray of shape {shape} and dtype {dtype} "
                                 f"({need:,} bytes) over {len(raw):,} bytes (at byte {pos})")
        target.array = np.frombuffer(raw, dtype).reshape(
            shape, order="F" if fortran else "C").copy(order="K")
        return
    raise Refused(f"a BUILD (an object's __setstate__) on an object of type "
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
    the builders ``lookup("module.name")`` returns (it raises :class:`Refused` for a name
    it does not know). ``lenient`` (a scan ahead of torch's reader): objects built by
    name are :class:`Opaque`, and may be built, filled and called as torch allows."""
    import _compat_pickle

    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}

    def since_mark() -> list[Any]:
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    def global_(module: Any, name: Any, pos: int) -> Global:
        intact(type(module) is str and type(name) is str,
               f"a global named by non-strings (at byte {pos})")
        # Protocol 2 names Python 2's modules (__builtin__, copy_reg).
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full = f"{module}.{name}"
        try:
            return Global(full, lookup(full))
        except Refused as exc:
            raise Refused(f"{exc} (at byte {pos})") from None

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
            intact(len(stack) == 1 and not marks, f"a pickle that ends with {len(stack)} "
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
            intact(len(stack) - (marks[-1] if marks else 0) >= n,
                   f"a TUPLE{n} with too few values (at byte {pos})")
            items = stack[-n:]
            del stack[-n:]
            stack.append(tuple(items))
        elif code == "DICT":
            items = since_mark()
            stack.append(dict(zip(items[::2], items[1::2], strict=True)))
        elif code in ("APPEND", "APPENDS"):
            items = [stack.pop()] if code == "APPEND" else since_mark()
            if not (lenient and isinstance(stack[-1], Opaque)):
                expect(type(stack[-1]) is list, f"an APPEND to a "
                                                f"{type(stack[-1]).__name__} (at byte {pos})")
                cast("list[Any]", stack[-1]).extend(items)
        elif code in ("SETITEM", "SETITEMS"):
            items = stack[-2:] if code == "SETITEM" else since_mark()
            if code == "SETITEM":
                del stack[-2:]
            target = stack[-1]
            if lenient and isinstance(target, Opaque):
                continue
            expect(type(target) in (dict, OrderedDict),
                   f"a SETITEM on a {type(target).__name__} (at byte {pos})")
            for key, value in zip(items[::2], items[1::2], strict=True):
                expect(not isinstance(key, (ArrayRecord, DtypeRecord, Global)),
                       f"an array, dtype or global as a dict key (at byte {pos})")
                cast("dict[Any, Any]", target)[key] = value
        elif code in ("ADDITEMS", "FROZENSET"):
            items = since_mark()
            expect(not any(isinstance(x, (ArrayRecord, DtypeRecord, Global)) for x in items),
                   f"an array, dtype or global in a set (at byte {pos})")
            if code == "FROZENSET":
                stack.append(frozenset(items))
            else:
                expect(type(stack[-1]) is set, f"an ADDITEMS to a "
                                               f"{type(stack[-1]).__name__} (at byte {pos})")
                cast("set[Any]", stack[-1]).update(items)
        elif code in ("GET", "BINGET", "LONG_BINGET"):
            intact(arg in memo, f"a memo entry {arg} that was never stored (at byte {pos})")
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
            expect(isinstance(func, Global) and func.build is not None,
                   f"a call of {func.name if isinstance(func, Global) else 'a value'} "
                   f"(at byte {pos})")
            expect(type(args) is tuple, f"a call of {func.name} with arguments that are "
                                        f"not a tuple (at byte {pos})")
            stack.append(cast(Builder, func.build)(args, pos))
        elif code == "BUILD":
            state = stack.pop()
            if not (lenient and isinstance(stack[-1], (Opaque, OrderedDict))):
                _build(stack[-1], state, pos)
        elif lenient and code in ("NEWOBJ", "NEWOBJ_EX"):
            del stack[-3 if code == "NEWOBJ_EX" else -2:]
            stack.append(Opaque())
        elif lenient and code == "BINPERSID":
            pid = stack.pop()
            numel = pid[4] if type(pid) is tuple and len(pid) >= 5 else None
            stack.append(Storage(numel) if type(numel) is int else Opaque())
        else:  # INST, OBJ, NEWOBJ(_EX), PERSID, BINPERSID, EXT1/2/4, out-of-band buffers
            raise Refused(f"the pickle opcode {code}, which calls or looks up an object "
                           f"(at byte {pos})")
    raise ValueError("a pickle without its STOP opcode")


def map_shared(obj: Any, replace: Callable[[Any], Any]) -> Any:
    """``obj`` with each value that ``replace`` changes replaced; where ``replace(x) is x``
    the value is kept and, for a container, its values are walked. Each container is
    walked once, so shared ones stay shared and the work is in proportion to the distinct
    objects (a 1 KB pickle may hold 2**40 paths); dicts and lists change in place."""
    done: dict[int, Any] = {}

    def walk(x: Any) -> Any:
        new = replace(x)
        if new is not x or type(x) not in (dict, OrderedDict, list, tuple, set, frozenset):
            return new
        if id(x) not in done:
            if isinstance(x, dict):
                done[id(x)] = x
                for k in list(x):
                    x[k] = walk(x[k])
            elif type(x) is list:
                done[id(x)] = x
                x[:] = [walk(v) for v in x]
            else:
                done[id(x)] = type(x)(walk(v) for v in x)
        return done[id(x)]

    return walk(obj)


def arrays_of(obj: Any) -> Any:
    """The records replaced by their arrays (:func:`map_shared`)."""
    return map_shared(obj, _array_of)


def _array_of(x: Any) -> Any:
    if isinstance(x, ArrayRecord):
        intact(x.array is not None, "an ndarray whose data never came (no BUILD)")
        return x.array
    if isinstance(x, (DtypeRecord, Global)):
        raise Refused(f"a {'numpy dtype' if isinstance(x, DtypeRecord) else x.name} "
                      "kept as a value")
    return x
