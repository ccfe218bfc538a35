"""What the spec assumes of the frameworks' tables, with no framework imported (the checks
against each installed framework: ``test_framework_assumptions.py`` in tests/torch,
tests/paddle, tests/keras and tests/jax)."""

from __future__ import annotations

from unifiedamp import spec


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
