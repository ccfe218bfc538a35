"""``unifiedamp port-state`` with Keras (its own LossScaleOptimizer on TensorFlow): a run
checkpointed in Keras resumes in torch, paddle, JAX and NumPy, and a run checkpointed in each
of them resumes in Keras, from the checkpoint ported to the other's form, with the
uninterrupted run's exact trajectory; a ``.keras`` file's loss-scale state is read and
written through its optimizer, and a Lambda layer's code runs only when trusted.

Keras, torch and JAX train in this process with their real optimizers and autodiff
(tests/support/port_state_runs.py); paddle, which cannot share a process with TensorFlow,
trains in a process of its own, where Keras's checkpoint is also ported to paddle's form (a
paddle.save file). The pairs without Keras: tests/cross/test_port_state.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import port_state_runs as runs  # noqa: E402
from port_state_runs import CHECKPOINT_AT, RESUMES, SAVES  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp.porting import load_file, port_state_file, save_file  # noqa: E402
from unifiedamp.spec import ScalerConfig  # noqa: E402

SUPPORT = pathlib.Path(__file__).resolve().parents[1] / "support"
ON_TENSORFLOW = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason=f"KERAS_BACKEND={keras.backend.backend()}: Keras's side trains and saves with "
           "TensorFlow (tf.GradientTape, its .keras files): in the keras session on tensorflow")

# ================================================================ cross-framework resume

#: paddle's side, in a new interpreter: port_state_runs.main over a list of commands.
PADDLE_SIDE = "import sys; sys.path.insert(0, sys.argv[2]); import port_state_runs; " \
              "port_state_runs.main(sys.argv[1:2])"


def paddle_side(commands: list) -> list:
    proc = subprocess.run([sys.executable, "-c", PADDLE_SIDE, json.dumps(commands),
                           str(SUPPORT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@ON_TENSORFLOW
def test_a_run_checkpointed_in_one_framework_resumes_in_every_other_with_the_same_trajectory(
        tmp_path):
    others = [fw for fw in ("torch", "paddle", "jax", "numpy")
              if importlib.util.find_spec(runs.MODULES[fw])]
    here = [fw for fw in others if fw != "paddle"]
    folder = {fw: tmp_path / fw for fw in ["keras", *others]}
    for f in folder.values():
        f.mkdir()
    keras_file = str(folder["keras"] / SAVES["keras"])

    # 1. Uninterrupted run in each framework, checkpointing in its own form after AT steps;
    #    paddle's: also Keras's checkpoint ported to its form (paddle.save) and resumed.
    full = {fw: runs.uninterrupted(fw, folder[fw]) for fw in ["keras", *here]}
    resumed = {}
    if "paddle" in others:
        to_paddle = str(folder["paddle"] / f"from-keras-{RESUMES['paddle'][1]}")
        run, _, from_keras = paddle_side([
            ["run", "paddle", str(folder["paddle"])],
            ["port", [[RESUMES["paddle"][0], keras_file, to_paddle]]],
            ["resume", "paddle", to_paddle]])
        full["paddle"] = [tuple(s) for s in run]
        resumed["keras", "paddle"] = [tuple(s) for s in from_keras]
    for fw, states in full.items():  # every framework's own run follows the spec
        assert states == runs.expected(), (fw, states, runs.expected())

    # 2. port-state: Keras's checkpoint into each other form, each other one into Keras's.
    runs.port([(RESUMES[b][0], keras_file, str(folder[b] / f"from-keras-{RESUMES[b][1]}"))
               for b in here])
    runs.port([(RESUMES["keras"][0], str(folder[a] / SAVES[a]),
                str(folder["keras"] / f"from-{a}-{RESUMES['keras'][1]}")) for a in others])

    # 3. Resume in B from A, continue the pattern, compare with A's uninterrupted run.
    for b in here:
        resumed["keras", b] = runs.resumed(b, folder[b] / f"from-keras-{RESUMES[b][1]}")
    for a in others:
        resumed[a, "keras"] = runs.resumed(
            "keras", folder["keras"] / f"from-{a}-{RESUMES['keras'][1]}")
    failures = []
    for (a, b), got in resumed.items():
        diff = runs.first_difference(got, full[a][CHECKPOINT_AT:])
        if diff:
            failures.append(f"{a} -> {b}: {diff}")
    assert len(resumed) == 2 * len(others)
    assert not failures, "\n".join(failures)


# ================================================================ Keras .keras files


def make_keras_files(folder: pathlib.Path) -> dict:
    """ours.keras (unifiedamp's wrapper, trained), native.keras (Keras's own optimizer,
    never built), plain.keras (no loss scaling), lambda.keras (a Lambda layer whose code
    leaves a marker when it runs); returns the wrapper's state dict, through JSON."""
    x = (np.arange(24, dtype=np.float32).reshape(6, 4) - 11) / 16
    x[4, 1] = np.inf  # the last batch of two overflows
    y = np.ones((6, 1), np.float32)

    def model():
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.set_weights([np.full((4, 1), 0.1, np.float32), np.zeros(1, np.float32)])
        return m

    # unifiedamp's wrapper, hysteresis 2: the inf leaves a hysteresis tracker of 1
    ours = model()
    scaler = ua.GradScaler(1024.0, growth_interval=2, hysteresis=2, backend="keras")
    ours.compile(optimizer=scaler.wrap(keras.optimizers.SGD(0.01)), loss="mse")
    ours.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    ours.save(folder / "ours.keras")
    # Keras's own LossScaleOptimizer, saved before any step (its variables not built yet)
    native = model()
    native.compile(optimizer=keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.01), initial_scale=1024.0, dynamic_growth_steps=3), loss="mse")
    native.save(folder / "native.keras")
    plain = model()
    plain.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    plain.save(folder / "plain.keras")
    # A Lambda layer whose code, run when a model is built from the file, leaves a marker.
    marker = str(folder / "lambda-ran")
    touch = eval(f"lambda t: (__import__('pathlib').Path({marker!r}).touch(), t)[1]")
    lam = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(touch),
                            keras.layers.Dense(1)])
    lam.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)),
                loss="mse")
    lam.save(folder / "lambda.keras")
    os.remove(marker)
    from unifiedamp.backends.keras import KerasGradScaler

    return json.loads(json.dumps(KerasGradScaler.of(ours.optimizer).state_dict()))


@pytest.mark.slow
@ON_TENSORFLOW
def test_a_keras_file_is_read_and_written_through_its_loss_scale_optimizer(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")  # for a process the reader may start
    expected = make_keras_files(tmp_path)
    # F F (a growth to 2048) then I: hysteresis 2 keeps the scale and counts the inf
    assert (expected["scale"], expected["hysteresis_tracker"]) == (2048.0, 1)

    # read: unifiedamp's wrapper gives its exact state and its own config
    report = port_state_file(tmp_path / "ours.keras", tmp_path / "ours.json", to="canonical")
    assert report["from"] == "keras"
    saved = load_file(tmp_path / "ours.json")
    for k in ("scale", "growth_tracker", "hysteresis_tracker", "config"):
        assert saved[k] == expected[k], k
    assert saved["config"] == ScalerConfig(1024.0, growth_interval=2, hysteresis=2).to_dict()

    # write: a torch-native state into Keras's own LossScaleOptimizer (never built before)
    torch_sd = {"scale": 256.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                "growth_interval": 3, "_growth_tracker": 2}
    save_file({"step": 5, "scaler": torch_sd}, tmp_path / "t.json")
    report = port_state_file(tmp_path / "t.json", tmp_path / "native.keras", to="keras")
    assert report["whole"] and report["key"] == "scaler"
    assert os.path.exists(tmp_path / "native.keras")
    opt = keras.models.load_model(tmp_path / "native.keras").optimizer
    got = [type(opt).__name__, float(keras.ops.convert_to_numpy(opt.dynamic_scale)),
           int(keras.ops.convert_to_numpy(opt.step_counter)), int(opt.dynamic_growth_steps)]
    assert got == ["LossScaleOptimizer", 256.0, 2, 3]

    # bad input: no loss-scale optimizer, a missing destination, a non-keras form
    plain = (tmp_path / "plain.keras").read_bytes()
    with pytest.raises(ValueError, match="not a keras.optimizers.LossScaleOptimizer"):
        port_state_file(tmp_path / "plain.keras", to="keras", in_place=True)
    with pytest.raises(ValueError, match="not a keras.optimizers.LossScaleOptimizer"):
        port_state_file(tmp_path / "t.json", tmp_path / "plain.keras", to="keras")
    with pytest.raises(ValueError, match="needs that file to exist already"):
        port_state_file(tmp_path / "t.json", tmp_path / "new.keras", to="keras")
    with pytest.raises(ValueError, match="pass to='keras'"):
        port_state_file(tmp_path / "t.json", tmp_path / "native.keras", to="canonical")
    assert (tmp_path / "plain.keras").read_bytes() == plain
    assert not (tmp_path / "new.keras").exists()

    # untrusted: a Lambda layer's code is refused by Keras's safe mode, and nothing runs
    with pytest.raises(ValueError, match="lambda.keras: keras.models.load_model could not "
                                         "load it .*[Ll]ambda"):
        port_state_file(tmp_path / "lambda.keras", to="canonical")
    assert not (tmp_path / "lambda-ran").exists()
    port_state_file(tmp_path / "lambda.keras", to="canonical", trusted=True)
    assert (tmp_path / "lambda-ran").exists()  # the payload was live: trust runs it
    # a damaged archive is named, without a traceback
    (tmp_path / "junk.keras").write_bytes(b"PK\x03\x04" + b"junk" * 50)
    with pytest.raises(ValueError, match="junk.keras is not a Keras .keras archive"):
        port_state_file(tmp_path / "junk.keras", to="canonical")
    assert not [p for p in os.listdir(tmp_path) if "unifiedamp-tmp-" in p]
