"""The Keras backend's diagnostics on the session's Keras backend (the keras session runs
once per ``KERAS_BACKEND``: tensorflow, jax, torch): ``overflow_report()`` after a skipped
step (an inf or NaN put into exactly one named variable's gradient, in a custom loop and in
``model.fit``), ``history()`` against the spec across a ring wrap-around, ``diagnose`` on
and off giving the same training bit for bit, and ``model.save`` / ``load_model`` with the
diagnostics' variables; on TensorFlow alone, an XLA-compiled custom step and
``MirroredStrategy`` over two logical CPUs (in a process of its own).
"""

from __future__ import annotations

import json
import os
import warnings
from types import SimpleNamespace

import keras
import numpy as np
import pytest
from keras_helpers import dtype_policy

from unifiedamp import spec
from unifiedamp.diagnostics import count_overflow
from unifiedamp.spec import ScalerConfig, ScalerState


def _only_on_tensorflow(why: str) -> pytest.MarkDecorator:
    backend = keras.backend.backend()
    return pytest.mark.skipif(backend != "tensorflow", reason=f"KERAS_BACKEND={backend}: {why}")


# ------------------------------------------------------------ helpers




def _backend() -> str:
    return keras.backend.backend()


def _mlp(seed: int = 0):
    """``net/hidden/{kernel,bias}`` (4 -> 8) and ``net/out/{kernel,bias}`` (8 -> 1)."""
    # Seeded initializers: keras.utils.set_random_seed would import TensorFlow (4 s).
    glorot = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu", name="hidden",
                           kernel_initializer=glorot(seed)),
        keras.layers.Dense(1, name="out", kernel_initializer=glorot(seed + 1)),
    ], name="net")


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x @ np.array([[0.5], [-0.25], [0.125], [1.0]], np.float32)).astype(np.float32)


def _with_inf(x: np.ndarray, rows: tuple[int, ...] = (1,)) -> np.ndarray:
    x = x.copy()
    for row in rows:
        x[row, 2] = np.inf
    return x


def _loss(y_pred, y):
    from keras import ops

    return ops.mean(ops.square(ops.cast(y_pred, "float32") - ops.convert_to_tensor(y)))


_JAX_GRADS: dict[int, tuple] = {}


def _gradients(model, x: np.ndarray, y: np.ndarray, opt) -> list[np.ndarray]:
    """The gradients of ``opt.scale_loss(mse)`` by the backend's own autodiff, as NumPy
    arrays (JAX: of mse times the scale, jitted once per model)."""
    from keras import ops

    variables = model.trainable_variables
    backend = _backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = opt.scale_loss(_loss(model(x, training=True), y))
        grads = tape.gradient(loss, variables)
    elif backend == "torch":
        for v in variables:
            v.value.grad = None
        opt.scale_loss(_loss(model(x, training=True), y)).backward()
        grads = [v.value.grad for v in variables]
    else:
        import jax

        if _JAX_GRADS.get(id(model), (None,))[0] is not model:
            def f(trainable, x, y, scale):
                y_pred, _ = model.stateless_call(trainable, [], x, training=True)
                return _loss(y_pred, y) * scale

            _JAX_GRADS[id(model)] = (model, jax.jit(jax.grad(f)))
        scale = _numpy([opt.dynamic_scale])[0]
        grads = _JAX_GRADS[id(model)][1]([v.value for v in variables], x, y, scale)
    return [np.array(ops.convert_to_numpy(g), np.float32) for g in grads]


def _tensors(arrays: list[np.ndarray]) -> list:
    from keras import ops

    return [ops.convert_to_tensor(a) for a in arrays]


def _numpy(values) -> list[np.ndarray]:
    from keras import ops

    return [np.array(ops.convert_to_numpy(v)) for v in values]


def _expected(name: str, scaled: np.ndarray, scale: float):
    """The GradientOverflow of a scaled gradient as unscaling makes it: times f32(1/scale)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return count_overflow(name, scaled.astype(np.float32) * np.float32(1.0 / scale))


def _scaler(*args, **kwargs):
    from unifiedamp.backends.keras import KerasGradScaler

    return KerasGradScaler(*args, **kwargs)


def _state(scaler) -> tuple[np.float32, int, int]:
    s = scaler.state
    return np.float32(s.scale), s.growth_tracker, s.hysteresis_tracker


def _spec_trajectory(config: ScalerConfig, skipped: list[bool]) -> list[tuple[int, float, bool]]:
    """(iteration, scale the update left, skipped) of each update by the reference rule."""
    state, out = ScalerState.initial(config), []
    for i, skip in enumerate(skipped, start=1):
        state = spec.update(config, state, skip)
        out.append((i, state.scale, skip))
    return out


def _recorder(scaler, what):
    """A callback that records ``what(scaler)`` after every train batch (``self.model``
    first: under JAX it syncs the train state into the variables)."""
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            assert self.model is not None
            seen.append(what(scaler))

    return Record(), seen


def _tap_model(seed: int = 0):
    """``net/tap/p`` (2,), then ``net/out/{kernel,bias}``. The tap adds exactly 0 to its
    input, so only ``p``'s gradient sees column 3 of the input: element 0 through a factor
    1e38 (so a row with x[:, 3] = 1 overflows it, times any scale), element 1 plainly."""
    from keras import ops

    class Tap(keras.layers.Layer):
        def build(self, input_shape):
            self.p = self.add_weight(shape=(2,), initializer="ones", name="p")

        def call(self, x):
            zero = self.p - ops.stop_gradient(self.p)  # 0, with the gradient of p
            factor = ops.sum(zero * ops.convert_to_tensor([1e38, 1.0])) * x[:, 3:4]
            return x + factor

    out = keras.layers.Dense(1, name="out",
                             kernel_initializer=keras.initializers.GlorotUniform(seed))
    return keras.Sequential([keras.Input((4,)), Tap(name="tap"), out], name="net")


# ------------------------------------------------------------ on every Keras backend


def test_custom_loop_report_names_the_poisoned_variable():
    """Gradients by the backend's autodiff; an inf, a -inf and a NaN put into
    ``net/out/kernel`` only, then a NaN into ``net/hidden/bias`` only: each report names
    exactly that variable, with the counts and largest finite |g| NumPy finds in the
    unscaled gradient."""
    with dtype_policy("mixed_float16"):
        scaler = _scaler(1024.0, growth_interval=1000, diagnose=True)
        model = _mlp()
        opt = scaler.wrap(keras.optimizers.Adam(1e-3))
        assert scaler.overflow_report() is None  # no update yet
        opt.build(model.trainable_variables)
        assert scaler.overflow_report() is None
        tvs = model.trainable_variables
        paths = [v.path for v in tvs]
        assert paths == ["net/hidden/kernel", "net/hidden/bias", "net/out/kernel", "net/out/bias"]
        x, y = _data(8)

        opt.apply(_tensors(_gradients(model, x, y, opt)), tvs)
        assert scaler.overflow_report() is None  # not skipped

        grads = _gradients(model, x, y, opt)
        assert all(np.isfinite(g).all() for g in grads)
        grads[2][1, 0], grads[2][3, 0], grads[2][2, 0] = np.inf, -np.inf, np.nan
        opt.apply(_tensors(grads), tvs)
        report = scaler.overflow_report()
        assert (report.step, report.scale, report.checked) == (2, 1024.0, 4), repr(report)
        assert report.names == ["net/out/kernel"]
        want = _expected("net/out/kernel", grads[2], 1024.0)
        assert (want.inf, want.nan) == (2, 1) and want.max_finite > 0
        assert report.overflows[0] == want, (report.overflows[0], want)
        assert report.loss_finite is (True if _backend() == "torch" else None)
        assert scaler.get_scale() == 512.0
        # watch renames, by identity; a Keras model keeps the paths.
        scaler.watch({"out.kernel": tvs[2]})
        assert scaler.overflow_report().names == ["out.kernel"]
        scaler.watch(model)
        assert scaler.overflow_report().names == ["net/out/kernel"]

        grads = _gradients(model, x, y, opt)
        grads[1][[0, 5]] = np.nan
        opt.apply(_tensors(grads), tvs)
        report = scaler.overflow_report()
        assert (report.step, report.scale, report.names) == (3, 512.0, ["net/hidden/bias"])
        assert report.overflows[0] == _expected("net/hidden/bias", grads[1], 512.0)
        assert (report.overflows[0].inf, report.overflows[0].nan) == (0, 2)

        opt.apply(_tensors(_gradients(model, x, y, opt)), tvs)
        assert scaler.overflow_report() is None
        assert int(opt.iterations) == 2


def test_fit_report_names_the_poisoned_variable():
    """``model.fit`` (TensorFlow's graph, JAX's jitted step, torch): one row of the third
    batch overflows ``net/tap/p``'s gradient only; the report read after each batch is
    None except after that one. A NaN input then makes the loss itself NaN."""
    scaler = _scaler(1024.0, growth_interval=1000, diagnose=True)
    model = _tap_model()
    model.compile(optimizer=scaler.wrap(keras.optimizers.SGD(1e-3)), loss="mse")
    x, y = _data(8)
    x[:, 3] = 0.0
    x[5, 3] = 1.0  # batch 2 (of 4, two rows each)
    callback, seen = _recorder(scaler, lambda s: s.overflow_report())
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert [r is None for r in seen] == [True, True, False, True], seen
    report = seen[2]
    assert (report.step, report.scale, report.checked) == (3, 1024.0, 3), repr(report)
    assert report.names == ["net/tap/p"]
    (o,) = report.overflows
    assert (o.shape, o.inf, o.nan) == ((2,), 1, 0)
    assert 0 < o.max_finite < np.inf  # p[1]'s gradient
    assert report.loss_finite is (True if _backend() == "torch" else None)
    assert scaler.get_scale() == 512.0

    x[1, 0] = np.nan
    model.fit(x[:2], y[:2], batch_size=2, epochs=1, shuffle=False, verbose=0)
    report = scaler.overflow_report()
    assert report.step == 5 and "net/out/kernel" in report.names
    assert report.loss_finite is (False if _backend() == "torch" else None)


def test_diagnose_on_and_off_give_identical_scales_and_weights():
    """The same fit with diagnose=True and history=3 and without: the scale after every
    step and the final weights bit for bit (on JAX with SGD, whose update is selected
    without diagnose and taken by a cond with it)."""
    x, y = _data(24)
    x = _with_inf(x, rows=(5, 6, 13, 21))  # batches 1, 3, 5 of 6
    # JAX: SGD, where the choice between select and cond is made.
    makes = ([lambda: keras.optimizers.SGD(0.05)] if _backend() == "jax"
             else [lambda: keras.optimizers.Adam(1e-2)])
    for make in makes:
        runs = []
        for options in ({}, {"diagnose": True, "history": 3}):
            scaler = _scaler(64.0, growth_interval=2, **options)
            model = _mlp(seed=3)
            model.compile(optimizer=scaler.wrap(make()), loss="mse")
            callback, scales = _recorder(scaler, _state)
            model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                      callbacks=[callback])
            runs.append((scales, _numpy(model.trainable_variables)))
        (scales_off, weights_off), (scales_on, weights_on) = runs
        assert scales_on == scales_off and len(set(scales_on)) >= 3, scales_on
        for a, b in zip(weights_on, weights_off, strict=True):
            np.testing.assert_array_equal(a, b)
        assert all(np.isfinite(w).all() for w in weights_on)


def test_history_wraps_around_like_the_spec():
    """A ring of 4 over 11 compiled steps (train_on_batch): after every step, the last
    min(k, 4) records equal the reference rule's (iteration, scale left, skipped)."""
    pattern = "FFIFIIFFFIF"
    config = ScalerConfig(256.0, growth_interval=2, hysteresis=2, backoff_factor=0.25)
    scaler = _scaler(**config.to_dict(), history=4)
    assert scaler.history().as_list() == []  # not wrapped yet
    model = _mlp()
    model.compile(optimizer=scaler.wrap(keras.optimizers.Adam(1e-3)), loss="mse")
    x, y = _data(4)
    reference = _spec_trajectory(config, [k == "I" for k in pattern])
    assert len({s for _, s, _ in reference}) >= 3
    for k, kind in enumerate(pattern, start=1):
        model.train_on_batch(_with_inf(x) if kind == "I" else x, y)
        history = scaler.history()
        assert history.as_list() == reference[max(0, k - 4):k], (k, history.as_list())
    arrays = history.as_arrays()
    assert arrays["scale"].dtype == np.float32 and list(arrays["iteration"]) == [8, 9, 10, 11]


def test_report_without_diagnose():
    """TensorFlow and JAX: without diagnose the gradients stay in the compiled step: with
    history the report gives step and scale and says to use diagnose=True; with neither,
    a RuntimeError says so. torch: the report is computed when asked from the gradients
    as they are then, and says when they were freed."""
    import gc

    x, y = _data(8)
    if _backend() != "torch":
        scaler = _scaler(128.0)
        model = _mlp()
        model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
        model.train_on_batch(_with_inf(x), y)
        with pytest.raises(RuntimeError, match=r"diagnose=True"):
            scaler.overflow_report()
        scaler = _scaler(128.0, history=2)
        model = _mlp()
        model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
        model.train_on_batch(x, y)
        assert scaler.overflow_report() is None
        model.train_on_batch(_with_inf(x), y)
        report = scaler.overflow_report()
        assert (report.step, report.scale, report.names, report.checked) == (2, 128.0, [], 0)
        assert "diagnose=True" in report.note and "diagnose=True" in str(report)
        model.train_on_batch(x, y)
        assert scaler.overflow_report() is None
        # The records hold the scale each update left; with no record before the skip the
        # scale it started from is inferred from the state it left.
        scaler = _scaler(128.0, history=1)
        model = _mlp()
        model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
        model.train_on_batch(_with_inf(x), y)
        assert scaler.overflow_report().step == 1 and scaler.overflow_report().scale == 128.0
        assert scaler.history().as_list() == [(1, 64.0, True)]
        return
    scaler = _scaler(128.0)
    model = _mlp()
    opt = scaler.wrap(keras.optimizers.SGD())
    opt.build(model.trainable_variables)
    tvs = model.trainable_variables
    grads = _gradients(model, x, y, opt)
    grads[3][0] = -np.inf
    tensors = _tensors(grads)
    opt.apply(tensors, tvs)
    report = scaler.overflow_report()  # the gradients are still alive
    assert (report.step, report.scale, report.names) == (1, 128.0, ["net/out/bias"])
    assert report.overflows[0] == _expected("net/out/bias", grads[3], 128.0)
    assert report.note == ""
    # Freed before the report is asked for: none listed, and the note says why.
    grads = _gradients(model, x, y, opt)
    grads[0][0, 0] = np.nan
    tensors = _tensors(grads)
    opt.apply(tensors, tvs)
    del tensors
    gc.collect()
    report = scaler.overflow_report()
    assert (report.step, report.scale, report.names, report.checked) == (2, 64.0, [], 0)
    assert "freed" in report.note and "diagnose=True" in report.note
    # In fit the gradients live on in .grad until the next step.
    model.compile(optimizer=opt, loss="mse")
    model.train_on_batch(_with_inf(x, rows=(2,)), y)
    assert scaler.overflow_report().step == 3 and scaler.overflow_report().names


def test_save_and_load_keep_diagnostics_out_of_the_file():
    """The file holds the variables an optimizer without diagnostics holds: it loads into
    an optimizer with or without them (no 'Skipping variable loading' warning), the
    config brings diagnose and history back, and training resumes exactly."""
    import tempfile
    import zipfile

    import h5py

    from unifiedamp.backends.keras import KerasGradScaler

    x, y = _data(8)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.keras")
        plain = _mlp()
        plain.compile(optimizer=_scaler(1.0).wrap(keras.optimizers.Adam(1e-2)), loss="mse")
        plain.optimizer.build(plain.trainable_variables)
        scaler = _scaler(1024.0, growth_interval=3, diagnose=True, history=3)
        model = _mlp()
        model.compile(optimizer=scaler.wrap(keras.optimizers.Adam(1e-2)), loss="mse")
        for batch in (x, _with_inf(x), x):
            model.train_on_batch(batch, y)
        model.save(path)
        with zipfile.ZipFile(path) as z, h5py.File(z.open("model.weights.h5")) as f:
            # All of a plain optimizer's variables but the rule (the config holds it) and
            # the update counters.
            unsaved = ("scaler_rule", "update_count", "skipped_count", "last_skipped",
                       "unscale_factors")
            saved = [v for v in plain.optimizer.variables if v.name not in unsaved]
            assert len(f["optimizer/vars"]) == len(saved) == len(
                plain.optimizer.variables) - len(unsaved)
        assert len(model.optimizer.variables) >= len(plain.optimizer.variables) + 3
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = keras.models.load_model(path)
        again = KerasGradScaler.of(loaded.optimizer)
        assert (loaded.optimizer.diagnose, loaded.optimizer.history_size) == (True, 3)
        assert _state(again) == _state(scaler) == (np.float32(512.0), 1, 0)
        assert again.history().as_list() == [] and again.overflow_report() is None
        for batch in (_with_inf(x), x):
            model.train_on_batch(batch, y)
            loaded.train_on_batch(batch, y)
            assert _state(again) == _state(scaler)
        for a, b in zip(_numpy(loaded.trainable_variables), _numpy(model.trainable_variables),
                        strict=True):
            np.testing.assert_array_equal(a, b)
        assert again.overflow_report() is None and again.history().as_list() == [
            (1, 256.0, True), (2, 256.0, False)]

        # The same file into an optimizer without diagnostics.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            plain.load_weights(path)
        assert _state(KerasGradScaler.of(plain.optimizer)) == (np.float32(512.0), 1, 0)


def test_options_are_validated_and_kept_in_the_config():
    from unifiedamp.backends.keras import KerasGradScaler, SpecLossScaleOptimizer

    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match=rf"diagnose must be True or False, got {bad!r}"):
            KerasGradScaler(diagnose=bad)
    for bad in (-1, True, 2.5, "8"):
        with pytest.raises((TypeError, ValueError),
                           match=rf"history must be an int >= 0 .*got {bad!r}.*"
                                             r"history=1000"):
            KerasGradScaler(history=bad)
    with pytest.raises(ValueError, match="history must be"):
        SpecLossScaleOptimizer(keras.optimizers.SGD(), history=-2)
    with pytest.raises(ValueError, match=r"history=N"):
        KerasGradScaler().history()
    with pytest.raises(TypeError, match=r"watch\(\) takes a model .*got int"):
        KerasGradScaler().watch(3)
    with pytest.raises(TypeError, match=r"item 0 must be a \(name, variable\) pair"):
        KerasGradScaler().watch([("a",)])
    assert KerasGradScaler(np.int64(4), history=np.int64(5)).wrap(
        keras.optimizers.SGD()).history_size == 5

    plain = KerasGradScaler(8.0).wrap(keras.optimizers.SGD())
    assert "diagnose" not in plain.get_config() and "history" not in plain.get_config()
    opt = KerasGradScaler(8.0, diagnose=True, history=7).wrap(keras.optimizers.SGD())
    config = opt.get_config()
    assert (config["diagnose"], config["history"]) == (True, 7)
    again = SpecLossScaleOptimizer.from_config(config)
    assert (again.diagnose, again.history_size) == (True, 7)
    scaler = KerasGradScaler.of(again)
    assert scaler.history().as_list() == [] and scaler.overflow_report() is None
    disabled = KerasGradScaler(enabled=False, diagnose=True, history=2)
    assert isinstance(disabled.wrap(keras.optimizers.SGD()), keras.optimizers.SGD)
    assert disabled.overflow_report() is None and disabled.history().as_list() == []


# ------------------------------------------------------------ on TensorFlow


@_only_on_tensorflow("an XLA-compiled tf.function (jit_compile=True) over a tf.GradientTape")
def test_xla_custom_loop_records_the_report():
    """TensorFlow: an XLA-compiled custom step (``jit_compile=True``) poisons one element
    of ``net/out/bias``'s gradient inside the graph; the report matches NumPy on the
    gradients the step returns."""
    import tensorflow as tf

    scaler = _scaler(2048.0, growth_interval=1000, diagnose=True, history=4)
    model = _mlp()
    opt = scaler.wrap(keras.optimizers.Adam(1e-3))
    opt.build(model.trainable_variables)
    x, y = _data(8)

    @tf.function(jit_compile=True)
    def step(x, y, poison):
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(_loss(model(x, training=True), y))
        grads = tape.gradient(scaled, model.trainable_variables)
        grads[3] = grads[3] + poison
        opt.apply(grads, model.trainable_variables)
        return grads

    clean = tf.zeros((1,))
    step(x, y, clean)
    assert scaler.overflow_report() is None
    grads = [g.numpy() for g in step(x, y, tf.constant([np.inf], tf.float32))]
    report = scaler.overflow_report()
    assert (report.step, report.scale, report.names) == (2, 2048.0, ["net/out/bias"])
    assert report.overflows[0] == _expected("net/out/bias", grads[3], 2048.0)
    step(x, y, clean)
    assert scaler.overflow_report() is None
    assert scaler.history().as_list() == [(1, 2048.0, False), (2, 1024.0, True),
                                          (3, 1024.0, False)]


#: The program of the MirroredStrategy test: TensorFlow takes logical devices only before it
#: sets its devices up, and the strategies of one process share its collectives' keys (two
#: replicated models of different shapes in one process abort each other's all-reduce).
#: Prints RESULT and the reports after each step as JSON.
_MIRRORED = """
import json
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import numpy as np
from unifiedamp.backends.keras import KerasGradScaler

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    scaler = KerasGradScaler(1024.0, growth_interval=100, diagnose=True, history=3)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="fc")], name="net")
    model.compile(optimizer=scaler.wrap(keras.optimizers.Adam(0.1)), loss="mse")
seen = []
for kinds in ("FF", "FI", "FF", "II"):
    x = np.ones((2, 3), np.float32)
    for r, kind in enumerate(kinds):
        if kind == "I":
            x[r, 0] = np.inf
    model.fit(x, np.ones((2, 1), np.float32), batch_size=2, epochs=1, shuffle=False, verbose=0)
    report = scaler.overflow_report()
    seen.append(None if report is None else {
        "step": report.step, "scale": report.scale, "checked": report.checked,
        "names": report.names, "overflows": [
            {"inf": o.inf, "nan": o.nan, "max_finite": o.max_finite} for o in report.overflows]})
print("RESULT " + json.dumps({"seen": seen, "history": scaler.history().as_list()}))
"""


def _report(record: dict | None) -> SimpleNamespace | None:
    """A report the program printed, with the attributes of an ``OverflowReport``."""
    if record is None:
        return None
    overflows = [SimpleNamespace(**o) for o in record["overflows"]]
    return SimpleNamespace(**{**record, "overflows": overflows})


@_only_on_tensorflow("its program runs Keras on TensorFlow (MirroredStrategy) in a process "
                     "of its own: the keras-tensorflow session runs it")
def test_mirrored_strategy_sums_the_replicas_counts(run_python):
    """TensorFlow, MirroredStrategy over two logical CPUs (one example per replica): an inf
    on replica 1 only is reported with that replica's counts; on both, with the sum. In a
    new interpreter (see ``_MIRRORED``), which reports after each step."""
    proc = run_python(_MIRRORED, env={"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(lines[-1][len("RESULT "):])
    seen = [_report(record) for record in result["seen"]]
    assert [r is None for r in seen] == [True, False, True, False]
    one, both = seen[1], seen[3]
    assert (one.step, one.scale, one.checked, one.names) == (2, 1024.0, 2,
                                                             ["net/fc/kernel", "net/fc/bias"])
    assert [(o.inf, o.nan) for o in one.overflows] == [(3, 0), (1, 0)]
    assert all(0 < o.max_finite < np.inf for o in one.overflows)  # replica 0's
    assert (both.step, both.scale) == (4, 512.0)
    assert [(o.inf, o.nan, o.max_finite) for o in both.overflows] == [(6, 0, 0.0), (2, 0, 0.0)]
    assert [tuple(r) for r in result["history"]] == [(2, 512.0, True), (3, 512.0, False),
                                                     (4, 256.0, True)]


def test_spec_trajectory_reference_backs_off_and_grows():
    config = ScalerConfig(8.0, growth_interval=2)
    assert _spec_trajectory(config, [False, True, False, False, False]) == [
        (1, 8.0, False), (2, 4.0, True), (3, 4.0, False), (4, 8.0, False), (5, 8.0, False)]
