"""The torch backend beyond one eager CPU loop: devices it cannot use, ranks of a gloo group
(each a process), torch.compile, and CUDA (skipped without a CUDA device): fused steps that
never wait for the device, the tensor-op rule replayed as a CUDA graph, and a whole training
step captured as one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import CUDA, batch, loss_of, mlp  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.conformance.adapters.torch import run_ranks  # noqa: E402

# ---------------------------------------------------------------- devices


@pytest.mark.parametrize("device,message", [
    ("banana", r"device='banana' is not a device torch can use here \(not a device type "
               r"torch knows\): pass 'cpu'"),
    (42, r"device=42 is not a device torch can use here \(an int is an index of the current "
         r"accelerator"),
    (3.5, r"device=3.5 \(float\): pass a string"),
])
def test_a_device_torch_cannot_use_is_named_with_the_fix(device, message):
    if device == 42 and torch.accelerator.is_available():
        pytest.skip("an accelerator is here: device=42 is an index torch may accept")
    with pytest.raises((ValueError, TypeError), match=message):
        ua.GradScaler(backend="torch", device=device)


# ---------------------------------------------------------------- ranks of a gloo group


def test_inf_on_rank_1_only_makes_both_ranks_skip_and_agree():
    results = run_ranks({"init_scale": 1024.0, "growth_interval": 2}, ["F", "I"],
                        iterations=1)
    assert [r["stepped"] for r in results] == [False, False]
    assert [r["skipped"] for r in results] == [1, 1]
    assert [r["state"] for r in results] == [[512.0, 0, 0], [512.0, 0, 0]]


def test_ranks_agree_with_hysteresis_on_the_tensor_path():
    results = run_ranks({"init_scale": 1024.0, "hysteresis": 2, "min_scale": 1.0},
                        ["I", "F"], iterations=2)
    assert [r["state"] for r in results] == [[512.0, 0, 0], [512.0, 0, 0]]
    assert [r["stepped"] for r in results] == [False, False]


# ---------------------------------------------------------------- torch.compile


def test_compiled_model_gives_the_eager_trajectory():
    def run(compiled):
        model = mlp()
        forward = torch.compile(model) if compiled else model
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        scaler = ua.GradScaler(1024.0, growth_interval=2, hysteresis=2, backend="torch")
        for step in range(6):
            poison = float("inf") if step in (2, 3) else None
            scaler.scale(loss_of(forward, *batch(seed=step, poison=poison))).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        return scaler.state, [p.detach() for p in model.parameters()]

    (s1, p1), (s2, p2) = run(False), run(True)
    assert s1 == s2
    assert all(torch.allclose(a, b) for a, b in zip(p1, p2, strict=True))


def test_scale_traces_into_a_full_graph():
    model = mlp()
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(torch.ones(()))  # the scale tensor exists before tracing

    @torch.compile(fullgraph=True)
    def scaled_loss(x, y):
        return scaler.scale(loss_of(model, x, y))

    x, y = batch()
    assert torch.allclose(scaled_loss(x, y), loss_of(model, x, y) * 1024)


@pytest.mark.parametrize("config", [{}, {"hysteresis": 2, "min_scale": 1.0}],
                         ids=["torch-expressible", "extended"])
def test_scale_and_update_trace_into_full_graphs_with_the_eager_trajectory(config):
    """scale() and update() under torch.compile(fullgraph=True) (a graph break raises),
    with a fused optimizer's step between them: the same states as eager, skips included.
    (step() and unscale_() run eager, as torch.amp.GradScaler's do: dynamo does not trace
    torch's, and this scaler's follow them.)"""
    def run(compiled):
        model = mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch", device="cpu",
                               **config)

        def scaled_loss(x, y):
            return scaler.scale(loss_of(model, x, y))

        def update():
            scaler.update()

        if compiled:
            scaled_loss = torch.compile(scaled_loss, fullgraph=True)
            update = torch.compile(update, fullgraph=True)
        states = []
        for step in range(8):
            poison = float("inf") if step in (3, 4) else None
            scaled_loss(*batch(seed=step, poison=poison)).backward()
            scaler.step(opt)
            update()
            opt.zero_grad()
            states.append(scaler.state)
        return states, scaler.num_skipped_steps

    eager, compiled = run(False), run(True)
    assert compiled == eager and eager[1] == 2


# ---------------------------------------------------------------- CUDA


@CUDA
def test_cuda_fused_step_never_waits_for_the_device():
    model = mlp("cuda")
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = ua.GradScaler(1024.0, backend="torch", hysteresis=2, min_scale=1.0)
    x, y = batch("cuda")
    loss_of(model, x, y).backward()
    opt.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            opt.zero_grad()
            scaler.scale(loss_of(model, x, y)).backward()
            scaler.step(opt)
            scaler.update()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert scaler.get_scale() == 1024.0 and scaler.num_skipped_steps == 0


@CUDA
def test_cuda_scale_lives_on_the_parameters_device():
    model = mlp("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ua.GradScaler(backend="torch")
    scaler.scale(loss_of(model, *batch("cuda"))).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler._scale.device.type == "cuda" and scaler.state.scale == 65536.0


@CUDA
@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_cuda_tensor_op_rule_runs_as_a_replayed_graph_and_follows_the_spec(fused):
    """On CUDA the rule torch's kernel cannot run is compiled and replayed as a CUDA graph;
    it must give the spec's states step by step, across overflows and a config change."""
    model = mlp("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    scaler = ua.GradScaler(1024.0, growth_interval=2, hysteresis=2, min_scale=256.0,
                           backend="torch", device="cuda")
    expected = scaler.state
    for step in range(16):
        if step == 10:
            scaler.set_growth_factor(3.0)  # a new config: captured again
        poisoned = step in (3, 4, 7, 12, 13)
        scaler.scale(loss_of(model, *batch("cuda", seed=step,
                                           poison=float("inf") if poisoned else None))).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        expected = spec.update(scaler.config, expected, poisoned)
        assert scaler.state == expected, f"step {step}: {scaler.state} != {expected}"
    assert scaler._rule_graph is not None


def captured_training_step(model, opt, scaler, x, y):
    """The recipe of docs/backends/torch.md: one whole float16 step, captured as one
    CUDA graph after a warm-up on a side stream; returns the graph."""
    def step():
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            loss = loss_of(model, x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    return graph


@CUDA
@pytest.mark.parametrize("config", [{}, {"hysteresis": 2, "min_scale": 1.0}],
                         ids=["torch-expressible", "hysteresis-2"])
def test_cuda_graph_replays_follow_the_spec_across_overflows(config):
    model = mlp("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
    scaler = ua.GradScaler(1024.0, growth_interval=2, backend="torch", device="cuda",
                           **config)
    x, y = (t.clone() for t in batch("cuda"))
    graph = captured_training_step(model, opt, scaler, x, y)
    expected = scaler.state
    for step in range(12):
        poisoned = step in (4, 5, 9)
        x.copy_(batch("cuda", seed=step, poison=float("inf") if poisoned else None)[0])
        graph.replay()
        expected = spec.update(scaler.config, expected, poisoned)
        assert scaler.state == expected, f"replay {step}: {scaler.state} != {expected}"
    assert all(torch.isfinite(p).all() for p in model.parameters())
