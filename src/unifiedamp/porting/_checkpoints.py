"""Scaler states inside checkpoint files: reading, writing and converting them in place.

:func:`load_file` and :func:`save_file` read and write ``torch.save`` files and Lightning
``.ckpt``, Paddle ``.pdparams``/``.pdopt``, JSON, flax msgpack and NumPy ``.npz`` (the type
from the extension, :func:`file_type`); no file runs code unless ``trusted=True`` (the
readers that keep torch and Paddle pickles from running code are in ``_safe_pickle``).
:func:`port_state_file` finds the scaler's entry in a checkpoint and rewrites it in another
form (:mod:`unifiedamp.porting._states`), keeping the rest. Writes are atomic (temp file +
``os.replace``), so a process killed mid-write leaves the previous checkpoint whole.

No framework is imported at module import: each file type imports its framework when it
reads or writes one; a ``.keras`` model is read in a plain child process unless the file is
trusted and Keras is already imported here (``_keras_files``), so importing Keras never
brings tensorflow into a process that may import paddle.
The zip checks and the caps on reading are ``_limits``'.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from unifiedamp._atomic_write import atomic_path
from unifiedamp.porting._flax import flax_config, flax_notes, is_orbax, load_orbax, save_orbax
from unifiedamp.porting._keras_files import load_keras, save_keras
from unifiedamp.porting._limits import Exceeded, ReadLimits, check_tree, check_zip
from unifiedamp.porting._safe_pickle import Refused, _load_paddle, _load_torch, _refusal
from unifiedamp.porting._states import _closest, convert_state, detect_form, read_state
from unifiedamp.spec import ScalerConfig

__all__ = ["LIGHTNING_KEYS", "file_type", "load_file", "port_state_file", "save_file"]

# Where Lightning 2.x keeps its precision plugin's scaler in a .ckpt:
# checkpoint[prec_plugin.__class__.__qualname__] = prec_plugin.state_dict(), which is
# scaler.state_dict() (lightning/pytorch/trainer/connectors/checkpoint_connector.py).
LIGHTNING_KEYS = ("MixedPrecision", "FSDPPrecision")

_TORCH_EXT = (".pt", ".pth", ".ckpt", ".bin", ".tar")
_PADDLE_EXT = (".pdparams", ".pdopt", ".pdckpt")
_FILE_TYPES = {**{e: "torch" for e in _TORCH_EXT}, **{e: "paddle" for e in _PADDLE_EXT},
               ".json": "json", ".msgpack": "msgpack", ".npz": "npz", ".keras": "keras"}


def file_type(path: str | os.PathLike) -> str:
    """The file type of a checkpoint path, from its extension.

    Example:
        >>> file_type("epoch=3-step=100.ckpt"), file_type("opt.pdopt"), file_type("s.json")
        ('torch', 'paddle', 'json')
    """
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext not in _FILE_TYPES:
        raise ValueError(f"unknown checkpoint type {ext or '(no extension)'!r} of {path}: "
                         f"known extensions are {sorted(_FILE_TYPES)} (torch.save, "
                         "paddle.save, JSON, flax msgpack, numpy .npz, Keras model.save)")
    return _FILE_TYPES[ext]


def load_file(path: str | os.PathLike, trusted: bool = False,
              limits: ReadLimits | None = None) -> Any:
    """Reads a checkpoint file (its type from the extension, see :func:`file_type`).

    No file runs code unless ``trusted=True``: torch files load with
    ``weights_only=True``, Paddle files with a pickle reader that builds only
    containers, numbers, strings and NumPy arrays, ``.npz`` files without pickled
    objects, ``.keras`` models in Keras's safe mode. ``trusted=True`` (CLI:
    ``--trust``) unpickles torch and Paddle files in full and loads ``.keras`` models
    with ``safe_mode=False``: the file's own code then runs. A file that cannot be
    read, or whose data does not match its own checksums (the zip-based torch,
    ``.npz`` and ``.keras`` files carry a CRC-32 per member), raises a ``ValueError``
    naming it. Without ``trusted=True`` the work of reading is bounded by ``limits``
    (:class:`ReadLimits`; docs/porting.md, "Untrusted files"): a file past a cap is
    refused, naming the cap and how to raise it.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "scaler.json")
        >>> save_file({"scale": 8.0}, path)
        >>> load_file(path)
        {'scale': 8.0}
    """
    kind = file_type(path)
    limits = ReadLimits() if limits is None else limits
    if not os.path.isfile(path):
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path} is a directory, not a checkpoint file")
        raise FileNotFoundError(f"{path}: no such file")
    with _reading(path, kind):
        if kind in ("torch", "npz") and zipfile.is_zipfile(path):
            check_zip(path, None if trusted else limits)
        elif kind == "npz":  # np.load would take any other bytes for a pickle
            raise _unreadable(path, kind, zipfile.BadZipFile("not a zip archive"))
        if kind == "keras":
            return load_keras(path, trusted, limits)
        if kind == "paddle":
            return _load_paddle(path, trusted, limits)
        if kind == "torch":
            return _load_torch(path, trusted, limits)
        if kind == "json":
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        elif kind == "npz":
            obj = _load_npz(path, trusted)
        else:
            from flax import serialization

            with open(path, "rb") as f:
                obj = serialization.msgpack_restore(f.read())
        if not trusted:
            check_tree(obj, limits)
        return obj


def _load_npz(path: Any, trusted: bool) -> dict[str, Any]:
    import numpy as np

    if not trusted:
        _check_npy_sizes(path)
    try:
        with np.load(path, allow_pickle=trusted) as data:
            return {k: data[k] for k in data.files}
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise Refused("pickled object arrays (dtype=object: np.load unpickles them)") \
                from None
        raise


def _check_npy_sizes(path: Any) -> None:
    # np.load allocates the array its header describes before reading the data: a header
    # may promise terabytes in a member of a few bytes.
    import numpy as np
    from numpy.lib import format as npy

    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            with z.open(info) as f:
                header = (npy.read_array_header_1_0 if npy.read_magic(f) == (1, 0)
                          else npy.read_array_header_2_0)
                shape, _, dtype = header(f)
                data = info.file_size - f.tell()
            if dtype.hasobject:
                continue  # refused by np.load without allow_pickle
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if need > data:
                raise ValueError(f"{path}: its member {info.filename!r} declares an array "
                                 f"of {need:,} bytes ({shape}, {dtype}) but holds "
                                 f"{data:,}: the file is damaged; nothing was read")


@contextlib.contextmanager
def _reading(path: Any, kind: str) -> Iterator[None]:
    # Readers of untrusted bytes fail in many ways (EOFError, BadZipFile, KeyError from a
    # pickle opcode, RecursionError on deep JSON...): each becomes one error naming the file.
    try:
        yield
    except Refused as exc:
        raise _refusal(path, str(exc)) from None
    except Exceeded as exc:
        raise ValueError(f"{path} is refused: {exc}; nothing was read") from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.filename is not None:
            raise
        if isinstance(exc, ValueError) and str(exc).startswith(os.fspath(path)):
            raise
        raise _unreadable(path, kind, exc) from None
    except MemoryError:
        raise ValueError(f"{path}: reading it needed more memory than this process could "
                         "get (MemoryError): the file is damaged, or larger than this "
                         "machine can hold; nothing was read") from None
    except Exception as exc:  # noqa: BLE001 - any parser failure on untrusted bytes
        raise _unreadable(path, kind, exc) from None


def _unreadable(path: Any, kind: str, exc: BaseException) -> ValueError:
    detail = str(exc).splitlines()[0][:300] if str(exc) else ""
    if isinstance(exc, RecursionError):
        detail = "nested deeper than Python's recursion limit"
    what = {"torch": "torch.save", "paddle": "paddle.save", "json": "JSON",
            "msgpack": "flax msgpack", "npz": "NumPy .npz", "keras": "Keras .keras"}[kind]
    return ValueError(f"{path} cannot be read as a {what} file ({type(exc).__name__}"
                      f"{': ' + detail if detail else ''}): it is damaged, truncated or of "
                      "another type; nothing was read")


def _plain(value: Any) -> Any:
    # JSON has no arrays: a numpy scalar or array becomes its Python value(s).
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def save_file(obj: Any, path: str | os.PathLike) -> None:
    """Writes a checkpoint file atomically: a temp file beside it, then ``os.replace``
    (:func:`unifiedamp._atomic_write.atomic_path`): a failure or a process killed mid-write
    leaves the old file whole, and a symlink stays a link to the rewritten file.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "scaler.json")
        >>> save_file({"scale": 8.0, "growth_tracker": 1}, path)
        >>> load_file(path)["growth_tracker"]
        1
    """
    kind = file_type(path)
    if kind == "keras":
        raise ValueError(f"{path}: a .keras file is a whole Keras model: write a scaler state "
                         "into one with port_state_file(src, dst.keras, to='keras'), which "
                         "loads the model, assigns its optimizer's variables and saves it")
    arrays = _flat_arrays(obj, path) if kind == "npz" else None  # refused before writing
    with _writing(path), atomic_path(path, suffix=os.path.splitext(path)[1]) as tmp:
        if kind == "paddle":
            import paddle

            paddle.save(obj, tmp)
            return
        with open(tmp, "wb") as f:
            if kind == "json":
                f.write(json.dumps(obj, indent=1, default=_plain).encode())
            elif kind == "msgpack":
                from flax import serialization

                f.write(serialization.msgpack_serialize(obj))
            elif kind == "npz":
                import numpy as np

                np.savez(f, **(arrays or {}))
            else:
                import torch

                torch.save(obj, f)


@contextlib.contextmanager
def _writing(path: Any) -> Iterator[None]:
    # A writer fails in its own words (torch's "[enforce fail at inline_container.cc]", a
    # full disk's bare "File too large"): each becomes one error naming the file.
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any writer's failure
        if os.fspath(path) in str(exc):
            raise
        detail = (str(exc).splitlines() or [""])[0][:300]
        message = (f"{path}: writing it failed ({type(exc).__name__}: {detail}); the file "
                   "is as it was before; nothing was written")
        if isinstance(exc, OSError):
            raise OSError(exc.errno, message) from None
        raise ValueError(message) from None


def _flat_arrays(obj: Any, path: Any) -> dict[str, Any]:
    import numpy as np

    if not isinstance(obj, Mapping) or any(isinstance(v, (Mapping, str)) or v is None
                                           for v in obj.values()):
        raise ValueError(f"{path}: a .npz file holds flat numeric arrays; this state has "
                         "nested or text fields (the canonical form does): write it to "
                         ".json, .msgpack or a torch/paddle file instead")
    # The scale in float32, as the framework's variable holds it; the factors as given.
    scales = ("scale", "dynamic_scale", "loss_scale")
    return {k: np.asarray(v, np.float32 if k in scales else None) for k, v in obj.items()}


def _storable(state: dict[str, Any], kind: str) -> dict[str, Any]:
    # torch.load(weights_only=True) refuses numpy arrays (Paddle's [scale]): store a tensor.
    if kind != "torch":
        return state
    import numpy as np
    import torch

    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}


def _find(container: Any, key: str | None, path: Any) -> tuple[str | None, Any]:
    """The scaler entry: ``(key, state)``; key None when the whole file is the state."""
    if key is not None:
        if not isinstance(container, Mapping) or key not in container:
            keys = sorted(map(str, container)) if isinstance(container, Mapping) else []
            raise ValueError(f"{path} has no key {key!r}{_closest(key, tuple(keys))}; "
                             f"its top-level keys: {keys}")
        detect_form(container[key])  # a clear error if that entry is not a scaler state
        return key, container[key]
    if not isinstance(container, Mapping):
        raise ValueError(f"{path} holds a {type(container).__name__}, not a dict with a "
                         "scaler state")
    try:
        detect_form(container)
        return None, container
    except ValueError:
        pass
    for name in LIGHTNING_KEYS:
        if name in container and isinstance(container[name], Mapping) and container[name]:
            return name, container[name]
    found = []
    for name, value in container.items():
        try:
            detect_form(value)
            found.append(name)
        except (TypeError, ValueError):
            pass
    if len(found) != 1:
        what = f"several: {found}" if found else "none"
        raise ValueError(f"{path}: looked for a scaler state at the top level, in Lightning's "
                         f"{list(LIGHTNING_KEYS)} and in each top-level entry, found {what}; "
                         f"pass key= (CLI: --key) naming it; top-level keys: "
                         f"{sorted(map(str, container))}")
    return found[0], container[found[0]]


def port_state_file(src: str | os.PathLike, dst: str | os.PathLike | None = None,
                    to: str = "canonical", key: str | None = None,
                    config: ScalerConfig | None = None, in_place: bool = False,
                    trusted: bool = False, limits: ReadLimits | None = None,
                    config_fields: Collection[str] = ()) -> dict[str, Any]:
    """Converts the scaler state inside a checkpoint file to the form ``to``.

    The entry is found with :func:`_find`: ``key`` if given, else the whole file when
    it is a state, else Lightning's precision-plugin entry (``"MixedPrecision"``),
    else the one top-level entry that is a state. When ``dst`` has the same file type
    as ``src`` (or ``in_place``), the whole checkpoint is written with only that entry
    replaced, so a Lightning ``.ckpt`` written with unifiedamp's scaler resumes with
    ``torch.amp.GradScaler`` (``to="torch"``) and back (``to="canonical"``); into
    another type, ``dst`` holds the converted state alone. ``dst=None`` writes nothing.
    A ``.keras`` ``src`` gives its loss-scale optimizer's state and config; a ``.keras``
    ``dst`` (``to="keras"``; it must exist) gets the state in its optimizer's variables.
    ``trusted`` and ``limits`` are :func:`load_file`'s. ``config_fields`` names the fields
    of ``config`` the caller set on purpose: where the file carries one of them with another
    value (the state follows the file's), a ``ValueError`` says so before anything is
    written.

    Returns:
        A summary: ``src``, ``dst``, ``key``, ``from``, ``to``, ``whole`` (whether the
        rest of the checkpoint was kept), ``config``, ``state``, ``state_dict`` and
        ``notes`` (from or to the flax form: what a resumed run does differently, and
        what to build; empty otherwise).

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_file({"step": 10, "scaler": {"scale": 512.0, "growth_factor": 2.0,
        ...     "backoff_factor": 0.5, "growth_interval": 100, "_growth_tracker": 7}},
        ...     os.path.join(folder, "ckpt.json"))
        >>> r = port_state_file(os.path.join(folder, "ckpt.json"), to="keras", in_place=True)
        >>> r["key"], r["from"], load_file(os.path.join(folder, "ckpt.json"))["scaler"]
        ('scaler', 'torch', {'dynamic_scale': 512.0, 'step_counter': 7, 'hysteresis_counter': 0})
    """
    if in_place:
        if dst is not None and os.path.abspath(dst) != os.path.abspath(src):
            raise ValueError(f"in_place=True writes {src} itself; dst={dst!r} says another file")
        dst = src
    src_type = "orbax" if is_orbax(src) else file_type(src)
    dst_type = None if dst is None else _dst_type(src, src_type, dst)
    if dst_type == "keras" and to != "keras":
        raise ValueError(f"{dst} is a Keras model: the state goes into its optimizer's "
                         f"variables, the keras form; pass to='keras', not {to!r}; nothing "
                         "was written")
    if src_type == "orbax":
        container = load_orbax(src, trusted=trusted, limits=limits)
    else:
        container = load_file(src, trusted=trusted, limits=limits)
    if src_type == "keras":
        # The optimizer's own config, unless the caller gives one.
        if config is None:
            config = ScalerConfig(**container["scaler_config"])
        container = {k: v for k, v in container.items() if k != "scaler_config"}
    found_key, state = _find(container, key, src)
    if config is not None and config_fields and detect_form(state) == "flax":
        # A DynamicScale's unnamed fields are its own defaults (a floor of 2**-126), not
        # the canonical ones.
        config = flax_config(state, config, config_fields)
    cfg, st, form = read_state(state, config)
    if config is not None:
        _check_fields(src, cfg, config, config_fields)
    converted = convert_state(state, to, config)
    # What a run resumed across Flax's rule does differently (empty for other forms).
    notes = flax_notes(cfg, st, form, to)
    if dst is not None and dst_type == "keras":
        # The model and optimizer of dst (src itself in place) are the target.
        save_keras(converted, cfg, dst, dst, trusted)
        return {"src": os.fspath(src), "dst": os.fspath(dst), "key": found_key,
                "from": form, "to": to, "whole": True, "config": cfg.to_dict(),
                "state": st._asdict(), "state_dict": converted, "notes": notes}
    whole = dst is not None and dst_type == src_type and found_key is not None
    if dst is not None:
        stored = _storable(converted, str(dst_type))
        out = {**container, found_key: stored} if whole else stored
        if dst_type == "orbax":
            save_orbax(out, dst)
        else:
            save_file(out, dst)
    return {"src": os.fspath(src), "dst": None if dst is None else os.fspath(dst),
            "key": found_key, "from": form, "to": to, "whole": whole,
            "config": cfg.to_dict(), "state": st._asdict(), "state_dict": converted,
            "notes": notes}


def _dst_type(src: Any, src_type: str, dst: Any) -> str:
    # A path without an extension (or an Orbax directory) is an Orbax checkpoint directory.
    if os.path.abspath(dst) == os.path.abspath(src):
        return src_type
    if is_orbax(dst) or not os.path.splitext(os.fspath(dst))[1]:
        return "orbax"
    return file_type(dst)


def _check_fields(src: Any, cfg: ScalerConfig, config: ScalerConfig,
                  fields: Collection[str]) -> None:
    follows, given = cfg.to_dict(), config.to_dict()
    differ = [f"{k}={given[k]!r} (the file's: {follows[k]!r})" for k in fields
              if follows[k] != given[k]]
    if differ:
        raise ValueError(f"config says {', '.join(differ)}, but {src} carries its own, which "
                         "is what the state follows: drop those fields from config (CLI: "
                         "--config), or convert first and edit the written config; nothing "
                         "was written")
