"""Collection imports every module of the package for its doctests, in path order:
``backends/keras/`` (which imports tensorflow) comes before ``backends/paddle/``, and
importing paddle 3.3.1 after tensorflow 2.21 segfaults. Importing paddle first, when both
are installed and tensorflow is not imported yet, makes every later order safe. (A run that
has imported tensorflow already, e.g. the conformance plugin driving the keras backend,
leaves paddle alone: ``unifiedamp._isolation`` refuses to load it there.)"""

from __future__ import annotations

import importlib.util
import os
import sys

# Between parallel regions the idle threads of an OpenMP runtime (torch's libgomp, the Intel
# runtime paddle loads) spin for a while before they sleep: with a worker per core,
# and the processes the tests start, those spins take the cores the others need. Passive
# waiting changes no thread count and no result. Set before paddle or torch is loaded (the
# runtimes read it when they load), here and in every process started from here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if ("tensorflow" not in sys.modules and importlib.util.find_spec("paddle") is not None
        and importlib.util.find_spec("tensorflow") is not None):
    import paddle  # noqa: F401

# Praxis and PaxML run in their own environment (tools/praxis_env.sh): elsewhere their modules
# and example cannot be imported for doctest collection (tests/test_praxis.py says it skips).
collect_ignore = [] if importlib.util.find_spec("paxml") is not None else [
    "src/unifiedamp/backends/jax/praxis.py", "src/unifiedamp/backends/jax/paxml.py"]
