"""``unifiedamp port`` on paddle: each paddle source ported to paddle or to unifiedamp runs with
the real paddle and builds the same scaler, or one whose differences its problems name; what
port flags around paddle (shard_scaler, static-graph AMP) is checked against the real paddle.
The framework-free checks of the rewriter: tests/core/test_port_source.py."""

from __future__ import annotations

import pytest

pytest.importorskip("paddle")
pytest.importorskip("libcst")

import port_sources  # noqa: E402

from unifiedamp.porting import port_source  # noqa: E402

PAIRS = port_sources.pairs("paddle")


@pytest.fixture(scope="module")
def built_by_target():
    """Each rewritten source of this session run once, in this process."""
    return port_sources.build_pairs(PAIRS)


@pytest.mark.parametrize("to", PAIRS)
def test_the_rewritten_source_builds_the_same_scaler_in_the_real_framework(to, built_by_target):
    port_sources.check_built(to, PAIRS[to], built_by_target[to])


def test_shard_scaler_patches_a_method_the_ported_scaler_never_calls():
    """Why port flags ``dist.shard_scaler(scaler)`` around a scaler ported to unifiedamp:
    with the real paddle, the rewritten source's scaler gets auto-parallel's ``_unscale``
    (which fails outside auto-parallel when called), and a whole scale/step/update runs
    without calling it: the patch is dead code on unifiedamp's scaler."""
    import paddle

    code, _ = port_sources.FLAGGED["shard_scaler"]
    result = port_source(code, "unifiedamp")
    assert "dist.shard_scaler(scaler)" in result.code and not result.ok
    namespace: dict = {}
    exec(result.code, namespace)
    scaler = namespace["scaler"]
    assert type(scaler).__name__ == "PaddleGradScaler"
    assert scaler._unscale.__func__.__qualname__ == "shard_scaler.<locals>.unscale_method"
    model = paddle.nn.Linear(3, 1)
    opt = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    scaler.scale(model(paddle.ones([2, 3])).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1024.0 and scaler.num_steps == 1
    scaler.scale(model(paddle.ones([2, 3])).sum()).backward()
    with pytest.raises(TypeError):  # what calling the patch would have done here
        scaler._unscale(opt)


def test_static_decorate_and_grad_scaler_take_the_keywords_the_problem_names():
    """The static-AMP problem tells the user to pass decorate's loss-scaling keywords to
    paddle.amp.GradScaler as they are: both of the installed paddle's signatures take them."""
    import ast
    import inspect

    import paddle

    from unifiedamp.porting._source_flagged import _STATIC_SCALING

    # decorate is overloaded (a float16-only and a general form): read each definition.
    tree = ast.parse(inspect.getsource(inspect.getmodule(paddle.static.amp.decorator)))
    forms = [{a.arg for a in node.args.args} for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef) and node.name == "decorate"]
    scaler = inspect.signature(paddle.amp.GradScaler).parameters
    assert len(forms) == 2 and all(set(_STATIC_SCALING) <= form for form in forms)
    assert set(_STATIC_SCALING) <= set(scaler)
