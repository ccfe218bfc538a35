"""``unifiedamp port`` on torch: the rewritten source runs with the real torch, builds the
same scaler (or one whose differences its problems name), and keeps torch's CUDA semantics
visible in a note. The framework-free checks of the rewriter: tests/core/test_port_source.py;
sources of other frameworks ported to torch: tests/cross and tests/keras."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("libcst")

import port_sources  # noqa: E402
from port_sources import LATE_IMPORT  # noqa: E402

from unifiedamp.porting import port_source  # noqa: E402

PAIRS = port_sources.pairs("torch")


@pytest.fixture(scope="module")
def built_by_target():
    """Each rewritten source of this session run once, in this process."""
    return port_sources.build_pairs(PAIRS)


@pytest.mark.parametrize("to", PAIRS)
def test_the_rewritten_source_builds_the_same_scaler_in_the_real_framework(to, built_by_target):
    port_sources.check_built(to, PAIRS[to], built_by_target[to])


def test_the_ported_script_with_a_late_import_runs():
    namespace: dict = {}
    exec(compile(port_source(LATE_IMPORT.replace("import paddle as pd\n", ""), "unifiedamp").code,
                 "train.py", "exec"), namespace)
    assert namespace["scaler"].get_scale() == 1024.0 and namespace["scaler"].backend == "torch"


@pytest.mark.skipif(torch.cuda.is_available(), reason="measures a CPU-only machine")
def test_torch_cuda_amp_to_unifiedamp_notes_that_it_then_scales_without_cuda():
    src = "import torch\nscaler = torch.cuda.amp.GradScaler(enabled=True)\n"
    result = port_source(src, "unifiedamp")
    note = next(n for n in result.sites[0].notes if "CUDA is not available" in n)
    assert "enabled=torch.cuda.is_available()" in note
    with pytest.warns(UserWarning):
        assert not torch.cuda.amp.GradScaler(enabled=True).is_enabled()  # the original: off
    namespace: dict = {}
    exec(result.code, namespace)
    assert namespace["scaler"].is_enabled()  # the port: on, as the note says
    kept = result.code.replace("enabled=True", "enabled=torch.cuda.is_available()")
    exec(kept, namespace)
    assert not namespace["scaler"].is_enabled()  # the note's fix keeps the original's
    plain = port_source("import torch\ns = torch.amp.GradScaler()\n", "unifiedamp")
    assert any("enabled=torch.cuda.is_available()" in n for n in plain.sites[0].notes)
    for enabled, keep in (("(dtype == 'float16')", "enabled=(dtype == 'float16') and torch"),
                          ("a or b", "enabled=(a or b) and torch"), ("False", None)):
        notes = port_source(f"import torch\ns = torch.cuda.amp.GradScaler(enabled={enabled})\n",
                            "unifiedamp").sites[0].notes
        cuda = [n for n in notes if "CUDA is not available" in n]
        assert (keep in cuda[0]) if keep else cuda == [], (enabled, cuda)
