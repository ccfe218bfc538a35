"""The Keras wrapper in ``.keras`` files, on the session's Keras backend (the keras session
runs once per ``KERAS_BACKEND``): ``model.save`` / ``load_model`` resume exactly like an
uninterrupted run, the file leaves the rule and the counters out, and a new interpreter
loads the file after the documented import.
"""

from __future__ import annotations

import numpy as np
import pytest
from keras_helpers import (
    BACKEND,
    CUSTOM,
    as_tuple,
    assert_same_arrays,
    assert_states,
    dtype_policy,
    eager_steps,
    make_data,
    make_model,
    make_scaler,
    reference_states,
    scaler_of,
    snapshot,
    to_numpy,
    variable_state,
    with_inf,
)

from unifiedamp.spec import ScalerConfig


@pytest.mark.parametrize(("before", "after"), [
    ("FFFFIIFF", "FFIIFFF"),  # saved mid growth interval: the next finite step grows
    ("FFFFIIFFI", "IFFFIF"),  # saved mid hysteresis: the next inf backs off
], ids=["mid_growth_interval", "mid_hysteresis"])
def test_saved_model_resumes_exactly_like_an_uninterrupted_run(keras, tmp_path, before, after):
    from unifiedamp.backends.keras import KerasGradScaler

    with dtype_policy("mixed_float16"):
        scaler = make_scaler(**CUSTOM)
        model = make_model()
        model.compile(optimizer=scaler.wrap(keras.optimizers.Adam(1e-2)), loss="mse")
        x, y = make_data(8)
        batches = {"F": x, "I": with_inf(x)}
        for kind in before:
            model.train_on_batch(batches[kind], y)
        saved = scaler.state
        expected = reference_states(scaler.config, [k == "F" for k in before])[-1]
        assert as_tuple(saved) == expected and saved.growth_tracker + saved.hysteresis_tracker
        model.save(tmp_path / "m.keras")
        loaded = keras.models.load_model(tmp_path / "m.keras")
        again = KerasGradScaler.of(loaded.optimizer)
        assert again.config == ScalerConfig(**CUSTOM)
        assert as_tuple(again.state) == expected and variable_state(loaded.optimizer) == expected
        seen, uninterrupted = [], []
        for kind in after:
            model.train_on_batch(batches[kind], y)
            loaded.train_on_batch(batches[kind], y)
            uninterrupted.append(as_tuple(scaler.state))
            seen.append(as_tuple(again.state))
    assert_states(uninterrupted, reference_states(scaler.config, [k == "F" for k in after], saved))
    assert_states(seen, uninterrupted)
    assert_same_arrays(snapshot(loaded, loaded.optimizer), snapshot(model, model.optimizer),
                       "loaded vs uninterrupted")


_FRESH_LOAD = """
import sys
import unifiedamp
import keras
assert "unifiedamp.backends.keras" not in sys.modules
try:
    keras.saving.load_model({path!r})
except TypeError as error:
    print("WITHOUT", str(error).replace("\\n", " "))
import unifiedamp.backends.keras  # the documented line
model = keras.saving.load_model({path!r})
scaler = unifiedamp.backends.keras.KerasGradScaler.of(model.optimizer)
print("STATE", scaler.state_dict()["scale"], scaler.state.growth_tracker, scaler.num_steps)
"""


def test_a_saved_model_loads_in_a_fresh_process_after_the_documented_import(keras, tmp_path,
                                                                              run_python):
    """Keras resolves a class that is not its own from its registration alone (it imports
    only the modules of keras, keras_hub, keras_cv, keras_nlp): after ``import unifiedamp``
    alone, which imports no framework, the wrapper is unknown, and the error names its
    module; ``import unifiedamp.backends.keras`` registers it. The new interpreter runs
    Keras on the session's backend."""
    scaler = make_scaler(**CUSTOM)
    model = make_model()
    model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
    eager_steps(model, model.optimizer, "FFI")
    path = str(tmp_path / "m.keras")
    model.save(path)
    proc = run_python(_FRESH_LOAD.format(path=path), env={"KERAS_BACKEND": BACKEND})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.startswith(("WITHOUT", "STATE")))
    assert "'SpecLossScaleOptimizer'" in lines["WITHOUT"]
    assert "'module': 'unifiedamp.backends.keras'" in lines["WITHOUT"]
    state = scaler.state
    assert lines["STATE"] == f"{state.scale} {state.growth_tracker} 0"


def test_the_file_leaves_the_rule_and_the_counters_out(keras, tmp_path):
    """``model.save`` writes the variables the optimizer had before the rule and the
    counters existed (the scale, the trackers, the inner optimizer's), so files saved
    before load, and files saved now load into that layout."""
    import zipfile

    import h5py

    scaler = make_scaler(**CUSTOM)
    model = make_model()
    opt = scaler.wrap(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=opt, loss="mse")
    eager_steps(model, opt, "FI")
    path = tmp_path / "m.keras"
    model.save(path)
    unsaved = {"scaler_rule", "update_count", "skipped_count", "last_skipped",
               "unscale_factors"}
    assert unsaved <= {v.name for v in opt.variables}
    kept = [v for v in opt.variables if v.name not in unsaved]
    with zipfile.ZipFile(path) as z, h5py.File(z.open("model.weights.h5")) as f:
        stored = f["optimizer/vars"]
        assert len(stored) == len(kept)
        for i, v in enumerate(kept):
            np.testing.assert_array_equal(stored[str(i)][()], to_numpy([v])[0], err_msg=v.name)
    loaded = keras.models.load_model(path)
    again = scaler_of(loaded.optimizer)
    assert as_tuple(again.state) == as_tuple(scaler.state)
    assert (again.num_steps, again.num_skipped_steps) == (0, 0)  # counted afresh
