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
