"""The native scalers' table: each entry is whole, and what it says it carries is what survives.

A state written in a native form and read back must give the same config and state
whenever the table says the form carries the config, and writing must refuse (naming
each parameter) whenever it says it does not: a wrong ``carries`` rule would either
drop a parameter silently or refuse a config the native holds.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unifiedamp import spec
from unifiedamp.conformance.strategies import configs
from unifiedamp.spec import CANONICAL, NATIVE_SCALERS, STATE_FORMS, ScalerConfig, ScalerState
from unifiedamp.spec._natives import QUALNAMES, REQUIRED, cannot_carry
from unifiedamp.spec._state_dict import form_cannot_carry, read_form, write_form

KEYS = {"framework", "backend", "package", "state", "aliases", "params", "versions",
        "carries", "fix", "quirks"}


@pytest.mark.parametrize("name", sorted(NATIVE_SCALERS))
def test_each_entry_is_whole(name):
    row = NATIVE_SCALERS[name]
    assert KEYS <= set(row), f"{name} lacks {sorted(KEYS - set(row))}"
    assert set(row["carries"]) == set(CANONICAL), name
    assert row["state"] is None or row["state"] in STATE_FORMS, name
    for version, entry in row["versions"].items():
        assert {"releases", "defaults", "fixed"} <= set(entry), f"{name} {version}"
        assert set(entry.get("carries", row["carries"])) == set(CANONICAL), f"{name} {version}"
        params = (*entry.get("params", row["params"]),
                  *entry.get("keyword_only", row.get("keyword_only", ())))
        # Every parameter has a default (or is marked required), and every one without a
        # canonical meaning says why.
        assert set(entry["defaults"]) <= set(params), f"{name} {version}"
        names = entry.get("names") or row["names"]
        for param in params:
            if param not in names and param != "factor":
                assert param in row.get("ignored", {}), f"{name}: {param} has no meaning"
        assert set(names.values()) <= set(CANONICAL), f"{name} {version}"
        assert all(v is REQUIRED or v is None or not isinstance(v, str) or p == "device"
                   or p == "process_group" for p, v in entry["defaults"].items())


def test_every_alias_names_one_entry():
    assert set(QUALNAMES.values()) <= set(NATIVE_SCALERS)
    aliases = [a for row in NATIVE_SCALERS.values() for a in row["aliases"]]
    assert len(aliases) == len(set(aliases))
    assert not set(aliases) & set(NATIVE_SCALERS)


@pytest.mark.parametrize("form", [f for f in STATE_FORMS if f != "canonical"])
@settings(max_examples=150, deadline=None)
@given(config=configs(), scale=st.sampled_from([1.0, 1024.0, 2.0**-20, 3.0e38]),
       growth=st.integers(0, 50), hysteresis=st.integers(0, 5))
def test_a_form_keeps_what_the_table_says_it_carries(form, config, scale, growth, hysteresis):
    state = ScalerState(scale, growth % max(config.growth_interval, 1),
                        hysteresis % max(config.hysteresis, 1))
    lost = form_cannot_carry(config, form)
    if lost:
        with pytest.raises(ValueError) as error:
            write_form(config, state, form)
        for item in lost:
            assert item in str(error.value)
        return
    written = write_form(config, state, form)
    # The Keras form holds the optimizer's variables only, Flax's DynamicScale's its two
    # pytree leaves: the config comes with them.
    given_config = config if STATE_FORMS[form]["carries"] is None or form == "flax" else None
    read_config, read_state, read_as = read_form(written, given_config)
    assert read_as == form
    assert read_state == ScalerState(spec.f32(state.scale), state.growth_tracker,
                                     state.hysteresis_tracker if form != "jmp" else 0)
    got = read_config.to_dict()
    want = config.to_dict()
    # A form's dict does not hold init_scale (torch, paddle keep it in the constructor).
    got.pop("init_scale")
    want.pop("init_scale")
    if form == "torch":  # torch writes the float32 factors its kernel multiplies by
        want["growth_factor"] = spec.f32(want["growth_factor"])
        want["backoff_factor"] = spec.f32(want["backoff_factor"])
    if form == "jmp":  # jmp's one factor: backoff is 1 / growth
        want["backoff_factor"] = 1.0 / want["growth_factor"]
    assert got == want, f"{form} changed the config: {got} != {want}"


def test_cannot_carry_reads_each_rule():
    assert cannot_carry(ScalerConfig(), "torch") == []
    assert cannot_carry(ScalerConfig(growth_factor=1.0, backoff_factor=1.0, dynamic=False),
                        "torch.amp.GradScaler") == ["growth_factor=1.0", "backoff_factor=1.0",
                                                    "dynamic=False"]
    assert cannot_carry(ScalerConfig(growth_factor=4.0), "keras") == ["growth_factor=4.0"]
    assert cannot_carry(ScalerConfig(growth_factor=4.0, backoff_factor=0.25), "jmp") == []
    assert cannot_carry(ScalerConfig(growth_factor=4.0), "jmp") == ["backoff_factor=0.5"]
    assert cannot_carry(ScalerConfig(enabled=False), "jmp") == ["enabled=False"]
    assert cannot_carry(ScalerConfig(min_scale=1.0, dynamic=False),
                        "tf_keras.mixed_precision.LossScaleOptimizer") == []
