"""The snippets of the zoo's torch columns (torch.amp.GradScaler and FSDP's
ShardedGradScaler) run with torch alone and show the causes the zoo's page explains."""

from __future__ import annotations

import importlib.util

import pytest

from unifiedamp.conformance.zoo import ZOO


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason=ZOO["torch"].install)
def test_torch_snippets_show_their_causes() -> None:
    import torch.distributed as dist
    from zoo_snippets import run_snippets

    lines = run_snippets(["torch", "torch-sharded"])
    assert sorted(lines) == [
        "a_disabled_scaler_reports_a_scale_of_1.py", "a_disabled_scaler_saves_no_state.py",
        "grows_only_when_the_tracker_equals_the_interval.py", "growth_overflows_to_inf.py",
        "multiplies_by_a_float64_factor.py", "reports_a_scale_that_is_no_float32_value.py",
        "takes_a_finite_step_whose_reciprocal_overflows.py"]
    assert all("GradScaler" in line or "2**-130" in line for line in lines.values()), lines
    # The snippets that drive ShardedGradScaler start a one-process group: none may be left
    # for the rest of the session (torch's backend all-reduces whenever a group exists).
    assert not dist.is_initialized()
