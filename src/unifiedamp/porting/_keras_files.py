"""``.keras`` files: a Keras model's loss-scale optimizer read and written in a child process.

A ``.keras`` file is a whole model: :func:`load_keras` loads it with
``keras.models.load_model`` (safe mode unless trusted) in a child process, Keras with its own
``KERAS_BACKEND`` and unifiedamp's classes registered (tensorflow and paddle in one process
segfault; no framework is imported here), and reads its optimizer's variables;
:func:`save_keras` assigns a state to them and saves the model atomically.
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any

from unifiedamp._atomic_write import atomic_path
from unifiedamp.porting._limits import Exceeded, ReadLimits, check_zip
from unifiedamp.spec import ScalerConfig
from unifiedamp.spec._state_dict import state_number

__all__ = ["load_keras", "save_keras"]

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
from unifiedamp.spec._state_dict import native_defaults
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
    config = native_defaults("keras").to_dict() | {
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


def _keras_child(mode: str, path: Any, trusted: bool, *args: str,
                 limits: ReadLimits | None = None) -> dict[str, Any]:
    from unifiedamp._forks import run_code

    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a Keras .keras archive (model.save writes a zip "
                         "file): it is damaged or of another type; nothing was read")
    try:
        check_zip(path, None if trusted else (limits or ReadLimits()))
    except Exceeded as exc:
        raise ValueError(f"{path} is refused: {exc}; nothing was read") from None
    # Forked from an interpreter that imported Keras (for this process's later files too):
    # the import is most of a file's time.
    proc = run_code(_KERAS_CHILD, [mode, os.fspath(path), "trusted" if trusted else "safe",
                                   *args], preload=("keras", "unifiedamp.backends.keras"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_KERAS_MARK)]
    if proc.returncode != 0 or not lines:
        # The exception's own line says why; the child's traceback says nothing more to a user.
        last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or [""]
        raise ValueError(f"{path}: keras.models.load_model could not load it (exit "
                         f"{proc.returncode}): {last[0].strip()[:500]}; damaged, or it needs "
                         "what safe mode refuses (--trust: only if you trust it); nothing read")
    out = json.loads(lines[-1][len(_KERAS_MARK):])
    if "error" in out:
        raise ValueError(out["error"])
    return out


def load_keras(path: Any, trusted: bool, limits: ReadLimits) -> dict[str, Any]:
    # The keras form of the model's loss-scale optimizer, and its canonical config.
    out = _keras_child("read", path, trusted, limits=limits)
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
        _keras_child("write", model_from, trusted, json.dumps(plain, default=_number),
                     json.dumps(config.to_dict()), tmp)


def _number(value: Any) -> Any:
    # A NumPy scalar from a file, as the Python number JSON writes.
    return value.item()
