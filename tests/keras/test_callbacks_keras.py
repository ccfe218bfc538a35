"""``unifiedamp.callbacks.keras.ScaleLogger`` in a real ``model.fit``, on the session's Keras
backend (the keras session runs once per ``KERAS_BACKEND``: tensorflow, jax, torch): the batch
logs every N steps and the epoch logs carry ``loss_scale`` and ``skipped_steps``, which
``keras.callbacks.CSVLogger`` and ``History`` record; the values equal the spec's rule and
the count of skipped steps, across epochs, two ``fit`` calls and ``steps_per_execution``.
"""

from __future__ import annotations

import pathlib

import keras
import numpy as np
import pytest

from unifiedamp import spec
from unifiedamp.spec import ScalerConfig, ScalerState

CONFIG = ScalerConfig(64.0, growth_interval=3)


def _reference(kinds: str) -> list[tuple[float, int]]:
    """(scale, skipped so far) after each step of ``kinds`` (F finite, I inf)."""
    state, skipped, out = ScalerState.initial(CONFIG), 0, []
    for kind in kinds:
        state = spec.update(CONFIG, state, kind == "I")
        skipped += kind == "I"
        out.append((state.scale, skipped))
    return out


def _model_and_data(kinds: str, steps_per_execution: int = 1):
    from unifiedamp.backends.keras import KerasGradScaler

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        1, kernel_initializer=keras.initializers.GlorotUniform(0))])
    model.compile(optimizer=KerasGradScaler(**CONFIG.to_dict()).wrap(keras.optimizers.SGD(0.01)),
                  loss="mse", steps_per_execution=steps_per_execution)
    x = np.ones((len(kinds), 2), np.float32)
    for row, kind in enumerate(kinds):
        if kind == "I":
            x[row, 0] = np.inf
    return model, x, np.ones((len(kinds), 1), np.float32)


def _spy():
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append({k: logs[k] for k in ("loss_scale", "skipped_steps") if k in logs})

    return Spy(), seen


# ------------------------------------------------------------ in model.fit


def test_batch_and_epoch_logs_reach_csv_logger_and_history():
    import csv
    import tempfile

    from unifiedamp.callbacks.keras import ScaleLogger

    epoch = "FIFFFIIF"  # one batch a step, two epochs: 16 steps
    model, x, y = _model_and_data(epoch)
    reference = _reference(epoch * 2)
    logger = ScaleLogger(every_n_steps=3)
    spy, seen = _spy()
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "log.csv"
        history = model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0,
                            callbacks=[logger, spy, keras.callbacks.CSVLogger(str(path))])
        with open(path) as f:
            rows = list(csv.DictReader(f))
    # Batch logs every 3 steps, with the values after that step.
    assert [bool(s) for s in seen] == [(k + 1) % 3 == 0 for k in range(16)], seen
    for k, logs in enumerate(seen):
        if logs:
            assert (logs["loss_scale"], logs["skipped_steps"]) == reference[k], (k, logs)
            assert isinstance(logs["loss_scale"], float)
            assert isinstance(logs["skipped_steps"], int)
    # Epoch logs: History and CSVLogger.
    ends = [reference[7], reference[15]]
    assert history.history["loss_scale"] == [e[0] for e in ends]
    assert history.history["skipped_steps"] == [e[1] for e in ends] == [3, 6]
    assert [(float(r["loss_scale"]), int(r["skipped_steps"])) for r in rows] == ends
    assert (logger.loss_scale, logger.skipped_steps) == ends[-1]

    # A second fit: the count goes on, and so does the every-3-steps schedule.
    seen.clear()
    more = "IFFFF"
    model2_x = np.ones((5, 2), np.float32)
    model2_x[0, 0] = np.inf
    model.fit(model2_x, y[:5], batch_size=1, epochs=1, shuffle=False, verbose=0,
              callbacks=[logger, spy])
    reference = _reference(epoch * 2 + more)
    assert [bool(s) for s in seen] == [(k + 1) % 3 == 0 for k in range(16, 21)], seen
    assert seen[1] == {"loss_scale": reference[17][0], "skipped_steps": 7}
    assert (logger.loss_scale, logger.skipped_steps) == reference[-1]


@pytest.mark.skipif(keras.backend.backend() == "torch", reason=(
    "KERAS_BACKEND=torch: Keras's torch trainer takes steps_per_execution=1 alone"))
def test_steps_per_execution_counts_every_step():
    """With steps_per_execution=2 Keras calls the batch hooks once per two steps, with the
    index of the last: skipped_steps still counts each step."""
    from unifiedamp.callbacks.keras import ScaleLogger

    kinds = "FIIFFFIF"
    model, x, y = _model_and_data(kinds, steps_per_execution=2)
    spy, seen = _spy()
    history = model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0,
                        callbacks=[ScaleLogger(every_n_steps=4), spy])
    reference = _reference(kinds)
    assert len(seen) == 4
    assert seen == [{}, {"loss_scale": reference[3][0], "skipped_steps": 2},
                    {}, {"loss_scale": reference[7][0], "skipped_steps": 3}], seen
    assert history.history["skipped_steps"] == [3]


def test_the_progress_bar_shows_the_numbers_plainly():
    """model.fit(verbose=1): Keras's progress bar prints every log value with .4f (.4e at
    0.001 and below); the logger's values print as they are, and stay numbers."""
    import contextlib
    import io
    import re

    from unifiedamp.callbacks.keras import ScaleLogger

    epoch = "FIFFFIIF"
    model, x, y = _model_and_data(epoch)
    reference = _reference(epoch * 2)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        history = model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=1,
                            callbacks=[ScaleLogger(every_n_steps=3)])
    # The bar is rewritten in place; each epoch's last state ends its line.
    ends = [line.rpartition("\r")[2].rstrip() for line in shown.getvalue().split("\n")
            if "skipped_steps" in line]
    assert len(ends) == 2, shown.getvalue()
    for end, (scale, skipped) in zip(ends, [reference[7], reference[15]], strict=True):
        assert re.search(rf" - loss_scale: {int(scale)} - skipped_steps: {skipped}$", end), end
    assert "e+00" not in shown.getvalue() and ".0000 - skipped" not in shown.getvalue()
    assert history.history["loss_scale"] == [reference[7][0], reference[15][0]]
    assert history.history["skipped_steps"] == [3, 6]
    assert all(isinstance(v, int) for v in history.history["skipped_steps"])
    # Still numbers for whatever computes with them.
    assert history.history["loss_scale"][0] / 2 == reference[7][0] / 2
    assert f"{history.history['loss_scale'][0]:>8}" == f"{reference[7][0]:>8}"


def test_an_unwrapped_optimizer_is_refused():
    from unifiedamp.callbacks.keras import ScaleLogger

    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="every_n_steps must be an int >= 1"):
            ScaleLogger(every_n_steps=bad)
    x, y = np.ones((2, 2), np.float32), np.ones((2, 1), np.float32)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    with pytest.raises(TypeError, match=r"model.optimizer is Adam: .*scaler.wrap"):
        model.fit(x, y, verbose=0, callbacks=[ScaleLogger()])
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    with pytest.raises(TypeError, match=r"Keras's own LossScaleOptimizer.*scaler.wrap"):
        model.fit(x, y, verbose=0, callbacks=[ScaleLogger()])


def test_reference_counts_skips_and_backs_off():
    assert _reference("FIFFF") == [(64.0, 0), (32.0, 1), (32.0, 1), (32.0, 1), (64.0, 1)]
