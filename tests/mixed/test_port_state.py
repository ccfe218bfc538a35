"""``unifiedamp port-state``: a scaler state between canonical, torch, Paddle, Keras and jmp forms,
in dicts and in checkpoint files; a run checkpointed in one framework resumes in another with
the uninterrupted run's exact trajectory; a run killed with SIGKILL resumes from its last
checkpoint as if it had never been killed.

Every framework trains in a subprocess of its own (tensorflow then paddle in one process
segfaults), with its real optimizer and autodiff; this process imports no framework except
torch (for the Lightning checkpoint).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from unifiedamp import spec
from unifiedamp.porting import (
    FORMS,
    convert_state,
    load_file,
    port_state_file,
    read_state,
    save_file,
)
from unifiedamp.spec import ScalerConfig, ScalerState

# A config every form carries, and one only the canonical form does.
PLAIN = ScalerConfig(1024.0, growth_interval=3)
RICH = ScalerConfig(1024.0, 1.5, 0.7, 3, hysteresis=2, min_scale=0.5, max_scale=2.0**20)
# A scale with every mantissa bit set (float32-exact), mid-interval trackers.
STATE = ScalerState(spec.f32_from_bits(0x447FFFFF), 2, 0)


def canonical(config=PLAIN, state=STATE):
    return spec.to_state_dict(config, state, "numpy")


def bits(state: ScalerState):
    return spec.f32_bits(state.scale), state.growth_tracker, state.hysteresis_tracker


# ================================================================ conversions


@pytest.mark.parametrize("to", FORMS)
def test_every_form_round_trips_bit_exact_scale_and_int_trackers(to):
    out = convert_state(canonical(), to)
    config, state, form = read_state(out, PLAIN)
    assert form == to
    assert bits(state) == bits(STATE)
    assert type(state.growth_tracker) is int and type(state.hysteresis_tracker) is int
    assert config == PLAIN
    assert convert_state(out, "canonical", PLAIN)["config"] == PLAIN.to_dict()


@pytest.mark.parametrize(("src", "dst"), [(a, b) for a in FORMS for b in FORMS])
def test_every_pair_of_forms_converts_through_json_and_keeps_the_state(src, dst):
    # Through JSON, as a checkpoint would: arrays become lists, numbers Python numbers.
    first = json.loads(json.dumps(convert_state(canonical(), src), default=lambda a: a.tolist()))
    _, state, _ = read_state(convert_state(first, dst, PLAIN), PLAIN)
    assert bits(state) == bits(STATE)


def test_the_canonical_form_carries_a_config_no_native_form_can():
    rich = canonical(RICH, ScalerState(1024.0, 1, 1))
    back = convert_state(convert_state(rich, "canonical"), "canonical")
    assert back["config"] == RICH.to_dict() and back["hysteresis_tracker"] == 1


@pytest.mark.parametrize("to", ["canonical", "paddle", "keras"])
def test_forms_with_a_hysteresis_counter_keep_a_nonzero_tracker(to):
    # Two infs of three seen: the next inf backs off. A form that dropped the count
    # would back off one inf late.
    config = ScalerConfig(1024.0, growth_interval=3, hysteresis=3)
    state = ScalerState(512.0, 0, 2)
    out = convert_state(canonical(config, state), to)
    assert read_state(out, config)[:2] == (config, state)
    assert read_state(convert_state(out, "canonical", config))[1] == state


@pytest.mark.parametrize(("to", "lost"), [
    ("torch", "hysteresis=2, min_scale=0.5, max_scale=1048576.0"),
    ("paddle", "min_scale=0.5, max_scale=1048576.0"),
    ("jmp", "backoff_factor=0.7, hysteresis=2, max_scale=1048576.0"),
])
def test_a_form_that_cannot_carry_the_config_raises_naming_what_is_lost(to, lost):
    saved = canonical(RICH)
    before = json.dumps(saved)
    with pytest.raises(ValueError, match=f"the {to} form cannot carry {lost}: .*to='canonical'"):
        convert_state(saved, to)
    assert json.dumps(saved) == before


def test_a_disabled_scaler_has_no_native_form():
    with pytest.raises(ValueError, match="enabled=False"):
        convert_state(canonical(ScalerConfig(enabled=False)), "torch")


def test_torch_form_is_the_torch_backends_native_state_dict_and_torch_loads_it():
    torch = pytest.importorskip("torch")
    import unifiedamp as ua

    ours = ua.GradScaler(**PLAIN.to_dict(), backend="torch")
    ours.load_state_dict(canonical())
    assert convert_state(canonical(), "torch") == ours.native_state_dict()
    native = torch.amp.GradScaler("cpu")
    native.load_state_dict(convert_state(canonical(), "torch"))
    assert (native.get_scale(), native._get_growth_tracker()) == (STATE.scale, 2)


@pytest.mark.parametrize(("bad", "message"), [
    ({"scale": 1.0}, r"matches none of the forms|match none of the forms"),
    ({"scale": -1.0, "_growth_tracker": 0}, r"scale must be finite and >= 0"),
    ({"dynamic_scale": 8.0, "step_counter": -1}, r"growth_tracker must be an int >= 0"),
    ({"dynamic_scale": 8.0, "step_counter": 0, "hysteresis_counter": 1},
     r"hysteresis_counter=1 needs a config with hysteresis > 1.*pass config="),
    ({"loss_scale": 8.0, "counter": 0, "period": 3, "factor": 0.0, "min_loss_scale": 0.0},
     r"factor must be > 0, got factor=0.0"),
    ({"loss_scale": 8.0, "counter": 0}, r"missing \['period', 'factor', 'min_loss_scale'\]"),
])
def test_bad_input_raises_naming_the_value_and_changes_nothing(bad, message):
    before = repr(bad)
    with pytest.raises(ValueError, match=message):
        convert_state(bad, "canonical")
    assert repr(bad) == before


def test_an_unknown_target_form_names_the_closest():
    with pytest.raises(ValueError, match=r"got 'pytorch' \(did you mean 'torch'\?\)"):
        convert_state(canonical(), "pytorch")


# ================================================================ files


def test_a_checkpoint_entry_is_found_and_rewritten_keeping_the_rest(tmp_path):
    path = tmp_path / "ckpt.json"
    save_file({"step": 7, "model": [1.0, 2.0], "scaler": canonical()}, path)
    report = port_state_file(path, to="torch", in_place=True)
    assert (report["key"], report["from"], report["whole"]) == ("scaler", "canonical", True)
    saved = load_file(path)
    assert saved["step"] == 7 and saved["model"] == [1.0, 2.0]
    assert saved["scaler"] == convert_state(canonical(), "torch")


def test_an_ambiguous_or_missing_entry_asks_for_key_and_writes_nothing(tmp_path):
    path = tmp_path / "ckpt.json"
    save_file({"a": canonical(), "b": canonical()}, path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"found several: \['a', 'b'\]; pass key="):
        port_state_file(path, to="torch", in_place=True)
    with pytest.raises(ValueError, match=r"no key 'c'"):
        port_state_file(path, to="torch", key="c", in_place=True)
    assert path.read_bytes() == before
    assert port_state_file(path, to="jmp", key="b")["state_dict"]["counter"] == 2


def test_npz_keeps_the_keras_scale_in_float32_and_refuses_the_canonical_form(tmp_path):
    save_file(convert_state(canonical(), "keras"), tmp_path / "k.npz")
    assert load_file(tmp_path / "k.npz")["dynamic_scale"].dtype == np.float32
    with pytest.raises(ValueError, match="flat numeric arrays.*json"):
        save_file(canonical(), tmp_path / "c.npz")
    assert os.listdir(tmp_path) == ["k.npz"]  # no temp file left behind


def test_cli_converts_prints_a_summary_and_reports_errors(tmp_path):
    src = tmp_path / "s.json"
    save_file({"opt": {"dynamic_scale": 512.0, "step_counter": 1}}, src)
    cli = [sys.executable, "-m", "unifiedamp.cli", "port-state"]
    ok = subprocess.run([*cli, str(src), "--to", "jmp", "-o", str(tmp_path / "j.json"),
                         "--config", '{"growth_interval": 3}'], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "entry 'opt', keras form" in ok.stdout and "wrote" in ok.stdout
    assert load_file(tmp_path / "j.json")["opt"]["period"] == 3
    bad = subprocess.run([*cli, str(src), "--to", "torch", "--key", "nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "error: " in bad.stderr and "no key 'nope'" in bad.stderr


# ================================================================ Lightning


# The Lightning run of the torch porting tests: a tiny model with the MixedPrecision plugin,
# an inf at step 1; returns (scale and tracker at the start, the scaler that trained).
from test_torch_porting import lightning_fit  # noqa: E402


@pytest.mark.framework("torch")
@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint")
def test_lightning_ckpt_entry_is_rewritten_for_the_other_scaler_and_back(tmp_path):
    torch = pytest.importorskip("torch")
    import unifiedamp as ua

    ckpt = tmp_path / "ours.ckpt"
    # hysteresis 2: torch.amp.GradScaler cannot load what our scaler writes for this config.
    ours = ua.GradScaler(1024.0, growth_interval=2, hysteresis=2, backend="torch")
    lightning_fit(ours, 5, ckpt_out=ckpt)
    raw = torch.load(ckpt, weights_only=True)
    assert raw["MixedPrecision"]["format"] == "unifiedamp.GradScaler"
    with pytest.raises(ValueError, match="the torch form cannot carry hysteresis=2"):
        port_state_file(ckpt, to="torch", in_place=True)

    ours = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
    lightning_fit(ours, 5, ckpt_out=ckpt)
    raw = torch.load(ckpt, weights_only=True)
    report = port_state_file(ckpt, to="torch", in_place=True)
    assert report["key"] == "MixedPrecision" and report["whole"]
    rewritten = torch.load(ckpt, weights_only=True)
    assert "format" not in rewritten["MixedPrecision"]  # torch's own dict now
    assert rewritten["global_step"] == raw["global_step"]
    assert all(torch.equal(rewritten["state_dict"][k], v) for k, v in raw["state_dict"].items())
    start, native = lightning_fit(torch.amp.GradScaler("cpu"), 7, ckpt_in=ckpt)
    assert start == (ours.get_scale(), ours.state.growth_tracker)

    native_ckpt = tmp_path / "native.ckpt"
    lightning_fit(torch.amp.GradScaler("cpu", 256.0, growth_interval=3), 5, ckpt_out=native_ckpt)
    out = tmp_path / "canonical.ckpt"
    cli = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", str(native_ckpt),
                          "--to", "canonical", "-o", str(out), "--config",
                          '{"init_scale": 256.0}'], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert "entry 'MixedPrecision', torch form" in cli.stdout
    entry = torch.load(out, weights_only=True)["MixedPrecision"]
    assert entry["config"]["init_scale"] == 256.0 and entry["config"]["growth_interval"] == 3
    start, ours = lightning_fit(ua.GradScaler(backend="torch"), 7, ckpt_in=out)
    assert ours.config == ScalerConfig(256.0, growth_interval=3)
    assert start == (entry["scale"], entry["growth_tracker"])


# ================================================================ cross-framework resume

PATTERN = "FFIFFFFFIFFIIFFFF"  # F: finite gradients, I: an inf in the batch
CHECKPOINT_AT = 7  # after F F I F F F F: scale 1024 after a backoff and a growth, tracker 1,
# and a finite step next (an inf there would hide a tracker off by one)

# Each framework's own checkpoint (A side) and the form and file it resumes from (B side).
SAVES = {"torch": "a.pt", "paddle": "a.pdopt", "keras": "a.npz", "jax": "a.msgpack",
         "numpy": "a.json"}
RESUMES = {"torch": ("torch", "b.pt"), "paddle": ("paddle", "b.pdopt"),
           "keras": ("keras", "b.npz"), "jax": ("canonical", "b.msgpack"),
           "numpy": ("canonical", "b.json")}

WORKER = r'''
import json, sys
import numpy as np
from unifiedamp.porting import load_file, save_file

fw, mode, folder = sys.argv[1:4]
PATTERN, AT = sys.argv[4], int(sys.argv[5])
INIT, INTERVAL = 1024.0, 3
X = (np.arange(8, dtype=np.float32).reshape(2, 4) - 3) / 8
Y = np.ones((2, 1), np.float32)
W0 = np.full((4, 1), 0.1, np.float32)

def batch(kind):
    x = X.copy()
    if kind == "I":
        x[0, 0] = np.inf
    return x

if fw == "torch":  # torch's own GradScaler
    import torch
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(W0.T)); model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT, growth_interval=INTERVAL)
    def step(kind):
        opt.zero_grad()
        loss = ((model(torch.from_numpy(batch(kind))) - torch.from_numpy(Y)) ** 2).mean()
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
        return scaler.get_scale(), scaler._get_growth_tracker(), 0
    def save(path):
        save_file({"model": model.state_dict(), "optimizer": opt.state_dict(),
                   "scaler": scaler.state_dict()}, path)
    def load(path):
        scaler.load_state_dict(load_file(path)["scaler"] if "scaler" in load_file(path)
                               else load_file(path))
elif fw == "paddle":  # paddle's own scaler disables itself on CPU: unifiedamp's paddle backend
    import paddle, unifiedamp as ua
    model = paddle.nn.Linear(4, 1)
    model.weight.set_value(W0); model.bias.set_value(np.zeros(1, np.float32))
    opt = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    scaler = ua.GradScaler(INIT, growth_interval=INTERVAL, backend="paddle", device="cpu")
    def step(kind):
        loss = ((model(paddle.to_tensor(batch(kind))) - paddle.to_tensor(Y)) ** 2).mean()
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); opt.clear_grad()
        return tuple(scaler.state)
    def save(path):
        save_file({"model": model.state_dict(), "scaler": scaler.native_state_dict()}, path)
    def load(path):
        scaler.load_state_dict(load_file(path))
elif fw == "keras":  # Keras's own LossScaleOptimizer, TensorFlow backend
    import keras, tensorflow as tf
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.set_weights([W0, np.zeros(1, np.float32)])
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=INIT,
                                              dynamic_growth_steps=INTERVAL)
    opt.build(model.trainable_variables)
    def step(kind):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(batch(kind)) - Y) ** 2)
            scaled = opt.scale_loss(loss)
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return float(opt.dynamic_scale.numpy()), int(opt.step_counter.numpy()), 0
    def save(path):
        save_file({"dynamic_scale": opt.dynamic_scale.numpy(),
                   "step_counter": opt.step_counter.numpy()}, path)
    def load(path):
        d = load_file(path)
        assert int(d["hysteresis_counter"]) == 0
        opt.dynamic_scale.assign(d["dynamic_scale"])
        opt.step_counter.assign(int(d["step_counter"]))
elif fw == "jax":  # unifiedamp's jax scaler with optax; checkpoints the jmp fields
    import jax, jax.numpy as jnp, optax, unifiedamp as ua
    params = {"w": jnp.asarray(W0), "b": jnp.zeros(1)}
    tx = optax.sgd(0.01); opt_state = tx.init(params)
    scaler = ua.GradScaler(INIT, growth_interval=INTERVAL, backend="jax")
    def loss_fn(p, x):
        return jnp.mean((x @ p["w"] + p["b"] - Y) ** 2)
    def step(kind):
        global params, opt_state, scaler
        grads = jax.grad(lambda p: scaler.scale(loss_fn(p, jnp.asarray(batch(kind)))))(params)
        grads, finite = scaler.unscale(grads)
        scaler = scaler.update(finite)
        if bool(finite):
            updates, opt_state = tx.update(grads, opt_state)
            params = optax.apply_updates(params, updates)
        return tuple(scaler.state)
    def save(path):
        st = scaler.state
        save_file({"params": params, "loss_scale": np.float32(st.scale),
                   "counter": np.int32(st.growth_tracker), "period": INTERVAL, "factor": 2.0,
                   "min_loss_scale": 0.0}, path)
    def load(path):
        global scaler
        scaler = scaler.restore(load_file(path))
else:  # unifiedamp's numpy scaler, gradients by hand
    import unifiedamp as ua
    from unifiedamp.backends.numpy import SGD
    w = W0.copy(); opt = SGD([w], lr=0.01)
    scaler = ua.GradScaler(INIT, growth_interval=INTERVAL, backend="numpy")
    def step(kind):
        x = batch(kind)
        with np.errstate(all="ignore"):
            loss_grad = scaler.scale(np.float32(1.0)) * 2 * (x @ w - Y) / len(x)
            opt.grads = [(x.T @ loss_grad).astype(np.float32)]
        scaler.step(opt); scaler.update()
        return tuple(scaler.state)
    def save(path):
        save_file({"w": w.tolist(), "scaler": scaler.state_dict()}, path)
    def load(path):
        scaler.load_state_dict(load_file(path))

import os
trajectory = []
if mode == "run":  # uninterrupted, checkpointing after AT steps
    for i, kind in enumerate(PATTERN):
        trajectory.append(step(kind))
        if i + 1 == AT:
            save(os.path.join(folder, sys.argv[6]))
else:  # resume from each file given, continue the rest of the pattern
    for path in sys.argv[6:]:
        load(path)
        trajectory.append([step(kind) for kind in PATTERN[AT:]])
print(json.dumps(trajectory))
'''

PORTER = r'''
import json, sys
from unifiedamp.porting import port_state_file
from unifiedamp.spec import ScalerConfig
for to, src, dst in json.loads(sys.argv[1]):
    # Keras's variables carry no config: the one its optimizer was built with.
    port_state_file(src, dst, to=to, config=ScalerConfig(1024.0, growth_interval=3))
'''

#: The imports a worker's framework begins with: its script is forked from an interpreter
#: that made them (tests/_forkserver.py), as the other tests' scripts of that framework are.
PRELOADS = {"torch": "import torch\n", "paddle": "import paddle\n",
            "keras": "import keras\nimport tensorflow\n", "jax": "import jax\nimport optax\n",
            "numpy": "import numpy\n"}


def _run(run_python, script, *args, preload="", timeout=240):
    """``python -c preload+script *args``, forked from an interpreter that ran ``preload``."""
    proc = run_python(preload + script, timeout=timeout, args=tuple(map(str, args)))
    assert proc.returncode == 0, f"{args}: {proc.stderr[-3000:]}"
    return proc.stdout


def _states(raw):
    return [(spec.f32_hex(float(s)), int(g), int(h)) for s, g, h in raw]


def _first_difference(got, want):
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            return f"step {CHECKPOINT_AT + i + 1}: resumed {a}, uninterrupted {b}"
    return None


@pytest.mark.slow
def test_a_run_checkpointed_in_one_framework_resumes_in_every_other_with_the_same_trajectory(
        tmp_path, run_python):
    frameworks = [fw for fw, module in [("torch", "torch"), ("paddle", "paddle"),
                                        ("keras", "tensorflow"), ("jax", "optax"),
                                        ("numpy", "numpy")]
                  if __import__("importlib.util").util.find_spec(module)]
    if len(frameworks) < 2:
        pytest.skip("needs two frameworks")
    folder = {fw: tmp_path / fw for fw in frameworks}
    for f in folder.values():
        f.mkdir()

    def work(fw, mode, *files):
        return json.loads(_run(run_python, WORKER, fw, mode, folder[fw], PATTERN,
                               CHECKPOINT_AT, *files, preload=PRELOADS[fw]).splitlines()[-1])

    # 1. Uninterrupted run in each framework, checkpointing in its own form after AT steps.
    full = {fw: _states(work(fw, "run", SAVES[fw])) for fw in frameworks}
    state, expected = ScalerState.initial(PLAIN), []
    for kind in PATTERN:
        state = spec.update(PLAIN, state, kind == "I")
        expected.append((spec.f32_hex(state.scale), state.growth_tracker, 0))
    for fw in frameworks:  # every framework's own run follows the spec
        assert full[fw] == expected, (fw, full[fw], expected)

    # 2. port-state: each A checkpoint into each B's form, in one process.
    moves = [(RESUMES[b][0], str(folder[a] / SAVES[a]),
              str(folder[b] / f"from-{a}-{RESUMES[b][1]}"))
             for b in frameworks for a in frameworks if a != b]
    _run(run_python, PORTER, json.dumps(moves))

    # 3. Resume in B from every A, continue the pattern, compare with A's uninterrupted run.
    resumed = {}
    for b in frameworks:
        sources = [a for a in frameworks if a != b]
        files = [folder[b] / f"from-{a}-{RESUMES[b][1]}" for a in sources]
        resumed[b] = dict(zip(sources, work(b, "resume", *files), strict=True))
    failures = []
    for b, by_source in resumed.items():
        for a, raw in by_source.items():
            diff = _first_difference(_states(raw), full[a][CHECKPOINT_AT:])
            if diff:
                failures.append(f"{a} -> {b}: {diff}")
    assert not failures, "\n".join(failures)


# ================================================================ SIGKILL

KILLABLE = r'''
import json, os, sys, time
import numpy as np
import unifiedamp as ua
from unifiedamp.backends.numpy import SGD
from unifiedamp.porting import load_file, save_file

ckpt, pattern, every, stop_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = np.ones((2, 4), np.float32); y = np.ones((2, 1), np.float32)
w = np.full((4, 1), 0.1, np.float32); opt = SGD([w], lr=0.01)
scaler = ua.GradScaler(1024.0, growth_interval=3, hysteresis=2, backend="numpy")
start = 0
if os.path.exists(ckpt):
    saved = load_file(ckpt)
    start = saved["step"]
    w[...] = np.asarray(saved["w"], np.float32)
    scaler.load_state_dict(saved["scaler"])
for i in range(start, len(pattern)):
    xb = x.copy()
    if pattern[i] == "I":
        xb[0, 0] = np.inf
    with np.errstate(all="ignore"):
        opt.grads = [(xb.T @ (scaler.scale(np.float32(2.0)) * (xb @ w - y) / 2)).astype(np.float32)]
    scaler.step(opt); scaler.update()
    st = scaler.state
    if (i + 1) % every == 0:
        save_file({"step": i + 1, "w": w.tolist(), "scaler": scaler.state_dict()}, ckpt)
    print(json.dumps([i + 1, st.scale, st.growth_tracker, st.hysteresis_tracker,
                      w.ravel().tolist()]), flush=True)
    if i + 1 == stop_after:
        time.sleep(600)  # the parent kills it here, between two checkpoints
'''


def test_a_run_killed_with_sigkill_resumes_from_its_last_checkpoint_as_if_never_killed(tmp_path):
    pattern, every = "FFIFFIIFFFFIFIIFFFFF", 4
    ckpt = tmp_path / "ckpt.json"
    run = [sys.executable, "-c", KILLABLE, str(ckpt), pattern, str(every)]

    never_killed = subprocess.run([*run, "0"], capture_output=True, text=True, timeout=120,
                                  cwd=tmp_path)
    assert never_killed.returncode == 0, never_killed.stderr
    reference = [json.loads(line) for line in never_killed.stdout.splitlines()]
    ckpt.unlink()

    proc = subprocess.Popen([*run, "10"], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    seen = []
    for line in proc.stdout:
        seen.append(json.loads(line))
        if seen[-1][0] == 10:  # checkpointed at 8, two steps since
            os.kill(proc.pid, signal.SIGKILL)
            break
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert load_file(ckpt)["step"] == 8
    assert [p for p in os.listdir(tmp_path) if "unifiedamp-tmp-" in p] == []

    resumed = subprocess.run([*run, "0"], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    after = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert after[0][0] == 9
    assert seen == reference[:10]
    assert after == reference[8:]  # scale, trackers and weights, step by step


# ================================================================ Keras .keras files

KERAS_MAKER = r'''
import json, sys
import numpy as np
import keras
import unifiedamp as ua
folder = sys.argv[1]
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
ours.save(folder + "/ours.keras")
# Keras's own LossScaleOptimizer, saved before any step (its variables not built yet)
native = model()
native.compile(optimizer=keras.optimizers.LossScaleOptimizer(
    keras.optimizers.SGD(0.01), initial_scale=1024.0, dynamic_growth_steps=3), loss="mse")
native.save(folder + "/native.keras")
plain = model()
plain.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
plain.save(folder + "/plain.keras")
# A Lambda layer whose code, run when a model is built from the file, leaves a marker.
marker = folder + "/lambda-ran"
touch = eval(f"lambda t: (__import__('pathlib').Path({marker!r}).touch(), t)[1]")
lam = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(touch), keras.layers.Dense(1)])
lam.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)),
            loss="mse")
lam.save(folder + "/lambda.keras")
import os
os.remove(marker)
print(json.dumps(ua.backends.keras.KerasGradScaler.of(ours.optimizer).state_dict()))
'''

KERAS_READER = r'''
import json, sys
import keras
m = keras.models.load_model(sys.argv[1])
opt = m.optimizer
print(json.dumps([type(opt).__name__, float(opt.dynamic_scale.numpy()),
                  int(opt.step_counter.numpy()), int(opt.dynamic_growth_steps)]))
'''


@pytest.mark.slow
def test_a_keras_file_is_read_and_written_through_its_loss_scale_optimizer(tmp_path,
                                                                           monkeypatch,
                                                                           run_python):
    pytest.importorskip("tensorflow")
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    expected = json.loads(_run(run_python, KERAS_MAKER, tmp_path,
                               preload="import keras\n").strip().splitlines()[-1])
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
    got = json.loads(_run(run_python, KERAS_READER, tmp_path / "native.keras",
                          preload="import keras\n").strip().splitlines()[-1])
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
    # a damaged archive is named, without a child's traceback
    (tmp_path / "junk.keras").write_bytes(b"PK\x03\x04" + b"junk" * 50)
    with pytest.raises(ValueError, match="junk.keras is not a Keras .keras archive"):
        port_state_file(tmp_path / "junk.keras", to="canonical")
    assert not [p for p in os.listdir(tmp_path) if "unifiedamp-tmp-" in p]


# ================================================================ untrusted files


class _Payload:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant_payload(path, marker):
    state = {"scale": np.array([1024.0], np.float32), "incr_count": 0, "decr_count": 0}
    if path.suffix == ".npz":
        np.savez(path, scale=np.float32(1024.0), _growth_tracker=np.int64(0),
                 payload=np.array([_Payload(marker)], dtype=object))
    elif path.suffix in (".pdparams", ".pdopt", ".pdckpt"):
        import pickle

        with open(path, "wb") as f:  # paddle.save's own format: a protocol-4 pickle
            pickle.dump({"scaler": state, "payload": _Payload(marker)}, f, protocol=4)
    else:
        import torch

        torch.save({"scaler": {"scale": 1024.0, "_growth_tracker": 0},
                    "payload": _Payload(marker)}, path)


@pytest.mark.parametrize("name", ["a.pt", "b.ckpt", "c.pdparams", "d.pdopt", "e.pdckpt",
                                  "f.npz"])
def test_no_checkpoint_runs_code_unless_the_user_trusts_it(tmp_path, name):
    path, marker = tmp_path / name, tmp_path / "code-ran"
    _plant_payload(path, marker)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"(system|object arrays).*trusted=True; CLI: "
                                         r"--trust\); nothing was read"):
        load_file(path)
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", str(path),
                           "--to", "canonical", "--in-place"], capture_output=True, text=True)
    assert proc.returncode == 2 and str(path) in proc.stderr, proc.stderr
    assert not marker.exists() and path.read_bytes() == before
    # The payload is live: the trust flag runs it, as its help says.
    load_file(path, trusted=True)
    assert marker.exists()


def test_the_trust_flags_help_says_it_runs_the_files_code():
    proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", "--help"],
                          capture_output=True, text=True)
    help_text = " ".join(proc.stdout.split())
    assert "--trust run the file's own code" in help_text
    # format by format, what it runs
    for words in ("torch.load(weights_only=False)", "paddle.load", ".npz object arrays are "
                  "unpickled (np.load(allow_pickle=True))", "safe_mode=False",
                  ".json and .msgpack run no code"):
        assert words in help_text, words


def _tensor_file(path):
    import torch

    torch.save({"scaler": {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                           "growth_interval": 3, "_growth_tracker": 1},
                "weight": torch.arange(4096, dtype=torch.float32)}, path)


def _flip_a_byte_inside(path, member_suffix):
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name,member", [("w.pt", "data/0"), ("w.ckpt", "data/0"),
                                         ("w.npz", "weight.npy")])
def test_a_checkpoint_whose_data_fails_its_own_checksum_is_refused(tmp_path, name, member):
    path = tmp_path / name
    if name.endswith(".npz"):
        np.savez(path, scale=np.float32(8.0), _growth_tracker=np.int64(1),
                 growth_factor=2.0, backoff_factor=0.5, growth_interval=3,
                 weight=np.arange(4096, dtype=np.float32))
    else:
        _tensor_file(path)
    assert load_file(path)  # whole, it loads
    _flip_a_byte_inside(path, member)
    with pytest.raises(ValueError, match=rf"{path}.*does not match the CRC-32") as info:
        load_file(path)
    assert "trust" not in str(info.value)


def _damaged(tmp_path, ext):
    whole = tmp_path / f"whole{ext}"
    if ext in (".pt", ".ckpt"):
        _tensor_file(whole)
    elif ext == ".npz":
        np.savez(whole, scale=np.float32(8.0), _growth_tracker=np.int64(1))
    else:
        save_file({"scaler": {"scale": np.array([8.0], np.float32), "incr_count": 1,
                              "decr_count": 0}} if ext in (".pdparams", ".pdopt")
                  else {"scale": 8.0, "_growth_tracker": 1}, whole)
    data = whole.read_bytes()
    return {"empty": b"", "truncated": data[: len(data) // 2], "junk": b"hello world" * 3}


@pytest.mark.parametrize("ext", [".pt", ".ckpt", ".npz", ".pdparams", ".pdopt", ".json",
                                 ".msgpack"])
def test_an_empty_truncated_or_foreign_file_is_refused_naming_it(tmp_path, ext):
    for what, data in _damaged(tmp_path, ext).items():
        path = tmp_path / f"{what}{ext}"
        path.write_bytes(data)
        with pytest.raises(ValueError) as info:
            load_file(path)
        message = str(info.value)
        assert str(path) in message and "nothing was read" in message, (what, message)
        assert "trust" not in message, (what, message)  # trusting a damaged file helps nothing


def test_a_torch_file_with_a_damaged_pickle_is_refused_without_suggesting_trust(tmp_path):
    # A zip whose members match their checksums but whose pickle is not one: torch's
    # weights_only reader fails on it as it does on a refused object.
    import zipfile

    _tensor_file(tmp_path / "whole.pt")
    path = tmp_path / "bad.pt"
    with zipfile.ZipFile(tmp_path / "whole.pt") as whole, zipfile.ZipFile(path, "w") as out:
        for info in whole.infolist():
            data = whole.read(info.filename)
            out.writestr(info, b"\x80\x02}q\x00\xff\xff" if info.filename.endswith(
                "data.pkl") else data)
    with pytest.raises(ValueError, match="cannot be read as a torch.save file") as info:
        load_file(path)
    assert "trust" not in str(info.value)


def test_deeply_nested_json_is_refused_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested deeper than Python's recursion limit"):
        port_state_file(path, to="canonical")


@pytest.mark.parametrize("form", [
    {"_growth_tracker": 1, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3},
    {"incr_count": 1, "decr_count": 0, "incr_ratio": 2.0},
])
def test_a_native_state_without_scale_is_refused_naming_the_key(form):
    with pytest.raises(ValueError, match=r"needs 'scale'.*nothing was loaded"):
        convert_state(form, "canonical")


# ================================================================ writes


def _checkpoint(path):
    save_file({"step": 3, "scaler": canonical(), "blob": np.zeros(100_000, np.float32)}
              if path.suffix == ".npz" else {"step": 3, "scaler": canonical(),
                                             "blob": list(range(20_000))}, path)


def _temps(folder):
    return [p for p in os.listdir(folder) if "unifiedamp-tmp-" in p]


def test_in_place_through_a_symlink_rewrites_the_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "store" / "ckpt.json"
    real.parent.mkdir()
    _checkpoint(real)
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    port_state_file(link, to="torch", in_place=True)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "_growth_tracker" in load_file(real)["scaler"]
    assert _temps(tmp_path) == [] and _temps(real.parent) == []


WRITE_UNDER_LIMIT = r'''
import resource, sys
from unifiedamp.porting import port_state_file
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    port_state_file(sys.argv[1], to="torch", in_place=True)
except OSError as exc:
    print("refused:", exc)
    sys.exit(3)
'''

KILLED_WHILE_WRITING = r'''
import os, signal, sys, json
from unifiedamp.porting import _checkpoints
real_dumps = json.dumps
def dumps_then_die(*args, **kwargs):
    text = real_dumps(*args, **kwargs)
    sys.stdout.write("writing\n"); sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
_checkpoints.json.dumps = dumps_then_die
_checkpoints.port_state_file(sys.argv[1], to="torch", in_place=True)
'''


def test_a_write_stopped_by_a_full_disk_or_sigkill_leaves_the_checkpoint_whole(tmp_path):
    path = tmp_path / "ckpt.json"
    _checkpoint(path)
    before = path.read_bytes()
    assert len(before) > 4096
    # A file-size limit (a full disk): the write fails, the original stays byte for byte.
    proc = subprocess.run([sys.executable, "-c", WRITE_UNDER_LIMIT, str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    assert path.read_bytes() == before and _temps(tmp_path) == []
    # SIGKILL after the temp file exists: the original is whole, the temp left behind...
    proc = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL and "writing" in proc.stdout
    assert path.read_bytes() == before and len(_temps(tmp_path)) == 1
    # ...and removed by the next write to that file.
    port_state_file(path, to="torch", in_place=True)
    assert _temps(tmp_path) == [] and "_growth_tracker" in load_file(path)["scaler"]
