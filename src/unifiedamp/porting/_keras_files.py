"""``.keras`` files: a Keras model's loss-scale optimizer read and written.

A ``.keras`` file is a whole model: :func:`load_keras` loads it with
``keras.models.load_model`` (safe mode unless trusted), unifiedamp's classes registered, and
reads its optimizer's variables; :func:`save_keras` assigns a state to them and saves the
model atomically. Where that runs (:func:`_in_this_process`):

- a trusted file, in a process that has imported Keras already: in this process, on its
  Keras and backend (the file's code may run: the caller trusts it);
- anything else, in a plain child process (``python -c``, Keras with the environment's
  ``KERAS_BACKEND``) that exits when done. Importing Keras here would bring its backend
  (TensorFlow by default) into a process that may import paddle later, which segfaults
  (:mod:`unifiedamp._isolation`; writing a ``.pdopt`` does). And safe mode holds only in a
  fresh interpreter: Keras lets a process-wide ``keras.config.enable_unsafe_deserialization()``
  override ``load_model(safe_mode=True)``, and a file that crashes Keras or h5py ends the
  child, not the caller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
import zipfile
from typing import Any, cast

from unifiedamp._atomic_write import atomic_path
from unifiedamp.porting._limits import Exceeded, ReadLimits, check_zip
from unifiedamp.spec import ScalerConfig
from unifiedamp.spec._state_dict import native_defaults, state_number

__all__ = ["load_keras", "save_keras"]

_KERAS_MARK = "@@unifiedamp-keras@@"

# The child: runs _keras_io on its arguments and prints one line, _KERAS_MARK + JSON.
_KERAS_CHILD = r'''
import json, sys
from unifiedamp.porting._keras_files import _KERAS_MARK, _keras_io
out = _keras_io(sys.argv[1], sys.argv[2], sys.argv[3] == "trusted", *sys.argv[4:])
print(_KERAS_MARK + json.dumps(out), flush=True)
'''

# The fields of a config that make the rule (init_scale aside).
_RULE = ("growth_factor", "backoff_factor", "growth_interval", "hysteresis", "min_scale",
         "max_scale", "dynamic", "enabled")


def _keras_io(mode: str, path: str, trusted: bool, *args: str) -> dict[str, Any]:
    """Loads the model in ``path`` and reads (``mode="read"``) or writes (``"write"``: args
    are the state and its config as JSON, and the path to save the model to) its loss-scale
    optimizer's variables. Returns what was read, or ``{"error": ...}`` naming what in the
    file does not fit; Keras's own errors (a file it cannot load) propagate."""
    import keras

    import unifiedamp.backends.keras as uak  # registers SpecLossScaleOptimizer

    # safe_mode (Keras's default) refuses Lambda layers' bytecode and unsafe deserialisation.
    model = cast("keras.Model", keras.models.load_model(path, safe_mode=not trusted))
    opt = getattr(model, "optimizer", None)
    if not isinstance(opt, keras.optimizers.LossScaleOptimizer):
        return {"error": f"{path}: the model's optimizer is {type(opt).__name__}, not a "
                         "keras.optimizers.LossScaleOptimizer (nor unifiedamp's "
                         "SpecLossScaleOptimizer, ua.GradScaler(..., backend='keras').wrap(opt)): "
                         "there is no loss-scale state in it; nothing was written"}
    ours = isinstance(opt, uak.SpecLossScaleOptimizer)
    if ours:
        config = opt.scaler_config.to_dict()
    else:  # Keras's own: growth 2, backoff 0.5, hysteresis 1 hard-coded
        config = native_defaults("keras").to_dict() | {
            "init_scale": float(opt.initial_scale),
            "growth_interval": int(opt.dynamic_growth_steps)}
    if not opt.built:
        opt.build(model.trainable_variables)
    cls = type(opt).__name__
    if mode == "read":
        state = {"dynamic_scale": float(keras.ops.convert_to_numpy(opt.dynamic_scale)),  # pyright: ignore[reportArgumentType]
                 "step_counter": int(keras.ops.convert_to_numpy(opt.step_counter))}  # pyright: ignore[reportArgumentType]
        if ours:
            state["hysteresis_counter"] = int(keras.ops.convert_to_numpy(opt.hysteresis_counter))  # pyright: ignore[reportArgumentType]
        return {"state": state, "scaler_config": config, "optimizer": cls}
    state, source, tmp = json.loads(args[0]), json.loads(args[1]), args[2]
    differ = [f"{k}={source[k]!r} (the optimizer's: {config[k]!r})" for k in _RULE
              if source[k] != config[k]]
    if differ:
        return {"error": f"the state follows {', '.join(differ)}, but {path}'s {cls} was built "
                         "with another rule: pass config= (CLI: --config) with the optimizer's "
                         "parameters if that is meant; nothing was written"}
    if state.get("hysteresis_counter", 0) and not ours:
        return {"error": f"hysteresis_counter={state['hysteresis_counter']}: Keras's own "
                         f"LossScaleOptimizer in {path} has no hysteresis; nothing was written"}
    opt.dynamic_scale.assign(keras.ops.convert_to_tensor(state["dynamic_scale"], "float32"))
    opt.step_counter.assign(keras.ops.cast(state["step_counter"], opt.step_counter.dtype))
    if ours:
        opt.hysteresis_counter.assign(keras.ops.cast(state.get("hysteresis_counter", 0),
                                                     opt.hysteresis_counter.dtype))
    model.save(tmp)
    return {"optimizer": cls}


def _in_this_process(trusted: bool) -> bool:
    """Whether a ``.keras`` file is read here rather than in a child: see the module."""
    return trusted and sys.modules.get("keras") is not None


def _unloadable(path: Any, how: str, reason: str) -> ValueError:
    return ValueError(f"{path}: keras.models.load_model could not load it ({how}): "
                      f"{reason.strip()[:500]}; damaged, or it needs what safe mode refuses "
                      "(--trust: only if you trust it); nothing read")


def _on_keras_file(mode: str, path: Any, trusted: bool, *args: str,
                 limits: ReadLimits | None = None) -> dict[str, Any]:
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a Keras .keras archive (model.save writes a zip "
                         "file): it is damaged or of another type; nothing was read")
    try:
        check_zip(path, None if trusted else (limits or ReadLimits()))
    except Exceeded as exc:
        raise ValueError(f"{path} is refused: {exc}; nothing was read") from None
    if _in_this_process(trusted):
        try:
            with warnings.catch_warnings():  # Keras's notes on loading, as the child's
                warnings.simplefilter("ignore")
                out = _keras_io(mode, os.fspath(path), trusted, *args)
        except Exception as exc:
            lines = str(exc).strip().splitlines()
            raise _unloadable(path, "in this process", f"{type(exc).__name__}: "
                              f"{lines[0] if lines else ''}") from exc
    else:
        proc = subprocess.run(
            [sys.executable, "-c", _KERAS_CHILD, mode, os.fspath(path),
             "trusted" if trusted else "safe", *args], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_KERAS_MARK)]
        if proc.returncode != 0 or not lines:
            # The exception's own line says why; the child's traceback says nothing more to
            # a user.
            last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or [""]
            raise _unloadable(path, f"exit {proc.returncode}", last[0])
        out = json.loads(lines[-1][len(_KERAS_MARK):])
    if "error" in out:
        raise ValueError(out["error"])
    return out


def load_keras(path: Any, trusted: bool, limits: ReadLimits) -> dict[str, Any]:
    # The keras form of the model's loss-scale optimizer, and its canonical config.
    out = _on_keras_file("read", path, trusted, limits=limits)
    return {**out["state"], "scaler_config": out["scaler_config"]}


def save_keras(state: dict[str, Any], config: ScalerConfig, path: Any,
                model_from: Any, trusted: bool = False) -> None:
    """Assigns the keras-form ``state`` to the optimizer of the model in ``model_from`` and
    saves the model to ``path`` atomically (:func:`unifiedamp._atomic_write.atomic_path`)."""
    if not os.path.exists(model_from):
        raise ValueError(f"{model_from} does not exist: writing a scaler state into a .keras "
                         "file needs that file to exist already, its model and loss-scale "
                         "optimizer are the target (save it with model.save first); nothing "
                         "was written")
    plain = {k: state_number(state, k) for k in ("dynamic_scale", "step_counter",
                                            "hysteresis_counter") if k in state}
    with atomic_path(path, suffix=".keras") as tmp:
        _on_keras_file("write", model_from, trusted, json.dumps(plain, default=_number),
                     json.dumps(config.to_dict()), tmp)


def _number(value: Any) -> Any:
    # A NumPy scalar from a file, as the Python number JSON writes.
    return value.item()
