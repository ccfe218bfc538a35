"""Porting a scaler's *state* between frameworks: state dicts and checkpoint files.

Five forms of one scaler state, each the dict a framework's checkpoint holds:

- ``"canonical"``: unifiedamp's ``state_dict()`` (config, scale, both trackers);
- ``"torch"``: ``torch.amp.GradScaler.state_dict()`` (``scale``, the factors,
  ``growth_interval``, ``_growth_tracker``);
- ``"paddle"``: ``paddle.amp.GradScaler.state_dict()`` (``scale`` as a 1-element
  float32 array, ``incr_count``, ``decr_count``...);
- ``"keras"``: a Keras ``LossScaleOptimizer``'s variables ``dynamic_scale``,
  ``step_counter`` (and unifiedamp's ``hysteresis_counter``): the state only, the
  config is the optimizer's constructor's;
- ``"jmp"``: the fields of ``jmp.DynamicLossScale`` (``loss_scale``, ``counter``,
  ``period``, ``factor``, ``min_loss_scale``), as a JAX checkpoint stores them.

:func:`convert_state` turns one form into another; reading goes through
:func:`unifiedamp.spec.parse_state_dict`, so every form is validated by the same
rules, and nothing is dropped silently: a form that cannot carry the config raises
and names what would be lost. :func:`port_state_file` does it inside a checkpoint
file (``torch.save`` files and Lightning ``.ckpt``, Paddle ``.pdparams``/``.pdopt``,
JSON, flax msgpack, NumPy ``.npz``, Keras ``.keras`` models), rewriting the scaler's
entry and keeping the rest; :func:`save_file` writes atomically (temp file +
``os.replace``), so a process killed mid-write leaves the previous checkpoint whole.

No framework is imported at module import: each file type imports its framework
when it reads or writes one; a ``.keras`` file is loaded in a child process (Keras
with its own ``KERAS_BACKEND``), so tensorflow never shares a process with paddle.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import numbers
import os
import re
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from unifiedamp import spec
from unifiedamp._files import atomic_path
from unifiedamp.spec import ScalerConfig, ScalerState, f32

__all__ = ["FORMS", "LIGHTNING_KEYS", "convert_state", "detect_form", "file_type", "load_file",
           "port_state_file", "read_state", "save_file"]

#: The forms :func:`convert_state` reads and writes.
FORMS = ("canonical", "torch", "paddle", "keras", "jmp")

# The backend a canonical dict written from a native form names.
_BACKEND_OF = {"torch": "torch", "paddle": "paddle", "keras": "keras", "jmp": "jax"}

_KERAS_KEYS = ("dynamic_scale", "step_counter")
_JMP_KEYS = ("loss_scale", "counter", "period", "factor", "min_loss_scale")

# Where Lightning 2.x keeps its precision plugin's scaler in a .ckpt:
# checkpoint[prec_plugin.__class__.__qualname__] = prec_plugin.state_dict(), which is
# scaler.state_dict() (lightning/pytorch/trainer/connectors/checkpoint_connector.py).
LIGHTNING_KEYS = ("MixedPrecision", "FSDPPrecision")

_TORCH_EXT = (".pt", ".pth", ".ckpt", ".bin", ".tar")
_PADDLE_EXT = (".pdparams", ".pdopt", ".pdckpt")
_FILE_TYPES = {**{e: "torch" for e in _TORCH_EXT}, **{e: "paddle" for e in _PADDLE_EXT},
               ".json": "json", ".msgpack": "msgpack", ".npz": "npz", ".keras": "keras"}


def _closest(value: Any, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(value), choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ------------------------------------------------------------------ forms


def detect_form(d: Any) -> str:
    """Which of :data:`FORMS` a dict is, from its keys.

    Example:
        >>> detect_form({"scale": 1024.0, "_growth_tracker": 3, "growth_factor": 2.0,
        ...              "backoff_factor": 0.5, "growth_interval": 100})
        'torch'
        >>> detect_form({"dynamic_scale": 1024.0, "step_counter": 3})
        'keras'
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"a scaler state must be a dict, got {type(d).__name__}")
    if "format" in d:
        return "canonical"
    if "_growth_tracker" in d:
        return "torch"
    if "incr_count" in d or "decr_count" in d:
        return "paddle"
    if all(k in d for k in _KERAS_KEYS):
        return "keras"
    if "loss_scale" in d and "counter" in d:
        return "jmp"
    raise ValueError(
        f"not a scaler state: keys {sorted(map(str, d))} match none of the forms {FORMS} "
        "(canonical has 'format'; torch '_growth_tracker'; paddle 'incr_count'; keras "
        "'dynamic_scale' and 'step_counter'; jmp 'loss_scale' and 'counter'); pass the "
        "scaler's own entry (key=) if this is a whole checkpoint")


def _number(d: Mapping[str, Any], key: str) -> Any:
    # Files give back 0-d or 1-element arrays and tensors where the framework held a
    # variable (Keras, jmp, msgpack, npz), and JSON gives lists for Paddle's [scale].
    if key not in d:
        raise ValueError(f"Invalid scaler state_dict: the {detect_form(d)} form needs {key!r}, "
                         f"and this dict has only {sorted(map(str, d))}; nothing was loaded")
    value = d[key]
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if hasattr(value, "item") and not isinstance(value, numbers.Number):
        size = value.numel() if hasattr(value, "numel") else getattr(value, "size", None)
        if size == 1:
            value = value.item()
    return value


def _parse(canonical_like: dict[str, Any]) -> tuple[ScalerConfig, ScalerState]:
    return spec.parse_state_dict(canonical_like)


def read_state(d: Any, config: ScalerConfig | None = None
               ) -> tuple[ScalerConfig, ScalerState, str]:
    """Validates a scaler state in any of :data:`FORMS`: ``(config, state, form)``.

    ``config`` gives the parameters the form does not carry (torch's ``init_scale``,
    Keras's whole config, jmp's hysteresis...); without it they are the defaults of
    that form's native scaler (:data:`unifiedamp.spec.FRAMEWORKS`), except jmp's
    ``init_scale``, which is its current ``loss_scale`` (jmp keeps no initial scale).

    Raises:
        ValueError: Not a known form, or a field out of range; names the field.

    Example:
        >>> cfg, st, form = read_state({"dynamic_scale": 512.0, "step_counter": 2})
        >>> form, cfg.growth_interval, cfg.init_scale, st
        ('keras', 2000, 32768.0, ScalerState(scale=512.0, growth_tracker=2, hysteresis_tracker=0))
    """
    form = detect_form(d)
    if form in ("canonical", "torch", "paddle"):
        flat = dict(d)
        if form != "canonical":
            flat["scale"] = _number(d, "scale")
            for key in ("_growth_tracker", "incr_count", "decr_count"):
                if key in flat:
                    flat[key] = _number(d, key)
        base = config or _native_defaults(form)
        cfg, state = spec.parse_state_dict(flat, base=base)
        return cfg, state, form
    if form == "keras":
        base = config or _native_defaults("keras")
        hyst = _number(d, "hysteresis_counter") if "hysteresis_counter" in d else 0
        cfg, state = _parse(spec.to_state_dict(base, ScalerState(0.0), "keras")
                            | {"scale": _number(d, "dynamic_scale"),
                               "growth_tracker": _number(d, "step_counter"),
                               "hysteresis_tracker": hyst})
        if state.hysteresis_tracker and state.hysteresis_tracker >= cfg.hysteresis:
            raise ValueError(
                f"Invalid scaler state_dict: hysteresis_counter={state.hysteresis_tracker} "
                f"needs a config with hysteresis > {state.hysteresis_tracker}, and Keras's "
                "variables carry no config: pass config= (the optimizer's scaler_config); "
                "nothing was loaded")
        return cfg, state, form
    missing = [k for k in _JMP_KEYS if k not in d]
    if missing:
        raise ValueError(f"Invalid scaler state_dict: the jmp form is missing {missing} "
                         f"(jmp.DynamicLossScale has {list(_JMP_KEYS)}); nothing was loaded")
    factor, floor = _number(d, "factor"), _number(d, "min_loss_scale")
    scale = _number(d, "loss_scale")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
               for v in (factor, floor, scale)):
        raise ValueError(f"Invalid scaler state_dict: loss_scale, factor and min_loss_scale "
                         f"must be finite numbers, got {scale!r}, {factor!r}, {floor!r}; "
                         "nothing was loaded")
    if factor <= 0:
        raise ValueError(f"Invalid scaler state_dict: jmp's factor must be > 0, got "
                         f"factor={factor!r}; nothing was loaded")
    base = config or ScalerConfig(scale if scale > 0 else 1.0)
    raw = base.to_dict() | {"growth_factor": float(factor), "backoff_factor": 1.0 / factor,
                            "growth_interval": _number(d, "period"),
                            # jmp's 0 is "no floor" (jnp.maximum(0, scale / f))
                            "min_scale": float(floor) if floor > 0 else None}
    canonical = spec.to_state_dict(base, ScalerState(0.0), "jax") | {
        "config": raw, "scale": scale, "growth_tracker": _number(d, "counter"),
        "hysteresis_tracker": 0}
    cfg, state = _parse(canonical)
    return cfg, state, form


def _native_defaults(form: str) -> ScalerConfig:
    if form == "canonical":
        return ScalerConfig()
    defaults = spec.FRAMEWORKS[form]["defaults"]
    return ScalerConfig(**{k: v for k, v in defaults.items() if k in spec.CANONICAL})


def _lost(config: ScalerConfig, to: str) -> list[str]:
    """What the ``to`` form cannot carry of ``config`` (empty: it carries everything)."""
    c = config
    if not c.enabled:
        # torch and paddle save {} for a disabled scaler, which nothing can load.
        return ["enabled=False (a disabled scaler has no native state)"]
    checks = {
        "torch": [("growth_factor", c.growth_factor > 1.0),
                  ("backoff_factor", c.backoff_factor < 1.0),
                  ("hysteresis", c.hysteresis == 1), ("min_scale", c.min_scale is None),
                  ("max_scale", c.max_scale is None), ("dynamic", c.dynamic)],
        "paddle": [("growth_factor", c.growth_factor > 1.0),
                   ("backoff_factor", c.backoff_factor < 1.0),
                   ("min_scale", c.min_scale is None), ("max_scale", c.max_scale is None)],
        # jmp backs off by its one factor: backoff must be 1 / growth in float32.
        "jmp": [("backoff_factor", f32(c.backoff_factor) == f32(1.0 / c.growth_factor)),
                ("hysteresis", c.hysteresis == 1), ("max_scale", c.max_scale is None),
                ("dynamic", c.dynamic)],
        "keras": [],  # the variables carry no config at all: the optimizer's constructor does
    }[to]
    return [f"{name}={getattr(c, name)!r}" for name, ok in checks if not ok]


def _write(config: ScalerConfig, state: ScalerState, to: str, backend: str) -> dict[str, Any]:
    if to == "canonical":
        return spec.to_state_dict(config, state, backend)
    lost = _lost(config, to)
    if lost:
        raise ValueError(
            f"the {to} form cannot carry {', '.join(lost)}: loading it would run another "
            f"rule. Convert with to='canonical' (every unifiedamp backend loads it, "
            f"ua.GradScaler(..., backend='{_BACKEND_OF[to]}') included); nothing was written")
    s, c = state, config
    if to == "torch":
        # The factors rounded to float32, as TorchGradScaler.native_state_dict(): torch's
        # kernel multiplies by the factor it holds, and the float32 one gives the spec's bits.
        return {"scale": s.scale, "growth_factor": f32(c.growth_factor),
                "backoff_factor": f32(c.backoff_factor), "growth_interval": c.growth_interval,
                "_growth_tracker": s.growth_tracker}
    if to == "paddle":
        import numpy as np

        # As PaddleGradScaler.native_state_dict(); paddle's load reads state_dict["scale"][0].
        return {"scale": np.array([s.scale], np.float32), "incr_ratio": c.growth_factor,
                "decr_ratio": c.backoff_factor, "incr_every_n_steps": c.growth_interval,
                "decr_every_n_nan_or_inf": c.hysteresis, "incr_count": s.growth_tracker,
                "decr_count": s.hysteresis_tracker, "use_dynamic_loss_scaling": c.dynamic}
    if to == "keras":
        return {"dynamic_scale": s.scale, "step_counter": s.growth_tracker,
                "hysteresis_counter": s.hysteresis_tracker}
    # jmp: min_loss_scale 0.0 is "no floor" (its default 1.0 would add one).
    return {"loss_scale": s.scale, "counter": s.growth_tracker, "period": c.growth_interval,
            "factor": c.growth_factor, "min_loss_scale": c.min_scale or 0.0}


def convert_state(state: Any, to: str, config: ScalerConfig | None = None) -> dict[str, Any]:
    """A scaler state in any of :data:`FORMS`, in the form ``to``.

    The scale stays the same float32 value and the trackers the same ints. A form
    that cannot carry the config (torch's has no hysteresis, min/max scale or static
    mode; Paddle's no min/max scale; jmp's no hysteresis or max scale) raises,
    naming what would be lost; ``to="canonical"`` carries everything. The Keras form
    is the optimizer's variables only: build the optimizer with the config
    (``ua.GradScaler(**config, backend="keras").wrap(opt)``) and assign them.

    Args:
        state: A canonical, torch, paddle, keras or jmp state dict.
        to: One of :data:`FORMS`.
        config: The parameters the input form does not carry (see :func:`read_state`).

    Raises:
        ValueError: An unknown ``to``, an invalid ``state``, or a config ``to`` cannot
            carry. Nothing is modified.

    Example:
        >>> torch_sd = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
        ...             "growth_interval": 100, "_growth_tracker": 7}
        >>> jmp_sd = convert_state(torch_sd, "jmp")
        >>> jmp_sd
        {'loss_scale': 1024.0, 'counter': 7, 'period': 100, 'factor': 2.0, 'min_loss_scale': 0.0}
        >>> convert_state(jmp_sd, "torch") == torch_sd
        True
        >>> canonical = convert_state(torch_sd, "canonical", ScalerConfig(1024.0, hysteresis=2))
        >>> convert_state(canonical, "torch")
        Traceback (most recent call last):
        ...
        ValueError: the torch form cannot carry hysteresis=2: loading it would run another rule. ...
    """
    if to not in FORMS:
        raise ValueError(f"to must be one of {FORMS}, got {to!r}{_closest(to, FORMS)}")
    if config is not None and not isinstance(config, ScalerConfig):
        raise TypeError(f"config must be a ScalerConfig or None, got {type(config).__name__}: "
                        "ScalerConfig(**d) builds one from a dict")
    cfg, st, form = read_state(state, config)
    backend = state.get("backend", "unifiedamp") if form == "canonical" else _BACKEND_OF[form]
    return _write(cfg, st, to, str(backend))


# ------------------------------------------------------------------ files


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


def load_file(path: str | os.PathLike, trusted: bool = False) -> Any:
    """Reads a checkpoint file (its type from the extension, see :func:`file_type`).

    No file runs code unless ``trusted=True``: torch files load with
    ``weights_only=True``, Paddle files with a pickle reader that builds only
    containers, numbers, strings and NumPy arrays, ``.npz`` files without pickled
    objects, ``.keras`` models in Keras's safe mode. ``trusted=True`` (CLI:
    ``--trust``) unpickles torch and Paddle files in full and loads ``.keras`` models
    with ``safe_mode=False``: the file's own code then runs. A file that cannot be
    read, or whose data does not match its own checksums (the zip-based torch,
    ``.npz`` and ``.keras`` files carry a CRC-32 per member), raises a ``ValueError``
    naming it.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "scaler.json")
        >>> save_file({"scale": 8.0}, path)
        >>> load_file(path)
        {'scale': 8.0}
    """
    kind = file_type(path)
    if not os.path.isfile(path):
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path} is a directory, not a checkpoint file")
        raise FileNotFoundError(f"{path}: no such file")
    if kind in ("torch", "npz") and zipfile.is_zipfile(path):
        _check_zip(path)
    elif kind == "npz":  # np.load would take any other bytes for a pickle
        raise _unreadable(path, kind, zipfile.BadZipFile("not a zip archive"))
    with _reading(path, kind):
        if kind == "keras":
            return _load_keras(path, trusted)
        if kind == "json":
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        if kind == "npz":
            import numpy as np

            try:
                with np.load(path, allow_pickle=trusted) as data:
                    return {k: data[k] for k in data.files}
            except ValueError as exc:
                if "allow_pickle" in str(exc):
                    raise _Refused("pickled object arrays") from None
                raise
        if kind == "msgpack":
            from flax import serialization

            with open(path, "rb") as f:
                return serialization.msgpack_restore(f.read())
        if kind == "paddle":
            return _load_paddle(path, trusted)
        return _load_torch(path, trusted)


class _Refused(Exception):
    """A file holds objects that only an unrestricted (code-running) load builds."""


def _refusal(path: Any, what: str) -> ValueError:
    return ValueError(
        f"{path} holds {what}, which only a full unpickle builds, and a full unpickle runs "
        "code the file names: it is not done unless you trust where the file comes from "
        "(trusted=True; CLI: --trust); nothing was read")


@contextlib.contextmanager
def _reading(path: Any, kind: str) -> Iterator[None]:
    # Readers of untrusted bytes fail in many ways (EOFError, BadZipFile, KeyError from a
    # pickle opcode, RecursionError on deep JSON...): each becomes one error naming the file.
    try:
        yield
    except _Refused as exc:
        raise _refusal(path, str(exc)) from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.filename is not None:
            raise
        if isinstance(exc, ValueError) and str(exc).startswith(os.fspath(path)):
            raise
        raise _unreadable(path, kind, exc) from None
    except MemoryError:
        raise
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


def _check_zip(path: Any) -> None:
    # torch's zip reader does not check the CRC-32 it wrote: a flipped bit in tensor data
    # loads silently. Checking every member costs one read of the file.
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise ValueError(f"{path} is a damaged zip archive ({exc}); nothing was read") from None
    if bad is not None:
        raise ValueError(f"{path}: the data of its member {bad!r} does not match the "
                         "CRC-32 the file records for it: the file is damaged; nothing "
                         "was read")


def _load_torch(path: Any, trusted: bool) -> Any:
    import pickle

    import torch

    if trusted:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # Only an object outside weights_only's allow-list is a reason to trust; a
        # damaged pickle fails the same way in a full unpickle.
        match = re.search(r"GLOBAL ([\w.]+)|[Uu]nsupported (?:global|class):? ([\w.]+)",
                          str(exc))
        if match:
            raise _Refused(f"an object of {match.group(1) or match.group(2)}") from None
        raise


# What paddle.save writes for a state dict (protocol 2-4 pickles): containers, NumPy
# arrays and scalars, tensors as ``tuple((name, array))``, DenseTensors as
# ``eval('data', {'data': array})`` (paddle/framework/io.py, _pickle_save).
_PADDLE_GLOBALS = {
    ("collections", "OrderedDict"), ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("builtins", "tuple"), ("builtins", "list"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "complex"),
    ("_codecs", "encode"),  # bytes in protocol 2
}


def _dense_tensor_data(expression: Any, namespace: Any) -> Any:
    # Stands in for eval in paddle's DenseTensor records; anything else is refused.
    import numpy as np

    if (expression == "data" and isinstance(namespace, dict) and list(namespace) == ["data"]
            and isinstance(namespace["data"], np.ndarray)):
        return namespace["data"]
    raise _Refused("an eval() call that is not paddle's DenseTensor record")


def _load_paddle(path: Any, trusted: bool) -> Any:
    import pickle

    if trusted:
        import paddle

        # return_numpy: arrays, not paddle Tensors (tensors would need a device).
        return paddle.load(os.fspath(path), return_numpy=True)
    import _compat_pickle
    import importlib

    class WeightsUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            # Protocol 2 names Python 2's modules (__builtin__, copy_reg): Python 3's first,
            # as pickle's own find_class does, then the allow-list.
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            if (module, name) in _PADDLE_GLOBALS:
                return getattr(importlib.import_module(module), name)
            if (module, name) == ("builtins", "eval"):
                return _dense_tensor_data
            raise _Refused(f"a reference to {module}.{name}")

    with open(path, "rb") as f:
        obj = WeightsUnpickler(f, encoding="latin1").load()
    return _paddle_numpy(obj)


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

    def walk(x: Any) -> Any:
        if tensor_record(x):
            return x[1]
        if type(x) in (dict, OrderedDict):
            for k in list(x):
                x[k] = walk(x[k])
            return x
        if type(x) in (list, tuple, set):
            return type(x)(walk(v) for v in x)
        return x

    return walk(obj)


def _plain(value: Any) -> Any:
    # JSON has no arrays: a numpy scalar or array becomes its Python value(s).
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def save_file(obj: Any, path: str | os.PathLike) -> None:
    """Writes a checkpoint file atomically: a temp file beside it, then ``os.replace``
    (:func:`unifiedamp._files.atomic_path`): a failure or a process killed mid-write
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
    if kind == "npz":
        arrays = _flat_arrays(obj, path)  # refused before anything is written
    with atomic_path(path, suffix=os.path.splitext(path)[1]) as tmp:
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

                np.savez(f, **arrays)
            else:
                import torch

                torch.save(obj, f)


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
                    trusted: bool = False) -> dict[str, Any]:
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

    Returns:
        A summary: ``src``, ``dst``, ``key``, ``from``, ``to``, ``whole`` (whether the
        rest of the checkpoint was kept), ``config``, ``state`` and ``state_dict``.

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
    if dst is not None and file_type(dst) == "keras" and to != "keras":
        raise ValueError(f"{dst} is a Keras model: the state goes into its optimizer's "
                         f"variables, the keras form; pass to='keras', not {to!r}; nothing "
                         "was written")
    container = load_file(src, trusted=trusted)
    if file_type(src) == "keras":
        # The optimizer's own config, unless the caller gives one.
        if config is None:
            config = ScalerConfig(**container["scaler_config"])
        container = {k: v for k, v in container.items() if k != "scaler_config"}
    found_key, state = _find(container, key, src)
    cfg, st, form = read_state(state, config)
    converted = convert_state(state, to, config)
    if dst is not None and file_type(dst) == "keras":
        # The model and optimizer of dst (src itself in place) are the target.
        _save_keras(converted, cfg, dst, dst, trusted)
        return {"src": os.fspath(src), "dst": os.fspath(dst), "key": found_key,
                "from": form, "to": to, "whole": True, "config": cfg.to_dict(),
                "state": st._asdict(), "state_dict": converted}
    whole = dst is not None and file_type(dst) == file_type(src) and found_key is not None
    if dst is not None:
        stored = _storable(converted, file_type(dst))
        out = {**container, found_key: stored} if whole else stored
        save_file(out, dst)
    return {"src": os.fspath(src), "dst": None if dst is None else os.fspath(dst),
            "key": found_key, "from": form, "to": to, "whole": whole,
            "config": cfg.to_dict(), "state": st._asdict(), "state_dict": converted}


# ------------------------------------------------------------------ .keras files

# Runs in a child process (tensorflow and paddle in one process segfault; no framework is
# imported here): loads a .keras model with unifiedamp's classes registered and reads, or
# writes, its loss-scale optimizer's variables. Prints one line: _KERAS_MARK + JSON.
_KERAS_CHILD = r'''
import json, sys
mode, path, trust = sys.argv[1], sys.argv[2], sys.argv[3]
MARK = "@@unifiedamp-keras@@"
def done(**out):
    print(MARK + json.dumps(out), flush=True)
    sys.exit(0)
import keras
import unifiedamp.backends.keras as uak  # registers SpecLossScaleOptimizer
from unifiedamp import port_state
# safe_mode (Keras's default) refuses Lambda layers' bytecode and unsafe deserialisation.
model = keras.models.load_model(path, safe_mode=trust != "trusted")
opt = getattr(model, "optimizer", None)
if not isinstance(opt, keras.optimizers.LossScaleOptimizer):
    done(error=f"{path}: the model's optimizer is {type(opt).__name__}, not a "
               "keras.optimizers.LossScaleOptimizer (nor unifiedamp's SpecLossScaleOptimizer, "
               "ua.GradScaler(..., backend='keras').wrap(opt)): there is no loss-scale state "
               "in it; nothing was written")
ours = isinstance(opt, uak.SpecLossScaleOptimizer)
if ours:
    config = opt.scaler_config.to_dict()
else:  # Keras's own: growth 2, backoff 0.5, hysteresis 1 hard-coded
    config = port_state._native_defaults("keras").to_dict() | {
        "init_scale": float(opt.initial_scale), "growth_interval": int(opt.dynamic_growth_steps)}
if not opt.built:
    opt.build(model.trainable_variables)
cls = type(opt).__name__
if mode == "read":
    out = {"dynamic_scale": float(keras.ops.convert_to_numpy(opt.dynamic_scale)),
           "step_counter": int(keras.ops.convert_to_numpy(opt.step_counter))}
    if ours:
        out["hysteresis_counter"] = int(keras.ops.convert_to_numpy(opt.hysteresis_counter))
    done(state=out, scaler_config=config, optimizer=cls)
state, source, tmp = json.loads(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6]
rule = ("growth_factor", "backoff_factor", "growth_interval", "hysteresis", "min_scale",
        "max_scale", "dynamic", "enabled")
differ = [f"{k}={source[k]!r} (the optimizer's: {config[k]!r})" for k in rule
          if source[k] != config[k]]
if differ:
    done(error=f"the state follows {', '.join(differ)}, but {path}'s {cls} was built with "
               "another rule: pass config= (CLI: --config) with the optimizer's parameters "
               "if that is meant; nothing was written")
if state.get("hysteresis_counter", 0) and not ours:
    done(error=f"hysteresis_counter={state['hysteresis_counter']}: Keras's own "
               f"LossScaleOptimizer in {path} has no hysteresis; nothing was written")
opt.dynamic_scale.assign(keras.ops.convert_to_tensor(state["dynamic_scale"], "float32"))
opt.step_counter.assign(keras.ops.cast(state["step_counter"], opt.step_counter.dtype))
if ours:
    opt.hysteresis_counter.assign(keras.ops.cast(state.get("hysteresis_counter", 0),
                                                 opt.hysteresis_counter.dtype))
model.save(tmp)
done(optimizer=cls)
'''
_KERAS_MARK = "@@unifiedamp-keras@@"


def _keras_child(mode: str, path: Any, trusted: bool, *args: str) -> dict[str, Any]:
    import subprocess
    import sys

    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a Keras .keras archive (model.save writes a zip "
                         "file): it is damaged or of another type; nothing was read")
    _check_zip(path)
    proc = subprocess.run([sys.executable, "-c", _KERAS_CHILD, mode, os.fspath(path),
                           "trusted" if trusted else "safe", *args],
                          capture_output=True, text=True, env=dict(os.environ))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_KERAS_MARK)]
    if proc.returncode != 0 or not lines:
        # The exception's own line says why; the child's traceback says nothing more to a user.
        last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or [""]
        raise ValueError(f"{path}: keras.models.load_model could not load it (exit "
                         f"{proc.returncode}): {last[0].strip()[:500]}")
    out = json.loads(lines[-1][len(_KERAS_MARK):])
    if "error" in out:
        raise ValueError(out["error"])
    return out


def _load_keras(path: Any, trusted: bool) -> dict[str, Any]:
    # The keras form of the model's loss-scale optimizer, and its canonical config.
    out = _keras_child("read", path, trusted)
    return {**out["state"], "scaler_config": out["scaler_config"]}


def _save_keras(state: dict[str, Any], config: ScalerConfig, path: Any,
                model_from: Any, trusted: bool = False) -> None:
    """Assigns the keras-form ``state`` to the optimizer of the model in ``model_from`` and
    saves the model to ``path`` atomically (:func:`unifiedamp._files.atomic_path`)."""
    if not os.path.exists(model_from):
        raise ValueError(f"{model_from} does not exist: writing a scaler state into a .keras "
                         "file needs that file to exist already, its model and loss-scale "
                         "optimizer are the target (save it with model.save first); nothing "
                         "was written")
    plain = {k: _number(state, k) for k in ("dynamic_scale", "step_counter",
                                            "hysteresis_counter") if k in state}
    with atomic_path(path, suffix=".keras") as tmp:
        _keras_child("write", model_from, trusted, json.dumps(plain, default=_plain),
                     json.dumps(config.to_dict()), tmp)


# ------------------------------------------------------------------ command line


def _summary(r: dict[str, Any]) -> str:
    where = f"entry {r['key']!r}" if r["key"] is not None else "the whole file"
    st = r["state"]
    lines = [f"read {r['src']}: {where}, {r['from']} form",
             f"  scale {st['scale']!r} ({spec.f32_hex(st['scale'])}), growth_tracker "
             f"{st['growth_tracker']}, hysteresis_tracker {st['hysteresis_tracker']}",
             f"  config {json.dumps(r['config'])}"]
    if r["dst"] is None:
        lines.append(f"{r['to']} form (not written: pass -o OUT or --in-place):")
        lines.append("  " + json.dumps(r["state_dict"], default=_plain))
    else:
        rest = "the rest of the checkpoint kept" if r["whole"] else "the scaler state alone"
        lines.append(f"wrote {r['dst']}: {r['to']} form, {rest}")
    if r["to"] == "keras":
        lines.append("  keras form: the optimizer's variables; build the optimizer with the "
                     "config above (ua.GradScaler(**config, backend='keras').wrap(opt))")
    return "\n".join(lines)


def _cmd(args: Any) -> int:
    import sys

    try:
        config = ScalerConfig(**json.loads(args.config)) if args.config else None
        dst = args.output
        in_place = args.in_place or (dst is not None
                                     and os.path.abspath(dst) == os.path.abspath(args.input))
        report = port_state_file(args.input, None if in_place else dst, to=args.to,
                                 key=args.key, config=config, in_place=in_place,
                                 trusted=args.trust)
    except (ValueError, TypeError, OSError) as exc:
        print(f"unifiedamp port-state: error: {exc}", file=sys.stderr)
        return 2
    print(_summary(report))
    return 0


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp port-state IN --to FORM [-o OUT] [--key KEY]``."""
    p = sub.add_parser(
        "port-state", help="convert a scaler state inside a checkpoint file to another form",
        description="Finds the scaler state in a checkpoint (torch.save / Lightning .ckpt, "
                    "paddle .pdparams/.pdopt, .json, flax .msgpack, .npz, Keras .keras) and "
                    "converts it to another framework's form.")
    p.add_argument("input", help="the checkpoint file")
    p.add_argument("--to", required=True, choices=FORMS, help="the form to write")
    p.add_argument("-o", "--output", help="where to write (the same file: in place); "
                                          "omitted: print the result only")
    p.add_argument("--in-place", action="store_true", help="rewrite the input file")
    p.add_argument("--key", help="the checkpoint entry that holds the scaler state "
                                 "(default: found: Lightning's 'MixedPrecision', ...)")
    p.add_argument("--config", help="JSON of the parameters the input form does not carry, "
                                    "e.g. '{\"growth_interval\": 100}' for Keras variables")
    p.add_argument("--trust", action="store_true",
                   help="run the file's own code if it asks to: unpickle torch and paddle "
                        "files in full (arbitrary objects, any code the file names) and "
                        "load .keras models with safe_mode=False (Lambda layers); without "
                        "it no file runs code, and a file that needs this is refused")
    p.set_defaults(func=_cmd)
