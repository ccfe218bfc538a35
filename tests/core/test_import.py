"""A bare ``import unifiedamp`` stays cheap: no framework, no heavy stdlib module, few modules.

Measured with ``python -X importtime -c "import unifiedamp"``; the time itself
belongs in benchmarks, so these tests pin what makes it: the modules a bare
import loads. The heavy ones are imported where they are used (importlib.metadata
for entry points, difflib for a typo's suggestion), and the classes that were a
dataclass or a typing.NamedTuple are plain classes, tested here to behave as before.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import pickle
import textwrap

import pytest

import unifiedamp
from unifiedamp import _registry
from unifiedamp.spec import ScalerConfig, ScalerState

#: Modules a bare import must not load, with their submodules. Each one is either a
#: framework or a stdlib module that costs milliseconds of its own (importlib.metadata
#: and email: about 25 ms; dataclasses and inspect: about 15 ms; typing with re and
#: enum: about 7 ms).
HEAVY = (
    "importlib.metadata", "email", "dataclasses", "inspect", "typing", "re", "enum",
    "difflib", "ast", "dis", "tokenize", "pathlib", "zipfile", "json", "argparse",
    "subprocess", "numpy", "torch", "jax", "jaxlib", "paddle", "tensorflow", "keras",
    "mlx", "optax", "flax", "pytest",
)

#: Every module of the package a bare import loads. The spec's state-dict format,
#: vectors and document load on first use (``unifiedamp.spec.__getattr__``), the
#: backends when a scaler of theirs is built, the CLI and the conformance suite when run.
PACKAGE_MODULES = {
    "unifiedamp",
    "unifiedamp._isolation",
    "unifiedamp.errors",
    "unifiedamp._registry",
    "unifiedamp._scaler",
    "unifiedamp.spec",
    "unifiedamp.spec._config",
    "unifiedamp.spec._float32",
    "unifiedamp.spec._names",
    "unifiedamp.spec._natives",
    "unifiedamp.spec._rule",
}


def imported_by(run_python, code: str) -> dict:
    """The modules that a bare ``import unifiedamp`` adds to a fresh interpreter, then
    what ``code`` prints as JSON (run afterwards, in the same process)."""
    proc = run_python(textwrap.dedent(f"""
        import sys
        before = set(sys.modules)
        import unifiedamp
        new = sorted(set(sys.modules) - before)
        import json
        {code}
        print(json.dumps({{"new": new, "result": result}}))
    """))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_bare_import_loads_no_heavy_module(run_python):
    new = imported_by(run_python, "result = None")["new"]
    heavy = [m for m in new if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert not heavy, (
        f"import unifiedamp now loads {heavy}: import them inside the function that "
        "needs them (python -X importtime -c 'import unifiedamp' shows who pulls them in)")


def test_bare_import_loads_only_the_facade_and_the_spec_core(run_python):
    new = imported_by(run_python, "result = None")["new"]
    ours = {m for m in new if m == "unifiedamp" or m.startswith("unifiedamp.")}
    assert ours == PACKAGE_MODULES, (
        f"import unifiedamp loads {sorted(ours - PACKAGE_MODULES)} more and "
        f"{sorted(PACKAGE_MODULES - ours)} fewer than expected: keep the bare import small, "
        "or update PACKAGE_MODULES with a reason")
    # Everything else is small stdlib (collections, copy, math, numbers, struct,
    # warnings...): about 30 modules today. Importing any heavy package adds dozens.
    assert len(new) < 45, new


def test_public_entry_points_work_after_a_bare_import(run_python):
    result = imported_by(run_python, """
        from unifiedamp import spec
        scaler = unifiedamp.GradScaler(1024.0, growth_interval=3, backend="numpy")
        result = {
            "version": unifiedamp.__version__,
            "scale": scaler.get_scale(),
            "state_dict": scaler.state_dict()["format"],
            "backends": sorted(unifiedamp._registry.available()),
            "lazy_in_dir": all(n in dir(spec) for n in spec.__all__),
            "vectors": len(spec.VECTORS),
            "document": spec.spec_document()["spec_version"] == spec.SPEC_VERSION,
        }
        try:  # the suggestion imports difflib when it is needed
            unifiedamp.GradScaler(initScal=1.0, backend="numpy")
        except TypeError as exc:
            result["typo"] = str(exc)
    """)["result"]
    assert result["version"] == unifiedamp.__version__
    assert result["scale"] == 1024.0 and result["state_dict"] == "unifiedamp.GradScaler"
    assert set(_registry.BUILTIN) <= set(result["backends"])
    assert result["lazy_in_dir"] and result["vectors"] > 0 and result["document"]
    assert result["typo"] == "Unknown parameter: 'initScal' (did you mean 'initScale'?)"


def test_the_spec_loads_its_lazy_names_on_access_and_knows_no_others():
    from unifiedamp import spec

    for name in spec.__all__:
        assert getattr(spec, name) is not None
    from unifiedamp.spec import VECTORS, parse_state_dict  # noqa: F401 - the from-import path
    with pytest.raises(AttributeError, match="module 'unifiedamp.spec' has no attribute 'nope'"):
        spec.nope  # noqa: B018


# ScalerConfig was a frozen dataclass; `import dataclasses` was a third of the import.


def test_config_keeps_the_dataclass_signature_repr_and_match_args():
    sig = inspect.signature(ScalerConfig)
    assert [(p.name, p.kind.name, p.default) for p in sig.parameters.values()] == [
        ("init_scale", "POSITIONAL_OR_KEYWORD", 65536.0),
        ("growth_factor", "POSITIONAL_OR_KEYWORD", 2.0),
        ("backoff_factor", "POSITIONAL_OR_KEYWORD", 0.5),
        ("growth_interval", "POSITIONAL_OR_KEYWORD", 2000),
        ("enabled", "POSITIONAL_OR_KEYWORD", True),
        ("hysteresis", "KEYWORD_ONLY", 1),
        ("min_scale", "KEYWORD_ONLY", None),
        ("max_scale", "KEYWORD_ONLY", None),
        ("dynamic", "KEYWORD_ONLY", True),
    ]
    assert repr(ScalerConfig(8, min_scale=1)) == (
        "ScalerConfig(init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, "
        "growth_interval=2000, enabled=True, hysteresis=1, min_scale=1.0, max_scale=None, "
        "dynamic=True)")
    assert ScalerConfig.__match_args__ == ("init_scale", "growth_factor", "backoff_factor",
                                           "growth_interval", "enabled")
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        ScalerConfig(foo=1)
    with pytest.raises(TypeError, match="takes from 1 to 6 positional arguments"):
        ScalerConfig(1.0, 2.0, 0.5, 10, True, 1)


def test_config_stays_frozen_with_the_dataclass_error():
    config = ScalerConfig()
    for attempt in (lambda: setattr(config, "init_scale", 1.0),
                    lambda: setattr(config, "other", 1), lambda: delattr(config, "dynamic")):
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot (assign to|delete) "):
            attempt()
    assert config == ScalerConfig() and not hasattr(config, "other")


def test_config_compares_hashes_copies_and_pickles_like_the_dataclass():
    config = ScalerConfig(8.0, 3.0, 0.25, 10, False, hysteresis=2, max_scale=64.0)
    assert hash(config) == hash(tuple(config.to_dict().values()))
    assert config != ScalerConfig(8.0) and config.__eq__(config.to_dict()) is NotImplemented
    for clone in (copy.copy(config), copy.deepcopy(config),
                  *(pickle.loads(pickle.dumps(config, p)) for p in range(6))):
        assert clone == config and hash(clone) == hash(config) and clone is not config
        assert vars(clone) == config.to_dict()


def test_state_and_backend_rows_are_the_namedtuples_they_were():
    state = ScalerState(1024.0)
    assert state == (1024.0, 0, 0) and state._fields == (
        "scale", "growth_tracker", "hysteresis_tracker")
    assert repr(state._replace(growth_tracker=2)) == (
        "ScalerState(scale=1024.0, growth_tracker=2, hysteresis_tracker=0)")
    assert pickle.loads(pickle.dumps(state)) == state and not hasattr(state, "__dict__")
    assert type(ScalerState.initial(ScalerConfig(2.0))) is ScalerState
    row = _registry.BUILTIN["numpy"]
    assert row.name == "numpy" and row._replace(adapter="")[-1] == ""
    assert _registry.BackendInfo("x", "m:C", "m", ("m",), "pip").adapter == ""
