#!/usr/bin/env bash
# Builds the Praxis / PaxML environment (docs/backends/praxis.md) in VENV (default
# .venv-praxis): the stack of constraints-praxis.txt, installed with --no-deps because the
# releases pin packages that have no wheel for this Python, then this library, also with
# --no-deps (its jax extra asks for a newer jax than Praxis 1.4.0 runs on).
# Usage: tools/praxis_env.sh [VENV]; then VENV/bin/python -m pytest tests/praxis
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-praxis}"
python="${PYTHON:-python3}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --no-deps -r constraints-praxis.txt
"$venv/bin/python" -m pip install --quiet --no-deps -e .
"$venv/bin/python" -c "import praxis.optimizers, paxml.learners, paxml.tasks_lib"
