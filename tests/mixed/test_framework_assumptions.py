"""What the spec and the facade assume of each framework, checked against the installed one.

Each check runs in a fresh interpreter (tensorflow and paddle cannot share a
process in every order) and is skipped, saying so, where the framework is not
installed.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap

import pytest

from unifiedamp import spec

# Prints {native parameter name: default} of the framework's native scaler.
DEFAULTS_PROGRAMS = {
    "torch": """
        import torch
        cls = torch.amp.GradScaler
    """,
    "paddle": """
        import paddle
        cls = paddle.amp.GradScaler
    """,
    "keras": """
        import keras
        cls = keras.optimizers.LossScaleOptimizer
    """,
}
SIGNATURE_DEFAULTS = """
    import inspect, json
    params = inspect.signature(cls.__init__).parameters.values()
    print(json.dumps({p.name: p.default for p in params
                      if p.default is not inspect.Parameter.empty and p.default is not None}))
"""
MODULES = {"torch": "torch", "paddle": "paddle", "keras": "keras", "jmp": "jmp"}


def require(framework: str) -> None:
    if importlib.util.find_spec(MODULES[framework]) is None:
        pytest.skip(f"{framework} is not installed: its defaults were not checked")


def native_defaults(run_python, framework: str) -> dict:
    if framework == "jmp":
        code = """
            import dataclasses, json, jmp
            fields = {f.name: f for f in dataclasses.fields(jmp.DynamicLossScale)}
            value = lambda f: f.default_factory() if f.default is dataclasses.MISSING else f.default
            d = {n: float(value(f)) for n, f in fields.items() if n in ("period", "min_loss_scale")}
            d["factor"] = float(value(fields["factor"]))
            print(json.dumps(d))
        """
    else:
        code = textwrap.dedent(DEFAULTS_PROGRAMS[framework]) + textwrap.dedent(SIGNATURE_DEFAULTS)
    proc = run_python(textwrap.dedent(code))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("framework", ["torch", "paddle", "keras"])
def test_the_framework_table_holds_the_installed_defaults(framework, run_python):
    require(framework)
    native = native_defaults(run_python, framework)
    row = spec.FRAMEWORKS[framework]
    checked = {}
    for canonical, name in row["names"].items():
        if name in native:
            checked[canonical] = native[name]
            assert row["defaults"][canonical] == native[name], (
                f"spec.FRAMEWORKS[{framework!r}]['defaults'][{canonical!r}] is "
                f"{row['defaults'][canonical]!r}, the installed {row['api']} defaults {name} "
                f"to {native[name]!r}")
    # Every native name in the table is a parameter of the installed constructor.
    assert set(checked) == set(row["names"]), (checked, row["names"])


def test_jmp_defaults_include_its_floor_of_one(run_python):
    require("jmp")
    native = native_defaults(run_python, "jmp")
    defaults = spec.FRAMEWORKS["jmp"]["defaults"]
    assert defaults["growth_interval"] == native["period"]
    assert defaults["min_scale"] == native["min_loss_scale"] == 1.0
    assert defaults["growth_factor"] == native["factor"]
    assert defaults["backoff_factor"] == 1 / native["factor"]


def test_paddle_2x_row_differs_from_paddle_3x_only_in_defaults():
    paddle2, paddle3 = spec.FRAMEWORKS["paddle2"], spec.FRAMEWORKS["paddle"]
    assert paddle2["names"] == paddle3["names"] and paddle2["api"] == paddle3["api"]
    changed = {k for k in paddle3["defaults"] if paddle2["defaults"][k] != paddle3["defaults"][k]}
    assert changed == {"init_scale", "growth_interval", "hysteresis"}


def test_aliases_are_every_native_spelling_plus_camel_case():
    natives = {name for row in spec.FRAMEWORKS.values() for name in row["names"].values()}
    camel = {"initScale", "growthFactor", "backoffFactor", "growthInterval", "minScale",
             "maxScale"}
    assert set(spec.ALIASES) == (natives - set(spec.CANONICAL)) | camel
    for row in spec.FRAMEWORKS.values():
        for canonical, name in row["names"].items():
            assert spec.ALIASES.get(name, name) == canonical, (name, canonical)


# The framework classes a backend derives from, or will (Paddle's scaler, Keras's
# optimizer wrapper): each must combine with unifiedamp.GradScaler's metaclass.
BASES = {
    "torch": ("torch", "import torch; base = torch.amp.GradScaler", {}),
    "paddle": ("paddle", "import paddle; base = paddle.amp.GradScaler", {}),
    "keras-tensorflow": ("keras", "import keras; base = keras.optimizers.LossScaleOptimizer",
                         {"KERAS_BACKEND": "tensorflow"}),
    "keras-jax": ("keras", "import keras; base = keras.optimizers.LossScaleOptimizer",
                  {"KERAS_BACKEND": "jax"}),
    "keras-torch": ("keras", "import keras; base = keras.optimizers.LossScaleOptimizer",
                    {"KERAS_BACKEND": "torch"}),
}


@pytest.mark.parametrize("case", sorted(BASES))
def test_framework_base_classes_combine_with_the_facade_metaclass(case, run_python):
    framework, setup, env = BASES[case]
    require(framework)
    code = setup + textwrap.dedent("""
        import unifiedamp as ua
        class Probe(base, ua.GradScaler):
            pass
        print(type(base).__name__, type(Probe).__name__, issubclass(Probe, ua.GradScaler))
    """)
    proc = run_python(code, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-3:] == ["type", "_FacadeMeta", "True"]


def test_paddle_members_the_paddle_backend_relies_on(run_python):
    # The paddle backend (backends/paddle/_compat.py) uses these private parts of paddle; a
    # release that changes one fails here, naming it, instead of deep inside a training step.
    require("paddle")
    code = textwrap.dedent("""
        import inspect, warnings
        import numpy as np, paddle
        from paddle import _C_ops
        from paddle.amp.grad_scaler import OptimizerState, _refresh_optimizer_state
        from paddle.base.framework import _dygraph_tracer
        from unifiedamp.backends.paddle import PaddleGradScaler

        assert [s.name for s in OptimizerState] == ["INIT", "UNSCALED", "STEPPED"]
        assert _refresh_optimizer_state() == {"state": OptimizerState.INIT}
        # The unscale kernel returns its flag (the one passed in is not written) and
        # multiplies by the float64 reciprocal rounded to float32.
        g = paddle.to_tensor(np.array([3.0, 1e30], np.float32))
        _, flag = _C_ops.check_finite_and_unscale_(
            [g], paddle.to_tensor(np.array([3.0], np.float32)), paddle.zeros([1], "bool"))
        assert not bool(flag), flag
        assert (g.numpy() == np.array([3.0, 1e30], np.float32) * np.float32(1 / 3.0)).all()
        _, flag = _C_ops.check_finite_and_unscale_(
            [paddle.to_tensor(np.array([np.nan], np.float32))],
            paddle.to_tensor(np.array([1.0], np.float32)), paddle.zeros([1], "bool"))
        assert bool(flag), flag
        tracer = _dygraph_tracer()
        assert str(tracer._amp_level) == "AmpLevel.O0" and tracer._amp_dtype == "float32"
        assert str(paddle.device._convert_to_place("cpu")) == "Place(cpu)"
        layer = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=[{"params": [layer.weight]},
                                               {"params": [layer.bias]}])
        assert [len(g["params"]) for g in opt._param_groups] == [1, 1]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # built disabled, it must not warn on a CPU place
            paddle.amp.GradScaler(enable=False)
        # Every public member of Paddle's scaler is this backend's own, so none runs
        # Paddle's behaviour on this backend's state.
        native = {n for n, v in inspect.getmembers(paddle.amp.GradScaler, callable)
                  if not n.startswith("__")}
        ours = {n for klass in PaddleGradScaler.__mro__[:1] for n in vars(klass)}
        missing = sorted(n for n in native if n not in ours and not n.startswith("_"))
        missing += sorted(n for n in ("_unscale", "_update") if n not in ours)
        assert not missing, missing
        print("ok")
    """)
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "ok", proc.stderr[-3000:]


def test_keras_members_the_keras_backend_relies_on(run_python):
    # The keras backend (backends/keras/_compat.py) overrides these members of Keras's
    # LossScaleOptimizer and relies on how Keras calls them; a release that changes one
    # fails here, naming it.
    require("keras")
    code = textwrap.dedent("""
        import inspect
        import keras
        from keras.src.optimizers import loss_scale_optimizer as lso
        from keras.src.trainers import trainer
        from keras.src.utils import tracking

        cls = keras.optimizers.LossScaleOptimizer
        overridden = ["_stateful_handle_finite_grads", "_stateful_handle_non_finite_grads",
                      "_stateless_handle_finite_grads", "_stateless_handle_non_finite_grads",
                      "_common_apply", "_tf_apply", "check_finite", "scale_loss",
                      "stateless_apply", "build", "get_config"]
        missing = [n for n in overridden if not callable(getattr(cls, n, None))]
        assert not missing, missing
        assert callable(tracking.no_automatic_dependency_tracking)
        assert callable(keras.optimizers.SGD()._overwrite_variable_with_gradient)
        apply = inspect.getsource(cls.apply)
        assert "_tf_apply" in apply and "_common_apply" in apply, apply
        # compile() wraps an optimizer in a LossScaleOptimizer under mixed_float16 unless
        # it is one already: the wrapper must stay an instance.
        assert "isinstance(self.optimizer, LossScaleOptimizer)" in inspect.getsource(trainer)
        opt = cls(keras.optimizers.SGD())
        opt.build([keras.Variable(1.0)])
        assert {v.name for v in opt.variables} >= {"step_counter", "dynamic_scale"}
        print("ok")
    """)
    proc = run_python(code, env={"KERAS_BACKEND": "tensorflow"})
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "ok", proc.stderr[-3000:]


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("paddle", "tensorflow")),
                    reason="paddle and tensorflow are not both installed")
def test_paddle_imported_after_tensorflow_crashes_the_process(run_python):
    """Why unifiedamp._isolation refuses that order (and the tests import paddle first)."""
    proc = run_python("import tensorflow\nimport paddle\nprint('unreached')", fresh=True)
    assert proc.returncode < 0 and "unreached" not in proc.stdout, proc.stderr[-2000:]

