"""``unifiedamp port``: the source rewriter (``unifiedamp.porting.port_source``) and its command,
framework-free.

The rewritten source is read back with the rewriter itself (ported again to unifiedamp, the
output must hold the source's config). The strongest check, in the sessions of the frameworks
(tests/<framework>/test_port_source.py, tests/cross, tests/keras), executes the rewritten source
with the real frameworks and reads the live scaler's config with ``porting.from_native``: it
must equal the source call's config, and every field that differs must be named by a problem
on that line; :func:`test_every_rewritten_source_is_built_in_exactly_one_session` checks that
each (source, target) pair is built in exactly one of them.
"""

from __future__ import annotations

import ast
import collections
import io
import pathlib
import shutil
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

pytest.importorskip("libcst")

import port_sources  # noqa: E402
from port_sources import LATE_IMPORT, SOURCES, TARGETS, expected, ported, read_back  # noqa: E402

from unifiedamp.cli import main  # noqa: E402
from unifiedamp.porting import port_source  # noqa: E402
from unifiedamp.spec import ScalerConfig  # noqa: E402

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_every_rewritten_source_is_built_in_exactly_one_session():
    """Each source ported to each target runs with the real frameworks in exactly one
    session's test_port_source.py (keras: in its process, or paddle beside Keras in one of
    its own)."""
    built: collections.Counter[tuple[str, str]] = collections.Counter()
    for session in ("torch", "paddle", "jax", "cross", "keras"):
        for paddle_with_keras in ((False, True) if session == "keras" else (False,)):
            for to, keys in port_sources.pairs(session, paddle_with_keras).items():
                built.update((key, to) for key in keys)
        runner = (TESTS / session / "test_port_source.py").read_text()
        assert "test_the_rewritten_source_builds_the_same_scaler_in_the_real_framework" in runner
        assert f'pairs("{session}"' in runner, session
    every = {(key, to) for to in TARGETS for key in port_sources.keys(to)}
    assert set(built) == every and set(built.values()) == {1}, built
    assert len(every) == 47 + 6 * len(TARGETS)  # + the tf.keras spellings


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli(*args, stdin=None)``: ``unifiedamp port ARGS`` in this process, with its exit
    status, standard output and standard error."""

    def run(*args: str, stdin: str | None = None) -> SimpleNamespace:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        try:
            status = main(["port", *args])
        except SystemExit as exc:  # argparse: --help, usage errors
            status = exc.code
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=status, stdout=out, stderr=err)

    return run


# ================================================================ no framework


@pytest.mark.parametrize("key", SOURCES)
def test_each_source_constructor_is_found_through_its_import_and_read(key):
    result = ported(key, "unifiedamp")
    site = result.sites[0]
    assert site.source == SOURCES[key][1] and site.line == SOURCES[key][0].count("\n")
    assert read_back(result.code) == expected(key)


@pytest.mark.parametrize("key", SOURCES)
@pytest.mark.parametrize("to", TARGETS)
def test_what_differs_after_a_port_is_reported(key, to):
    # Read back framework-free: a field the target changes must be named by a problem.
    result = ported(key, to)
    if to == "keras" and port_sources.SOURCE_FRAMEWORK[key] != "keras":
        assert "ua.GradScaler(" in result.code  # Keras's class needs an optimizer
    version = "3" if to == "paddle" else None
    back, source = read_back(result.code, version), expected(key)
    problems = " ".join(result.sites[0].problems)
    for name, value in source.to_dict().items():
        if not source.dynamic and name in port_sources._DYNAMIC_ONLY:
            continue  # a static source never uses them
        if getattr(back, name) != value:
            assert f"{name}=" in problems or name in problems, (name, problems)
    if to == "unifiedamp":
        assert back == source and result.ok


def test_positional_keyword_and_default_forms_build_the_same_config():
    forms = ["torch.amp.GradScaler('cpu', 65536.0, 2.0, 0.5, 2000, True)",
             "torch.amp.GradScaler(device='cpu', init_scale=2.0 ** 16, growth_interval=2000)",
             "torch.amp.GradScaler()"]
    for form in forms:
        assert read_back(f"import torch\ns = {form}\n") == ScalerConfig()


def test_sharded_grad_scaler_positional_order_backoff_before_growth():
    result = ported("sharded", "torch")
    assert result.sites[0].config["backoff_factor"] == "0.25"
    assert result.sites[0].config["growth_factor"] == "4.0"
    # FSDP's class stays FSDP's, spelled as the file imports it, every value by keyword.
    assert ("scaler = ShardedGradScaler(\"cpu\", init_scale=1024.0, backoff_factor=0.25, "
            "growth_factor=4.0, growth_interval=5, enabled=True)") in result.code
    paddle = ported("sharded", "paddle").code
    assert "incr_ratio=4.0, decr_ratio=0.25" in paddle


def test_torch_to_paddle_writes_decr_every_n_nan_or_inf_1():
    result = ported("torch", "paddle")
    assert result.ok, result.problems
    assert "decr_every_n_nan_or_inf=1" in result.code
    assert "import paddle\n" in result.code  # added once
    assert read_back(result.code, version="2.6") == expected("torch")


def test_keras_to_torch_carries_32768():
    result = ported("keras", "torch")
    assert 'torch.amp.GradScaler("cuda", init_scale=32768.0,' in result.code
    assert read_back(result.code).init_scale == 32768.0
    assert any("default: initial_scale=32768.0" in n for n in result.sites[0].notes)


def test_torch_growth_3_to_keras_needs_the_wrapper():
    result = ported("torch", "keras")
    assert not result.ok
    assert any("needs unifiedamp's wrapper" in p and "growth_factor=3.0" in p
               for p in result.problems)
    assert 'ua.GradScaler(init_scale=1024.0, growth_factor=3.0' in result.code
    assert 'backend="keras")' in result.code


def test_keras_to_keras_and_unifiedamp_keep_the_inner_optimizer():
    assert ("keras.optimizers.LossScaleOptimizer(inner, initial_scale=32768.0, "
            "dynamic_growth_steps=50)") in ported("keras", "keras").code
    assert '.wrap(inner)' in ported("keras", "unifiedamp").code


@pytest.mark.parametrize(("version", "values"), [("2.6", "32768.0 1000 2"),
                                                 ("3.3.1", "65536.0 2000 1")])
def test_paddle_defaults_follow_from_version(version, values):
    result = port_source("import paddle\ns = paddle.amp.GradScaler()\n", "torch",
                         from_version=version)
    config = result.sites[0].config
    assert " ".join(config[k] for k in ("init_scale", "growth_interval", "hysteresis")) == values
    assert (f"init_scale={values.split()[0]}" in result.code and
            f"growth_interval={values.split()[1]}" in result.code)
    assert ("hysteresis=2" in " ".join(result.problems)) == (version == "2.6")


def test_jmp_defaults_are_made_explicit():
    result = port_source("import jmp\nls = jmp.DynamicLossScale(2.0 ** 15)\n", "unifiedamp")
    notes = result.sites[0].notes
    assert "default: min_loss_scale=1.0 (min_scale=1.0)" in notes
    assert any(n.startswith("default: factor=2") for n in notes)
    assert "growth_factor=2.0, backoff_factor=0.5, growth_interval=2000" in result.code
    assert "min_scale=1.0" in result.code and 'backend="jax"' in result.code
    back = port_source("import torch\ns = torch.amp.GradScaler('cpu')\n", "jmp")
    assert "min_loss_scale=1.0" in back.code and "floor of 1" in " ".join(back.problems)


def test_everything_outside_the_call_is_kept_byte_for_byte():
    src = textwrap.dedent('''\
        """A training script."""
        from __future__ import annotations

        import torch   # the framework
        # a comment before
        scaler  =  torch.amp.GradScaler(  "cpu",
            init_scale = 1024.0 ,  # odd spacing
        )   # after the call
        def  f( x ) :  return x  # untouched

        x = [1,2,
             3]
    ''')
    result = port_source(src, "paddle")
    out = result.code.splitlines(keepends=True)
    assert out[:3] == src.splitlines(keepends=True)[:3]
    assert out[3:5] == ["import torch   # the framework\n", "import paddle\n"]
    assert out[5] == "# a comment before\n"
    assert out[6].startswith("scaler  =  paddle.amp.GradScaler(enable=True, ")
    assert out[6].endswith(")   # after the call\n")
    assert out[7:] == src.splitlines(keepends=True)[8:]


def test_existing_imports_are_reused_and_added_once():
    src = ("import paddle as pd\nimport torch\na = torch.amp.GradScaler()\n"
           "b = torch.amp.GradScaler()\n")
    out = port_source(src, "paddle").code
    assert out.count("import paddle") == 1 and out.count("pd.amp.GradScaler(") == 2
    out = port_source(src, "unifiedamp").code
    assert out.count("import unifiedamp as ua\n") == 1 and out.count("ua.GradScaler(") == 2


def test_tf_keras_through_tensorflow_alias():
    src = ("import tensorflow as tf\ninner = None\n"
           "opt = tf.keras.mixed_precision.LossScaleOptimizer(inner, initial_scale=2 ** 10)\n")
    result = port_source(src, "torch", from_version="3")
    assert result.sites[0].source == "tf.keras.mixed_precision.LossScaleOptimizer"
    assert "init_scale=1024.0" in result.code


def test_non_literal_arguments_are_kept_where_the_meaning_is_the_same():
    src = "import torch\ng = 3.0\ns = torch.amp.GradScaler('cpu', growth_factor=g, init_scale=n)\n"
    result = port_source(src, "paddle")
    assert "init_loss_scaling=n, incr_ratio=g," in result.code and result.ok
    result = port_source(src, "jmp")  # one factor for growth and backoff
    assert "loss_scale=n," in result.code
    assert any(p.startswith("line 3: growth_factor=g is not a literal") for p in result.problems)


def test_unreadable_calls_are_reported_and_left_as_they_are():
    src = "import torch\ns = torch.amp.GradScaler(*args)\nt = torch.amp.GradScaler(scale=2)\n"
    result = port_source(src, "paddle")
    assert result.code == src
    assert result.problems[0].startswith("line 2: *args: arguments unpacked at run time")
    assert "unexpected keyword argument 'scale'" in result.problems[1]
    assert result.problems[1].startswith("line 3: ")


def test_verbs_are_renamed_where_exact_and_reported_where_not():
    src = textwrap.dedent("""\
        import torch
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print(scaler.get_growth_factor(), scaler.get_scale())
    """)
    result = port_source(src, "paddle")
    assert "scaler.step(opt)\nscaler.update()\n" in result.code
    assert "print(scaler.get_incr_ratio(), scaler.get_scale())" in result.code
    assert result.problems == ["line 6: get_scale() has no paddle counterpart: "
                               + result.sites[-1].problems[0].split(": ", 1)[1]]
    back = port_source("import paddle\ns = paddle.amp.GradScaler()\ns.minimize(opt, loss)\n"
                       "s.is_enable()\n", "torch")
    assert "s.is_enabled()" in back.code and "s.minimize(opt, loss)" in back.code
    assert back.problems[-1].startswith("line 3: minimize() has no torch counterpart")
    ua_port = port_source("import paddle\ns = paddle.amp.GradScaler()\ns.minimize(o, l)\n",
                          "unifiedamp")
    assert ua_port.ok and "s.minimize(o, l)" in ua_port.code  # the paddle backend has it


def test_a_file_without_scalers_is_unchanged():
    result = port_source("import torch\nx = torch.ones(3)\n", "paddle")
    assert result.code == "import torch\nx = torch.ones(3)\n" and result.sites == []


# The shape of tf-models-official's official/modeling/performance.py (tf-keras 2 on TF 2.16+).
TF_MODELS = textwrap.dedent("""\
    import tf_keras


    def configure_optimizer(optimizer, use_float16=False, loss_scale=None):
      if use_float16:
        if loss_scale in (None, 'dynamic'):
          optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
        else:
          optimizer = tf_keras.mixed_precision.LossScaleOptimizer(
              optimizer, dynamic=False, initial_scale=loss_scale)
      return optimizer
""")


def test_tf_keras_the_legacy_keras_package_is_read_as_tf_keras_2():
    result = port_source(TF_MODELS, "unifiedamp")
    dynamic, static = [s for s in result.sites if s.kind == "constructor"]
    assert dynamic.source == static.source == "tf_keras.mixed_precision.LossScaleOptimizer"
    assert (dynamic.line, static.line) == (7, 9)
    # tf-keras 2's rule: Keras's 32768 and 2000, a floor of 1; the static one keeps its scale.
    assert read_back(result.code) == ScalerConfig(32768.0, min_scale=1.0)
    assert static.config["init_scale"] == "loss_scale" and static.config["dynamic"] == "False"
    assert ("ua.GradScaler(init_scale=loss_scale, growth_factor=2.0, backoff_factor=0.5, "
            "growth_interval=2000, enabled=True, hysteresis=1, min_scale=1.0, max_scale=None, "
            'dynamic=False, backend="keras").wrap(optimizer)') in result.code
    aliased = port_source("from tf_keras import mixed_precision\n"
                          "opt = mixed_precision.LossScaleOptimizer(inner)\n", "torch")
    assert aliased.sites[0].source == "tf_keras.mixed_precision.LossScaleOptimizer"
    assert "init_scale=32768.0" in aliased.code


def first_use_after_binding(code: str, name: str) -> bool:
    """Whether the module binds ``name`` (an import) before the first top-level statement
    that uses it, as Python runs a module: top to bottom."""
    tree = ast.parse(code)
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if name in {(a.asname or a.name).split(".")[0] for a in stmt.names}:
                return True
        elif any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(stmt)):
            return False
    return True


@pytest.mark.parametrize(("to", "name"), [("unifiedamp", "ua"), ("paddle", "paddle"),
                                          ("jmp", "jmp")])
def test_the_added_import_comes_before_the_first_statement_that_uses_it(to, name):
    result = port_source(LATE_IMPORT, to)
    assert first_use_after_binding(result.code, name), result.code
    lines = result.code.splitlines()
    assert lines[:3] == ['"""Train."""', "from __future__ import annotations", "import torch"]
    assert lines[3] == (f"import {name}" if name != "ua" else "import unifiedamp as ua")
    assert lines[5:] == LATE_IMPORT.splitlines()[4:]  # nothing else moves


# The shape of detectron2's AMPTrainer: the scaler reaches self.grad_scaler through a local.
DETECTRON2 = textwrap.dedent("""\
    import torch


    class AMPTrainer:
        def __init__(self, model, optimizer, grad_scaler=None):
            if grad_scaler is None:
                from torch.cuda.amp import GradScaler

                grad_scaler = GradScaler()
            self.grad_scaler = grad_scaler

        def run_step(self, losses):
            self.grad_scaler.scale(losses).backward()
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()

        def state_dict(self):
            scaler = self.grad_scaler
            return {"grad_scaler": scaler.state_dict(), "scale": self.grad_scaler.get_scale()}
""")


def test_verbs_are_followed_through_assignments_to_attributes_and_locals():
    result = port_source(DETECTRON2, "paddle")
    verbs = {(s.line, s.source.rsplit(".", 1)[1]) for s in result.sites if s.kind == "verb"}
    assert verbs == {(13, "scale"), (14, "step"), (15, "update"), (19, "state_dict"),
                     (19, "get_scale")}
    assert not result.ok
    assert result.problems == ["line 19: get_scale() has no paddle counterpart: "
                               + result.sites[-1].problems[0].split(": ", 1)[1]]
    assert "self.grad_scaler.get_scale()" in result.code  # reported, left as it is
    assert port_source(DETECTRON2, "unifiedamp").ok
    # A scaler that is one branch of a choice, or assigned to two names at once.
    for build in ("given if given is not None else torch.amp.GradScaler()",
                  "given or torch.amp.GradScaler()", "other = torch.amp.GradScaler()"):
        src = f"import torch\nself.s = {build}\nself.s.get_scale()\n"
        assert port_source(src, "paddle").problems[-1].startswith(
            "line 3: get_scale() has no paddle counterpart"), build


def test_a_parameter_the_target_class_shares_is_kept():
    jmp_src = ("import jmp, jax.numpy as jnp\n"
               "ls = jmp.DynamicLossScale(jnp.float32(2 ** 15), counter=jnp.zeros([], jnp.int32),"
               " period=1000)\n")
    result = port_source(jmp_src, "jmp")
    assert "counter=jnp.zeros([], jnp.int32)" in result.code
    assert not any("dropped counter" in n for n in result.sites[0].notes)
    assert any("dropped counter" in n for n in port_source(jmp_src, "unifiedamp").sites[0].notes)
    keras_src = ("import keras\nopt = keras.optimizers.LossScaleOptimizer(inner, name='lso')\n")
    assert "name=\"lso\"" in port_source(keras_src, "keras").code


# The shape of mmengine's AmpOptimWrapper: the class is picked, then called through a local.
MMENGINE = textwrap.dedent("""\
    import torch
    from torch.cuda.amp import GradScaler


    class AmpOptimWrapper:
        def __init__(self, loss_scale='dynamic', use_fsdp=False):
            if use_fsdp:
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
                scaler_type = ShardedGradScaler
            else:
                scaler_type = GradScaler
            if loss_scale == 'dynamic':
                self.loss_scaler = scaler_type()
            elif isinstance(loss_scale, dict):
                self.loss_scaler = scaler_type(**loss_scale)
""")
# dm-haiku's examples: the class is looked up by name at run time.
HAIKU = textwrap.dedent("""\
    import jmp


    def get_initial_loss_scale() -> jmp.LossScale:
      cls = getattr(jmp, f'{FLAGS.mp_scale_type}LossScale')
      return cls(FLAGS.mp_scale_value) if cls is not jmp.NoOpLossScale else cls()
""")
# dinov2-like: a package's __init__ re-exports the class.
REEXPORT = "from torch.cuda.amp import GradScaler  # noqa: F401\n"


@pytest.mark.parametrize(("code", "expected"), [
    (MMENGINE, ["line 9: torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler "
                "(imported at line 8) is used here as a value, not called",
                "line 11: torch.cuda.amp.GradScaler (imported at line 2) is used here as a "
                "value, not called"]),
    (HAIKU, ["line 5: getattr(jmp, ...) picks a class of jmp at run time"]),
    (REEXPORT, ["line 1: imports torch.cuda.amp.GradScaler and never uses it here"]),
    (TF_MODELS.replace("optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)",
                       "assert isinstance(optimizer, tf_keras.mixed_precision."
                       "LossScaleOptimizer)"),
     ["line 7: tf_keras.mixed_precision.LossScaleOptimizer (imported at line 1) is used here "
      "as a value, not called"]),
])
def test_a_scaler_class_used_other_than_by_a_call_is_a_problem_naming_why(code, expected):
    result = port_source(code, "paddle")
    problems = [f"line {s.line}: {p}" for s in result.sites if s.kind == "reference"
                for p in s.problems]
    assert [":".join(p.split(":", 2)[:2]) for p in problems] == expected
    assert all("port cannot follow" in p for p in problems), problems
    assert not result.ok


def test_a_scaler_class_that_stays_the_target_class_is_no_problem():
    src = ("import torch\ns = torch.amp.GradScaler('cpu')\n"
           "assert isinstance(s, torch.amp.GradScaler)\n")
    assert port_source(src, "torch").ok
    assert not port_source(src, "paddle").ok


# ================================================================ the command


def test_cli_check_prints_the_plan_and_writes_nothing(tmp_path, cli):
    path = tmp_path / "train.py"
    path.write_text(SOURCES["torch"][0])
    proc = cli(str(path), "--to", "keras", "--check")
    assert proc.returncode == 1, proc.stderr
    assert path.read_text() == SOURCES["torch"][0]
    out = proc.stdout
    assert f"{path}:2: constructor torch.amp.GradScaler -> unifiedamp.GradScaler" in out
    assert "  before: torch.amp.GradScaler('cpu', 1024.0, 3.0, 0.25, 10)" in out
    assert "  after:  ua.GradScaler(init_scale=1024.0, growth_factor=3.0" in out
    assert "  PROBLEM: keras.optimizers.LossScaleOptimizer cannot express growth_factor=3.0" in out
    assert out.splitlines()[-1].endswith("problem(s)")
    ok = cli(str(path), "--to", "paddle", "--check")
    assert ok.returncode == 0 and "decr_every_n_nan_or_inf=1" in ok.stdout


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch(1)")
def test_cli_diff_is_a_unified_diff_that_applies(tmp_path, cli):
    path = tmp_path / "train.py"
    path.write_text(SOURCES["keras"][0])
    proc = cli(str(path), "--to", "torch", "--diff")
    assert proc.returncode == 1 and "port the training loop too" in proc.stderr
    rel = str(path).lstrip("/")
    assert proc.stdout.startswith(f"--- a/{rel}\n+++ b/{rel}\n@@ ")
    patched = tmp_path / "patched.py"
    shutil.copy(path, patched)
    subprocess.run(["patch", "-s", str(patched)], input=proc.stdout, text=True, check=True)
    assert patched.read_text() == ported("keras", "torch").code
    assert path.read_text() == SOURCES["keras"][0]


def test_cli_writes_stdout_output_and_in_place(tmp_path, cli):
    path = tmp_path / "train.py"
    path.write_text(SOURCES["paddle2"][0])
    expected_code = ported("paddle2", "torch").code
    proc = cli("-", "--to", "torch", "--from-version", "2.6", stdin=SOURCES["paddle2"][0])
    assert proc.stdout == expected_code and proc.returncode == 1
    assert "<stdin>:2: problem: torch.amp.GradScaler cannot express hysteresis=2" in proc.stderr
    out = tmp_path / "out.py"
    assert cli(str(path), "--to", "torch", "--from-version", "2.6", "-o", str(out)).returncode == 1
    assert out.read_text() == expected_code
    assert cli(str(path), "--to", "unifiedamp", "--in-place").returncode == 0
    assert "ua.GradScaler(" in path.read_text()


def test_cli_usage_errors_exit_2(tmp_path, cli):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ns = torch.amp.GradScaler(\n\nx = = 1\n")
    proc = cli(str(bad), "--to", "paddle")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"unifiedamp port: {bad}:4:") and "cannot parse" in proc.stderr
    assert "No such file" in cli(str(tmp_path / "none.py"), "--to", "paddle").stderr
    assert cli(str(bad), "--to", "mxnet").returncode == 2
    assert cli("-", "--to", "paddle", "--in-place").returncode == 2
    assert cli(str(bad), "--to", "paddle", "--check", "--diff").returncode == 2
    assert "exit status: 0 when" in cli("--help").stdout


# ================================================================ Flax, Paddle static, wrappers


@pytest.mark.parametrize("key", port_sources.FLAGGED)
@pytest.mark.parametrize("to", TARGETS)
def test_flagged_sources_exit_1_with_the_problem_that_says_why(tmp_path, cli, key, to):
    """Paddle's static-graph AMP, a patching wrapper (shard_scaler, distributed_scaler)
    around a ported scaler, and a DynamicScale whose loop port cannot see: exit 1, the
    problem on the line (to unifiedamp: with the words of the fix). A wrapper around a
    scaler that stays paddle.amp.GradScaler (--to paddle) works as before: no problem."""
    code, words = port_sources.FLAGGED[key]
    path = tmp_path / "train.py"
    path.write_text(code)
    proc = cli(str(path), "--to", to)
    stays = to == "paddle" and key in ("shard_scaler", "distributed_scaler")
    assert proc.returncode == (0 if stays else 1), proc.stderr
    assert ("problem:" in proc.stderr) != stays
    if to == "unifiedamp":
        problems = " ".join(port_source(code, to).problems)
        assert all(word in problems for word in words), (words, problems)
    if key == "paddle_static":  # left as it is, and never "no constructor found"
        assert proc.stdout == code and "no native loss-scaler" not in proc.stderr
        assert f"{path}:5: problem: paddle.static.amp.decorate" in proc.stderr


def test_paddle_static_decorate_non_literal_and_default_scaling_are_named():
    result = port_source("from paddle.static import amp\n"
                         "opt = amp.decorate(opt, init_loss_scaling=cfg.scale)\n"
                         "opt2 = amp.decorate(opt)\n", "unifiedamp")
    assert result.problems[0].startswith("line 2: paddle.static.amp.decorate")
    assert "init_loss_scaling=cfg.scale (not a literal)" in result.problems[0]
    assert "decorate's defaults" in result.problems[1] and result.code == result.original


def test_shard_scaler_of_a_scaler_that_was_not_ported_is_no_problem():
    code = ("import paddle.distributed as dist\n"
            "scaler = dist.shard_scaler(make_scaler())\n")
    assert port_source(code, "unifiedamp").ok


@pytest.mark.parametrize("spelling", [
    "from flax.training import dynamic_scale as dynamic_scale_lib\n"
    "ds = dynamic_scale_lib.DynamicScale({args})\n",
    "from flax.training.dynamic_scale import DynamicScale\nds = DynamicScale({args})\n",
    "import flax\nds = flax.training.dynamic_scale.DynamicScale({args})\n",
])
def test_flax_dynamic_scale_is_found_and_written_one_interval_later(spelling):
    """Flax grows when fin_steps == growth_interval, one step after the spec with the same
    number: the written call carries growth_interval + 1 (a literal, or the expression plus
    one), Flax's clamp at float32's maximum as max_scale, its floor, backend="jax"; a note
    names the difference, and no note names a value other than the written one."""
    result = port_source(spelling.format(args="growth_interval=7, scale=2.0 ** 10"),
                         "unifiedamp")
    call = next(n for n in ast.walk(ast.parse(result.code)) if isinstance(n, ast.Call))
    written = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert written["growth_interval"] == 8 and written["init_scale"] == 1024.0
    assert written["max_scale"] == 3.4028234663852886e38 and written["backend"] == "jax"
    assert written["min_scale"] == 2.0**-126
    notes = result.sites[0].notes
    assert any("one step later" in n and "growth_interval=8" in n for n in notes)
    assert not any("growth_interval=7" in n and "written as growth_interval=8" not in n
                   for n in notes)
    # Loop not in this file: a problem on the constructor.
    assert len(result.problems) == 1 and "no value_and_grad call" in result.problems[0]
    expression = port_source(spelling.format(args="growth_interval=cfg.interval"), "unifiedamp")
    assert "growth_interval=cfg.interval + 1" in expression.code


def test_flax_fin_steps_in_the_constructor_is_state_and_a_problem():
    result = port_source("from flax.training.dynamic_scale import DynamicScale\n"
                         "ds = DynamicScale(fin_steps=5)\n", "unifiedamp")
    assert any("fin_steps=5 is state" in p for p in result.problems)


@pytest.mark.parametrize("to", ["torch", "paddle", "keras", "jmp"])
def test_flax_loop_to_another_framework_is_a_problem_on_each_line(to):
    result = port_source(port_sources.FLAX_IMAGENET, to)
    lines = {int(p.split(":")[0].removeprefix("line ")) for p in result.problems}
    assert {25, 58} <= lines, result.problems  # value_and_grad, and the constructor
