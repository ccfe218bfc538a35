"""The snippets of the zoo's Keras columns run with Keras alone, on the session's backend, and
show the causes the zoo's page explains for that backend's column.

The three columns share one snippet folder (``docs/snippets/zoo/keras-tensorflow``); an
explanation that holds on some backends only names its columns, so the snippets are chosen
by the column's explanations, not by folder.
"""

from __future__ import annotations

from zoo_snippets import SNIPPETS, linked, run_one

COLUMNS = ["keras-tensorflow", "keras-jax", "keras-torch"]


def run_column(column: str) -> dict[str, str]:
    """Runs the snippets ``column``'s explanations link to; snippet file name -> its line."""
    return {path.name: run_one(path) for path in sorted(linked([column]))}


def test_keras_snippets_show_their_causes_on_this_backend(keras) -> None:
    backend = keras.backend.backend()
    shared = {p.name for p in (SNIPPETS / "keras-tensorflow").glob("*.py")}
    assert shared == {p.name for p in linked(COLUMNS)}, "a snippet no explanation links to"
    lines = run_column(f"keras-{backend}")
    expected = {"growth_overflows_to_inf.py", "grows_only_when_the_tracker_equals_the_interval.py",
                "takes_a_finite_step_whose_reciprocal_overflows.py"}
    if backend != "torch":  # torch keeps subnormal float32 values
        expected.add("flushes_subnormals_to_zero.py")
    assert set(lines) == expected
    assert all(line.startswith(f"keras LossScaleOptimizer ({backend})") and "spec" in line
               for line in lines.values()), lines
