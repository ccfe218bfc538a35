"""The whole specification as one document: JSON and Markdown (``unifiedamp spec``)."""

from __future__ import annotations

from typing import Any

from unifiedamp.spec._config import CANONICAL, POSITIONAL, RULES, ScalerConfig
from unifiedamp.spec._natives import ALIASES, FRAMEWORKS
from unifiedamp.spec._rule import MIN_UNSCALABLE
from unifiedamp.spec._state_dict import STATE_FORMAT, STATE_KEYS, STATE_VERSION
from unifiedamp.spec._vectors import VECTORS

__all__ = ["SCHEMA_VERSION", "SPEC_VERSION", "spec_document", "spec_markdown"]

# 2: an unscale check also finds inf where 1/scale overflows float32, and a state
# dict's scale may be 0 (both reachable by the rule; version 1 refused or missed them).
SPEC_VERSION = 2
# The layout of spec_document() (docs/spec-schema.md); bumped only when a key
# changes meaning or disappears.
SCHEMA_VERSION = 1


def spec_document() -> dict[str, Any]:
    """The whole specification as one JSON-serialisable dict (``unifiedamp spec``).

    Example:
        >>> doc = spec_document()
        >>> doc["parameters"][0]["name"], doc["parameters"][0]["default"]
        ('init_scale', 65536.0)
    """
    defaults = ScalerConfig().to_dict()
    aliases: dict[str, list[str]] = {name: [] for name in CANONICAL}
    for alias, name in ALIASES.items():
        aliases[name].append(alias)
    return {
        "schema": "unifiedamp.spec",
        "schema_version": SCHEMA_VERSION,
        "spec_version": SPEC_VERSION,
        "state_format": {"format": STATE_FORMAT, "version": STATE_VERSION,
                         "keys": list(STATE_KEYS)},
        "parameters": [
            {"name": name, "default": defaults[name], "positional": name in POSITIONAL,
             "valid": RULES[name], "aliases": aliases[name]}
            for name in CANONICAL
        ],
        "found_inf": {
            "rule": "true if any gradient checked since the last update is inf or NaN (checked "
                    "as backpropagated from the scaled loss, before unscaling), or if f32(1 / "
                    "scale) is inf: a scale of 0 or below min_unscalable_scale",
            "min_unscalable_scale": MIN_UNSCALABLE,
        },
        "frameworks": FRAMEWORKS,
        "vectors": [v.to_dict() for v in VECTORS],
    }


def spec_markdown(doc: dict[str, Any]) -> str:
    """Renders :func:`spec_document` as Markdown tables (``unifiedamp spec``).

    Example:
        >>> print(spec_markdown(spec_document()).splitlines()[0])
        # unifiedamp loss-scaling spec, version 2
    """
    out = [f"# unifiedamp loss-scaling spec, version {doc['spec_version']}", "",
           "## Parameters", "",
           "| name | default | positional | valid values | aliases |",
           "|---|---|---|---|---|"]
    for p in doc["parameters"]:
        aliases = ", ".join(f"`{a}`" for a in p["aliases"]) or "-"
        out.append(f"| `{p['name']}` | `{p['default']!r}` | {'yes' if p['positional'] else 'no'} "
                   f"| {p['valid']} | {aliases} |")
    frameworks = doc["frameworks"]
    out += ["", "## Per-framework names (name / default / expressible natively)", "",
            "| canonical | " + " | ".join(f"{fw} (`{v['api']}`)" for fw, v in frameworks.items())
            + " |", "|---" * (len(frameworks) + 1) + "|"]
    for p in doc["parameters"]:
        cells = []
        for fw in frameworks.values():
            name = fw["names"].get(p["name"])
            default = fw["defaults"].get(p["name"], "-")
            cells.append(f"{'`' + name + '`' if name else '-'} / {default} / "
                         f"{fw['native'][p['name']]}")
        out.append(f"| `{p['name']}` | " + " | ".join(cells) + " |")
    found = doc["found_inf"]
    out += ["", "## found_inf", "",
            f"{found['rule']}; min_unscalable_scale = {found['min_unscalable_scale']!r}."]
    state = doc["state_format"]
    out += ["", "## state_dict", "",
            f"format `{state['format']}`, version {state['version']}, keys: "
            + ", ".join(f"`{k}`" for k in state["keys"]), "",
            "## Test vectors", "", "| name | config | steps | scales |", "|---|---|---|---|"]
    for v in doc["vectors"]:
        changes = f" changes {v['changes']}" if v["changes"] else ""
        out.append(f"| {v['name']} | `{v['config']}`{changes} | `{v['steps']}` | "
                   + " ".join(f"{s:g}" for s in v["scales"]) + " |")
    return "\n".join(out)
