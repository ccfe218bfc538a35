"""The snippets of the zoo's DeepSpeed, Megatron-core and Colossal-AI columns run, each
showing its cause with the native scaler alone (``docs/snippets/zoo/<column>/``).

The two DeepSpeed columns run together: their shared causes have one snippet, in
``deepspeed/``.
"""

from __future__ import annotations

import importlib.util

import pytest

from unifiedamp.conformance.zoo import ZOO

GROUPS = {
    "deepspeed": (["deepspeed", "deepspeed-consecutive"], "deepspeed "),
    "megatron.core": (["megatron"], "megatron "),
    "colossalai": (["colossalai"], "colossalai "),
}


@pytest.mark.parametrize("framework", sorted(GROUPS))
def test_snippets_show_their_causes_with_the_native_scaler(framework: str) -> None:
    columns, prefix = GROUPS[framework]
    if importlib.util.find_spec(framework.partition(".")[0]) is None:
        pytest.skip(f"needs {framework}: {ZOO[columns[0]].install}")
    import torch.distributed as dist
    from zoo_snippets import run_snippets

    if framework == "deepspeed":
        # DeepSpeed's logger writes to the stdout it found at import, and names its
        # accelerator on first use: both happen here, not inside a snippet's captured output.
        from deepspeed.accelerator import get_accelerator

        get_accelerator()
    lines = run_snippets(columns)
    assert lines, columns
    assert all(line.startswith(prefix) for line in lines.values()), lines
    # Every snippet that opens a process group ends it: the torch backend's tests in this
    # process all-reduce whenever one exists.
    assert not dist.is_initialized()
