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

import difflib
import json
import math
import numbers
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from unifiedamp import spec
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

    torch files load with ``weights_only=True`` (no code runs); ``trusted=True``
    falls back to a full unpickle for a checkpoint that holds other objects.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "scaler.json")
        >>> save_file({"scale": 8.0}, path)
        >>> load_file(path)
        {'scale': 8.0}
    """
    kind = file_type(path)
    if kind == "keras":
        return _load_keras(path)
    if kind == "json":
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    if kind == "npz":
        import numpy as np

        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    if kind == "msgpack":
        from flax import serialization

        with open(path, "rb") as f:
            return serialization.msgpack_restore(f.read())
    if kind == "paddle":
        import paddle

        # return_numpy: arrays, not paddle Tensors (tensors would need a device).
        return paddle.load(os.fspath(path), return_numpy=True)
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not trusted:
            raise ValueError(
                f"{path} holds objects torch.load(weights_only=True) refuses ({exc}); if you "
                "trust the file, load it with trusted=True (CLI: --trust), which unpickles "
                "it in full") from None
        return torch.load(path, map_location="cpu", weights_only=False)


def _plain(value: Any) -> Any:
    # JSON has no arrays: a numpy scalar or array becomes its Python value(s).
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def save_file(obj: Any, path: str | os.PathLike) -> None:
    """Writes a checkpoint file atomically: a temp file in the same folder, then
    ``os.replace``. A process killed mid-write leaves the old file whole.

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
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    # mkstemp makes the file private (0600): give it the mode an ordinary open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        with os.fdopen(fd, "wb") as f:
            if kind == "json":
                f.write(json.dumps(obj, indent=1, default=_plain).encode())
            elif kind == "msgpack":
                from flax import serialization

                f.write(serialization.msgpack_serialize(obj))
            elif kind == "npz":
                import numpy as np

                np.savez(f, **_flat_arrays(obj, path))
            elif kind == "paddle":
                import paddle

                f.close()
                paddle.save(obj, tmp)
            else:
                import torch

                torch.save(obj, f)
            if not f.closed:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
        _save_keras(converted, cfg, dst, dst)
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
mode, path = sys.argv[1], sys.argv[2]
MARK = "@@unifiedamp-keras@@"
def done(**out):
    print(MARK + json.dumps(out), flush=True)
    sys.exit(0)
import keras
import unifiedamp.backends.keras as uak  # registers SpecLossScaleOptimizer
from unifiedamp import port_state
model = keras.models.load_model(path)
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
state, source, tmp = json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
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


def _keras_child(*args: str) -> dict[str, Any]:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _KERAS_CHILD, *args], capture_output=True,
                          text=True, env=dict(os.environ))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_KERAS_MARK)]
    if proc.returncode != 0 or not lines:
        raise ValueError(f"{args[1]}: loading it with keras.models.load_model failed "
                         f"(exit {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    out = json.loads(lines[-1][len(_KERAS_MARK):])
    if "error" in out:
        raise ValueError(out["error"])
    return out


def _load_keras(path: Any) -> dict[str, Any]:
    # The keras form of the model's loss-scale optimizer, and its canonical config.
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    out = _keras_child("read", os.fspath(path))
    return {**out["state"], "scaler_config": out["scaler_config"]}


def _save_keras(state: dict[str, Any], config: ScalerConfig, path: Any,
                model_from: Any) -> None:
    """Assigns the keras-form ``state`` to the optimizer of the model in ``model_from`` and
    saves the model to ``path`` atomically (temp file + ``os.replace``)."""
    if not os.path.exists(model_from):
        raise ValueError(f"{model_from} does not exist: writing a scaler state into a .keras "
                         "file needs that file to exist already, its model and loss-scale "
                         "optimizer are the target (save it with model.save first); nothing "
                         "was written")
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".keras")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        plain = {k: _number(state, k) for k in ("dynamic_scale", "step_counter",
                                                "hysteresis_counter") if k in state}
        _keras_child("write", os.fspath(model_from), json.dumps(plain, default=_plain),
                     json.dumps(config.to_dict()), tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
                   help="unpickle a torch file in full when weights_only=True refuses it")
    p.set_defaults(func=_cmd)
