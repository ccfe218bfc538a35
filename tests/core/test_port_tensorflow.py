"""``unifiedamp port`` on TensorFlow/Keras sources, framework-free: a static scaler stays static
or is a problem, every spelling in the wild is read (TensorFlow 2.1-2.3's experimental
optimizer and its loss-scale objects, tf_keras, tf.compat.v1's graph rewrite), tf.keras's
Keras (tf-keras 2 or Keras 3) comes from --from-version, from the file, or is a problem, and no
note contradicts the call it describes. The rewritten tf.keras sources run with the real
frameworks in the keras session (tests/keras/test_port_source.py)."""

from __future__ import annotations

import ast
import io
import re
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("libcst")

from port_sources import FLAGGED, SOURCES, TARGETS, TF_FLAGGED, ported  # noqa: E402

from unifiedamp.cli import main  # noqa: E402
from unifiedamp.porting import config_from_call, port_source  # noqa: E402

STATIC = SOURCES["tf_keras_static"][0]


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli(*args, stdin=None)``: ``unifiedamp port ARGS`` in this process."""

    def run(*args: str, stdin: str | None = None) -> SimpleNamespace:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        try:
            status = main(["port", *args])
        except SystemExit as exc:
            status = exc.code
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=status, stdout=out, stderr=err)

    return run


# ================================================================ notes against the call


def _written_keywords(after: str) -> dict[str, str]:
    """Every keyword argument of every call in the written expression, as source text."""
    tree = ast.parse(after.strip(), mode="eval")
    return {k.arg: ast.unparse(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
            for k in node.keywords if k.arg is not None}


def _value(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def contradictions(after: str, notes: list[str]) -> list[str]:
    """The notes that say a parameter was dropped (or has no meaning and is not written)
    while the written call sets it (to another value)."""
    written = _written_keywords(after)
    out = []
    for note in notes:
        dropped = re.match(r"dropped (\w+)=(.*?): ", note)
        ignored = re.match(r"(\w+)=(.*?): no canonical meaning", note)
        if dropped and dropped[1] in written:
            out.append(note)
        elif ignored and ignored[1] in written and \
                _value(written[ignored[1]]) != _value(ignored[2]):
            out.append(note)
    return out


def test_the_note_check_finds_the_contradiction_of_the_static_keras_port():
    # The written call and note of a port that made the static scaler dynamic.
    after = ('ua.GradScaler(init_scale=1024.0, dynamic=True, backend="keras").wrap(opt)')
    notes = ["dynamic=False: no canonical meaning (Keras 3 takes only dynamic=True)",
             "dropped dynamic=False: unifiedamp.GradScaler has no such parameter",
             "inner_optimizer=opt: no canonical meaning (the optimizer it wraps)"]
    assert contradictions(after, notes) == notes[:2]


ALL = {**{k: v[0] for k, v in SOURCES.items()}, **{k: v[0] for k, v in TF_FLAGGED.items()},
       **{k: v[0] for k, v in FLAGGED.items()}}


@pytest.mark.parametrize("key", ALL)
@pytest.mark.parametrize("to", TARGETS)
def test_no_note_names_a_parameter_the_written_call_sets(key, to):
    version = SOURCES[key][4] if key in SOURCES else None
    result = port_source(ALL[key], to, from_version=version)
    for site in result.sites:
        if site.after != site.before:
            assert contradictions(site.after, site.notes) == [], (site.after, site.notes)


# ================================================================ a static scale stays static


def test_a_static_tf_keras_scaler_stays_static_for_unifiedamp_paddle_and_jmp(tmp_path, cli):
    path = tmp_path / "model.py"
    path.write_text(STATIC)
    out = cli(str(path), "--to", "unifiedamp")
    assert out.returncode == 0, out.stderr
    assert "min_scale=1.0, max_scale=None, dynamic=False, backend=\"keras\").wrap(inner)" in \
        out.stdout and "init_scale=1024.0" in out.stdout
    paddle = ported("tf_keras_static", "paddle")
    assert "init_loss_scaling=1024.0" in paddle.code
    assert "use_dynamic_loss_scaling=False" in paddle.code
    assert not any("dynamic" in p for p in paddle.problems)  # only the training loop's
    assert "jmp.StaticLossScale(loss_scale=1024.0)" in ported("tf_keras_static", "jmp").code


def test_a_static_scale_is_a_problem_for_torch_and_keras_3(tmp_path, cli):
    path = tmp_path / "model.py"
    path.write_text(STATIC)
    torch = cli(str(path), "--to", "torch")
    assert torch.returncode == 1
    assert "torch.amp.GradScaler cannot express dynamic=False" in torch.stderr
    assert "torch's GradScaler has no static mode" in torch.stderr
    assert "ua.GradScaler(init_scale=..., dynamic=False, backend='torch')" in torch.stderr
    keras = cli(str(path), "--to", "keras")
    assert keras.returncode == 1
    assert "Keras 3 has no static LossScaleOptimizer" in keras.stderr
    assert "dynamic=False, backend='keras').wrap(opt)" in keras.stderr
    # Keras 3 refuses dynamic=False: the written call must not pass it.
    assert "keras.optimizers.LossScaleOptimizer(inner, initial_scale=1024.0, " \
           "dynamic_growth_steps=2000)" in keras.stdout


def test_tf_keras_2_static_rules():
    # Keras 3 refuses dynamic=False: config_from_call reads such a call as tf-keras 2.
    name = "tf.keras.mixed_precision.LossScaleOptimizer"
    config, notes = config_from_call(name, ("o",), {"initial_scale": 8.0, "dynamic": False})
    assert (config.init_scale, config.dynamic) == (8.0, False)
    assert "written for tf-keras 2" in notes[0]
    with pytest.raises(ValueError, match="without initial_scale"):
        config_from_call(name, ("o",), {"dynamic": False})
    with pytest.raises(ValueError, match="a static scale never grows"):
        config_from_call(name, ("o",), {"dynamic": False, "initial_scale": 8,
                                        "dynamic_growth_steps": 10})
    with pytest.raises(ValueError, match="Keras 3 has no static"):
        config_from_call(name, ("o",), {"dynamic": False, "initial_scale": 8},
                         version="tensorflow=2.21")


# ================================================================ TensorFlow 2.1-2.3


@pytest.mark.parametrize(("argument", "expected"), [
    ("'dynamic'", dict(init_scale=32768.0, growth_interval=2000, min_scale=1.0, dynamic=True)),
    ("loss_scale='dynamic'", dict(init_scale=32768.0, dynamic=True)),
    ("128", dict(init_scale=128.0, dynamic=False)),
    ("loss_scale=2 ** 7", dict(init_scale=128.0, dynamic=False)),
    ("tf.mixed_precision.experimental.FixedLossScale(64)", dict(init_scale=64.0, dynamic=False)),
    ("tf.train.experimental.DynamicLossScale(1024, 10, multiplier=4)",
     dict(init_scale=1024.0, growth_interval=10, growth_factor=4.0, backoff_factor=0.25,
          min_scale=1.0)),
])
def test_tensorflow_2_3_experimental_spelling_is_read(argument, expected):
    src = ("import tensorflow as tf\n"
           f"opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(inner, {argument})\n")
    result = port_source(src, "unifiedamp")
    site = result.sites[0]
    assert site.source == "tf.keras.mixed_precision.experimental.LossScaleOptimizer"
    assert result.ok, result.problems
    for name, value in expected.items():
        assert site.config[name] == repr(value), (name, site.config)
    assert ".wrap(inner)" in result.code and "experimental" not in result.code


def test_a_loss_scale_port_cannot_read_is_a_problem_and_left_as_it_is():
    src = ("import tensorflow as tf\n"
           "a = tf.keras.mixed_precision.experimental.LossScaleOptimizer(o, flags.loss_scale)\n"
           "b = tf.keras.mixed_precision.experimental.LossScaleOptimizer(\n"
           "    o, tf.mixed_precision.experimental.DynamicLossScale(initial_loss_scale=n))\n")
    result = port_source(src, "unifiedamp")
    assert result.code == src and len(result.problems) == 2
    assert all("may be 'dynamic' or a number" in p for p in result.problems)


# ================================================================ flagged sources


@pytest.mark.parametrize("key", TF_FLAGGED)
@pytest.mark.parametrize("to", TARGETS)
def test_flagged_tensorflow_sources_are_problems(key, to, cli, tmp_path):
    source, words = TF_FLAGGED[key]
    path = tmp_path / "train.py"
    path.write_text(source)
    proc = cli(str(path), "--to", to)
    assert proc.returncode == 1, proc.stderr
    assert words.get(to, words["*"]) in proc.stderr


def test_the_graph_rewrite_is_left_as_it_is_naming_its_loss_scale():
    source = TF_FLAGGED["graph_rewrite_v1"][0]
    result = port_source(source, "unifiedamp")
    assert result.code == source
    assert "(loss_scale=128)" in result.problems[0]
    assert result.problems[0].startswith("line 3: tensorflow.compat.v1.mixed_precision."
                                         "enable_mixed_precision_graph_rewrite(...)")


def test_a_tf_keras_optimizer_is_named_with_the_fix_for_unifiedamp():
    result = port_source(TF_FLAGGED["tf_keras_package"][0], "unifiedamp")
    (problem,) = result.problems
    assert "wraps a tf-keras 2 (Keras 2) optimizer" in problem
    assert "raises TypeError at run time" in problem
    assert "keras.optimizers.SGD for tf_keras.optimizers.SGD" in problem


# ================================================================ which Keras tf.keras is

GUESS = "import tensorflow as tf\nopt = tf.keras.mixed_precision.LossScaleOptimizer(inner)\n"


@pytest.mark.parametrize(("version", "floor"), [
    ("tensorflow=2.15", "1.0"), ("tensorflow=2.3", "1.0"), ("keras=2", "1.0"),
    ("tf-keras=2.15", "1.0"), ("2.15", "1.0"), ("tensorflow=2.16", "None"),
    ("tensorflow=2.21", "None"), ("keras=3", "None"), ("3.15.1", "None")])
def test_from_version_names_its_framework(version, floor, cli):
    proc = cli("-", "--to", "unifiedamp", "--from-version", version, stdin=GUESS)
    assert proc.returncode == 0, proc.stderr
    assert f"min_scale={floor}," in proc.stdout


@pytest.mark.parametrize("version", ["2", "2.16", "2.21"])
def test_a_bare_version_that_is_ambiguous_for_tf_keras_exits_2(version, cli):
    proc = cli("-", "--to", "unifiedamp", "--from-version", version, stdin=GUESS)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        f"unifiedamp port: version {version} is ambiguous for tf.keras: tf.keras is tf-keras 2 "
        f"up to TensorFlow 2.15 and Keras 3 from 2.16, and {version} may be TensorFlow's or "
        f"Keras's version; say which: --from-version tensorflow={version} or keras={version}\n")
    # Where no tf.keras call is, the bare version is paddle's as before.
    paddle = cli("-", "--to", "torch", "--from-version", version,
                 stdin=SOURCES["paddle2"][0])
    assert paddle.returncode in (0, 1) and "torch.amp.GradScaler(" in paddle.stdout


def test_a_framework_version_applies_to_its_framework_only(cli):
    paddle = cli("-", "--to", "unifiedamp", "--from-version", "paddle=2.6",
                 stdin=SOURCES["paddle2"][0] + "x = 1\n")
    assert "hysteresis=2" in paddle.stdout  # paddle 2.x's decr_every_n_nan_or_inf
    other = cli("-", "--to", "unifiedamp", "--from-version", "paddle=2.6", stdin=GUESS)
    assert other.returncode == 1 and "--from-version tensorflow=" in other.stderr
    bad = cli("-", "--to", "unifiedamp", "--from-version", "tensorflw=2.15", stdin=GUESS)
    assert bad.returncode == 2
    assert "'tensorflw' is not a framework port knows" in bad.stderr


def test_without_evidence_the_defaults_are_a_guess_and_a_problem_where_they_differ():
    result = port_source(GUESS, "unifiedamp")
    (problem,) = result.problems
    assert "nothing in this file says whether tf.keras is tf-keras 2" in problem
    assert "min_scale=1.0 (tf-keras 2) or None (Keras 3)" in problem
    assert "wrote Keras 3's (the installed TensorFlow's)" in problem  # tensorflow 2.21 here
    # The positional orders differ too: (inner, 8.0) is initial_scale=8 in Keras 3 only.
    positional = port_source("import tensorflow as tf\n"
                             "s = tf.keras.mixed_precision.LossScaleOptimizer(inner, 8.0)\n",
                             "paddle", from_version="paddle=3")
    assert "(tf-keras 2 refuses it: dynamic must be a bool, got 8.0; Keras 3 takes it)" in \
        positional.problems[0]


@pytest.mark.parametrize(("line", "floor", "why"), [
    ("import tf_keras\n", "1.0", "imports tf_keras"),
    ("tf.compat.v1.disable_v2_behavior()\n", "1.0", "uses tf.compat.v1"),
    ("import os\nos.environ['TF_USE_LEGACY_KERAS'] = '1'\n", "1.0", "TF_USE_LEGACY_KERAS"),
    ("y = tf.keras.mixed_precision.experimental.global_policy()\n", "1.0",
     "tf.keras.mixed_precision.experimental"),
    ("import keras\nz = keras.ops.ones(2)\n", "None", "uses keras.ops"),
    ("from keras.src import ops\n", "None", "keras.src"),
])
def test_the_file_says_which_keras_tf_keras_is(line, floor, why):
    result = port_source("import tensorflow as tf\n" + line
                         + "opt = tf.keras.mixed_precision.LossScaleOptimizer(inner)\n",
                         "unifiedamp")
    site = next(s for s in result.sites if s.kind == "constructor")
    assert site.config["min_scale"] == floor
    assert any(why in n and n.startswith("tf.keras read as") for n in site.notes), site.notes
    assert not any("--from-version tensorflow=<" in p for p in site.problems)


def test_two_things_that_disagree_are_no_evidence():
    result = port_source("import tensorflow as tf\nimport tf_keras\nimport keras\n"
                         "z = keras.ops.ones(2)\n" + GUESS.split("\n", 1)[1], "unifiedamp")
    assert any("nothing in this file says" in p for p in result.problems)
