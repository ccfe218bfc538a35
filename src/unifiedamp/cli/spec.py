"""``unifiedamp spec``: the specification, as Markdown or as its JSON document."""

from __future__ import annotations

import argparse
import json
from typing import Any

from unifiedamp import spec


def _cmd_spec(args: argparse.Namespace) -> int:
    doc = spec.spec_document()
    print(json.dumps(doc, indent=2) if args.format == "json" else spec.spec_markdown(doc))
    return 0


def add_parser(sub: Any) -> None:
    """Adds ``unifiedamp spec [--format json|markdown]``."""
    p = sub.add_parser(
        "spec", help="print the specification",
        description="Prints the loss-scaling specification every backend follows: the config "
                    "parameters with their defaults and valid values, each framework's names "
                    "and defaults for them, what found_inf and state_dict hold, and the test "
                    "vectors.")
    p.add_argument("--format", choices=["json", "markdown"], default="markdown",
                   help="markdown (default): tables to read; json: the spec document, "
                        "for programs (its schema: docs/spec-schema.md)")
    p.set_defaults(func=_cmd_spec)
