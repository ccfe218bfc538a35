"""Porting between frameworks (``unifiedamp.porting``): native constructor calls -> config,
config -> native keyword arguments, and live native scalers -> unifiedamp scalers with their
state.

Every trajectory check builds the real native object and drives it over a forced-overflow
sequence (torch and paddle with a real optimizer, Keras with a real ``apply``, jmp with its
``adjust``), then compares it with the spec's trajectory for the config ``config_from_call``
read from the same call. Frameworks are imported inside tests only (paddle before tensorflow:
see tests/conftest.py); FSDP's ShardedGradScaler needs a process group, so it runs in a child.
"""

from __future__ import annotations

import json
import pathlib
import textwrap
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from unifiedamp import spec
from unifiedamp.porting import NATIVE_SCALERS, config_from_call, from_native, native_call
from unifiedamp.spec import ScalerConfig, ScalerState

KINDS = "FFFIFFFFIIFFFFFIFF"  # F: finite gradients, I: an inf in them


def reference(config: ScalerConfig, kinds: str, start: ScalerState | None = None) -> list[str]:
    """The spec's scale after each update, as float32 hex."""
    state = start or ScalerState.initial(config)
    out = []
    for kind in kinds:
        state = spec.update(config, state, kind == "I")
        out.append(spec.f32_hex(state.scale))
    return out


def hexes(scales) -> list[str]:
    return [spec.f32_hex(float(s)) for s in scales]


# ================================================================ no framework


def test_every_row_maps_each_canonical_parameter_once():
    # A canonical parameter neither mapped nor fixed would silently take the spec default.
    for name, row in NATIVE_SCALERS.items():
        for key, version in row["versions"].items():
            merged = {**row, **version}
            mapped = set(merged["names"].values())
            if "factor" in merged["params"]:
                mapped |= {"growth_factor", "backoff_factor"}
            fixed = set(merged["fixed"])
            assert not mapped & fixed, (name, key, mapped & fixed)
            missing = set(spec.CANONICAL) - mapped - fixed
            if name != "jmp.StaticLossScale":  # static: the growth parameters never act
                assert not missing, (name, key, missing)


@pytest.mark.parametrize(("version", "expected"), [
    ("2.6", (32768.0, 1000, 2)), ("3.3.1", (65536.0, 2000, 1)), (3, (65536.0, 2000, 1))])
def test_paddle_defaults_follow_the_version(version, expected):
    config, notes = config_from_call("paddle.amp.GradScaler", (), {}, version=version)
    assert (config.init_scale, config.growth_interval, config.hysteresis) == expected
    assert f"default: decr_every_n_nan_or_inf={expected[2]} (hysteresis={expected[2]})" in notes


def test_torch_to_paddle_writes_decr_every_n_nan_or_inf_1():
    # paddle 2.x's GradScaler default is 2: a port relying on the default would skip backoffs.
    config, _ = config_from_call("torch.amp.GradScaler", ("cuda",), {"init_scale": 1024.0})
    kwargs, problems = native_call(config, "paddle")
    assert kwargs == {"enable": True, "init_loss_scaling": 1024.0, "incr_ratio": 2.0,
                      "decr_ratio": 0.5, "incr_every_n_steps": 2000,
                      "decr_every_n_nan_or_inf": 1, "use_dynamic_loss_scaling": True}
    assert problems == []
    assert config_from_call("paddle.amp.GradScaler", (), kwargs, version="2")[0] == config


def test_keras_to_torch_carries_32768():
    config, notes = config_from_call("keras.optimizers.LossScaleOptimizer", ("inner",), {})
    kwargs, problems = native_call(config, "torch")
    assert kwargs["init_scale"] == 32768.0 and problems == []
    assert any(n.startswith("inner_optimizer='inner': no canonical meaning") for n in notes)


def test_torch_growth_3_to_keras_needs_the_wrapper():
    config, _ = config_from_call("torch.amp.GradScaler", ("cuda", 1024.0, 3.0))
    kwargs, problems = native_call(config, "keras")
    assert kwargs == {"initial_scale": 1024.0, "dynamic_growth_steps": 2000}
    assert problems == ["keras.optimizers.LossScaleOptimizer cannot express growth_factor=3.0 "
                        "(it hard-codes 2.0): needs unifiedamp's wrapper: "
                        "ua.GradScaler(..., backend='keras').wrap(opt)"]


def test_torch_cannot_express_hysteresis_or_min_scale_and_says_so():
    _, problems = native_call(ScalerConfig(hysteresis=2, min_scale=1.0), "torch")
    assert len(problems) == 2
    assert "hysteresis=2" in problems[0] and "min_scale=1.0" in problems[1]
    assert all("backend='torch'" in p for p in problems)
    _, problems = native_call(ScalerConfig(growth_factor=1.0), "torch")
    assert problems and "growth_factor > 1.0" in problems[0]


def test_jmp_without_min_scale_gets_a_floor_of_one_and_says_so():
    kwargs, problems = native_call(ScalerConfig(1024.0), "jmp")
    assert kwargs == {"loss_scale": 1024.0, "period": 2000, "factor": 2.0, "min_loss_scale": 1.0}
    assert len(problems) == 1 and "floor of 1" in problems[0]
    _, problems = native_call(ScalerConfig(1024.0, min_scale=1.0), "jmp")
    assert problems == []
    _, problems = native_call(ScalerConfig(1024.0, 2.0, 0.25, min_scale=1.0), "jmp")
    assert "one factor" in problems[0]


def test_jmp_factor_is_growth_and_its_reciprocal():
    config, notes = config_from_call("jmp.DynamicLossScale", (1024.0,),
                                     {"period": 10, "factor": 4, "min_loss_scale": 0.0})
    assert config == ScalerConfig(1024.0, 4.0, 0.25, 10)  # min_loss_scale 0: no floor
    assert not any(n.startswith("default") for n in notes)


def test_static_configs_port_to_static_classes():
    config, _ = config_from_call("paddle.amp.GradScaler", (),
                                 {"init_loss_scaling": 128.0, "use_dynamic_loss_scaling": False})
    assert not config.dynamic
    assert native_call(config, "jmp.StaticLossScale") == ({"loss_scale": 128.0}, [])
    _, problems = native_call(config, "jmp")
    assert "jmp.StaticLossScale" in problems[0]
    _, problems = native_call(config, "keras")
    assert problems and "dynamic=False" in problems[0]


def test_bad_calls_fail_as_the_native_would():
    with pytest.raises(TypeError, match="unexpected keyword argument 'init_scal'"):
        config_from_call("torch.amp.GradScaler", (), {"init_scal": 1.0})
    with pytest.raises(TypeError, match="multiple values for argument 'init_scale'"):
        config_from_call("torch.amp.GradScaler", ("cpu", 1.0), {"init_scale": 1.0})
    with pytest.raises(TypeError, match="missing required argument: 'loss_scale'"):
        config_from_call("jmp.DynamicLossScale")
    with pytest.raises(ValueError, match="unknown scaler"):
        native_call(ScalerConfig(), "mxnet")
    with pytest.raises(TypeError, match="from_native takes a torch.amp.GradScaler"):
        from_native(object())


def test_unifiedamp_target_writes_the_whole_config():
    config = ScalerConfig(8.0, hysteresis=3, max_scale=1e6)
    kwargs, problems = native_call(config, "unifiedamp")
    assert ScalerConfig(**kwargs) == config and problems == []


def test_the_table_holds_the_installed_signatures(run_python):
    # Positional order and defaults as inspect reads them from the installed frameworks,
    # each in its own interpreter (paddle and tensorflow cannot share every order).
    programs = {
        "torch": "import torch; from torch.distributed.fsdp.sharded_grad_scaler import "
                 "ShardedGradScaler as S; classes = {'torch.amp.GradScaler': "
                 "torch.amp.GradScaler, 'torch.cuda.amp.GradScaler': torch.cuda.amp.GradScaler,"
                 " 'torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler': S}",
        "paddle": "import paddle; classes = {'paddle.amp.GradScaler': paddle.amp.GradScaler, "
                  "'paddle.amp.AmpScaler': paddle.amp.AmpScaler}",
        "keras": "import keras; classes = {'keras.optimizers.LossScaleOptimizer': "
                 "keras.optimizers.LossScaleOptimizer}",
    }
    body = textwrap.dedent("""
        import inspect, json
        out = {}
        for name, cls in classes.items():
            ps = [p for p in inspect.signature(cls.__init__).parameters.values()
                  if p.name != 'self' and p.kind is p.POSITIONAL_OR_KEYWORD]
            out[name] = [[p.name, None if p.default is p.empty or not isinstance(
                p.default, (int, float, str, bool)) else p.default] for p in ps]
        print(json.dumps(out))
    """)
    checked = 0
    for module, program in programs.items():
        pytest.importorskip(module)
        proc = run_python(program + "\n" + body)
        assert proc.returncode == 0, proc.stderr[-2000:]
        for name, params in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            row = NATIVE_SCALERS[name]
            latest = row["versions"][max(row["versions"], key=int)]
            assert tuple(p for p, _ in params) == latest.get("params", row["params"]), name
            for param, default in params:
                if default is not None and param != "process_group":
                    assert latest["defaults"][param] == default, (name, param)
            checked += 1
    assert checked == 6


# ================================================================ torch


def torch_run(native, kinds: str, model=None, opt=None):
    import torch

    if model is None:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scales = []
    for kind in kinds:
        x = torch.ones(2, 4)
        if kind == "I":
            x[0, 0] = float("inf")
        native.scale(model(x).sum()).backward()
        native.step(opt)
        native.update()
        opt.zero_grad()
        scales.append(native.get_scale())
    return scales, model, opt


TORCH_CALLS = [
    (("cpu", 1024.0, 3.0, 0.25, 3), {}),
    (("cpu",), {"init_scale": 512.0, "growth_interval": 2}),
    ((), {"device": "cpu", "growth_interval": 4, "backoff_factor": 0.125, "init_scale": 4096.0}),
]


@pytest.mark.framework("torch")
@pytest.mark.parametrize(("args", "kwargs"), TORCH_CALLS)
def test_torch_call_config_follows_torchs_own_trajectory(args, kwargs):
    import torch

    config, notes = config_from_call("torch.amp.GradScaler", args, kwargs)
    assert "device='cpu'" in notes[0]
    scales, _, _ = torch_run(torch.amp.GradScaler(*args, **kwargs), KINDS)
    assert hexes(scales) == reference(config, KINDS)


@pytest.mark.framework("torch")
def test_torch_cuda_amp_defaults_and_no_device():
    config, notes = config_from_call("torch.cuda.amp.GradScaler", (1024.0, 3.0), {})
    assert config == ScalerConfig(1024.0, 3.0)
    assert not any("device" in n for n in notes)


SHARDED = """
import json, os, sys
sys.path.insert(0, {tests!r})
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from test_port import torch_run
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("gloo", rank=0, world_size=1)
args, kinds = json.loads({payload!r})
native = ShardedGradScaler(*args)
scales, _, _ = torch_run(native, kinds)
print(json.dumps([native._backoff_factor, native._growth_factor, scales]))
dist.destroy_process_group()
"""


@pytest.mark.framework("torch")
def test_sharded_grad_scaler_takes_backoff_before_growth(run_python):
    pytest.importorskip("torch")
    args = ["cpu", 1024.0, 0.25, 3.0, 3]  # backoff 0.25, growth 3.0 in FSDP's order
    config, _ = config_from_call("torch.distributed.fsdp.ShardedGradScaler", tuple(args))
    assert (config.backoff_factor, config.growth_factor) == (0.25, 3.0)
    proc = run_python(SHARDED.format(tests=str(pathlib.Path(__file__).parent),
                                     payload=json.dumps([args, KINDS])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    backoff, growth, scales = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (backoff, growth) == (0.25, 3.0)
    assert hexes(scales) == reference(config, KINDS)


@pytest.mark.framework("torch")
@pytest.mark.parametrize("config", [ScalerConfig(1024.0, 3.0, 0.25, 3), ScalerConfig(),
                                    ScalerConfig(8.0, enabled=False)])
def test_torch_native_call_round_trips_through_a_real_scaler(config):
    import torch

    kwargs, problems = native_call(config, "torch")
    assert problems == []
    back = from_native(torch.amp.GradScaler("cpu", **kwargs))
    assert back.backend == "torch"
    assert back.config == (config if config.enabled else ScalerConfig(enabled=False))


@pytest.mark.framework("torch")
def test_torch_native_call_rounds_the_factors_so_torchs_kernel_follows_the_spec():
    # torch multiplies by the float64 factor it is given: 1.1 and 0.3 unrounded make every
    # growth and backoff drift from the spec's float32 product.
    import torch

    config = ScalerConfig(1024.0, 1.1, 0.3, 1)
    kwargs, problems = native_call(config, "torch")
    assert problems == []
    assert (kwargs["growth_factor"], kwargs["backoff_factor"]) == (spec.f32(1.1), spec.f32(0.3))
    scales, _, _ = torch_run(torch.amp.GradScaler("cpu", **kwargs), KINDS)
    assert hexes(scales) == reference(config, KINDS)


@pytest.mark.framework("torch")
def test_torch_from_native_keeps_state_mid_run():
    import torch

    native = torch.amp.GradScaler("cpu", 1024.0, 2.0, 0.5, 3)
    _, model, opt = torch_run(native, "FFIFF")  # mid-interval: growth tracker 2
    ours = from_native(native)
    assert ours.state == ScalerState(512.0, 2, 0)
    assert str(ours._scale.device) == "cpu"
    a, _, _ = torch_run(native, KINDS, model, opt)
    b, _, _ = torch_run(ours, KINDS)
    assert hexes(a) == hexes(b)
    moved = from_native(native, backend="numpy")
    assert (moved.backend, moved.state, moved.config) == ("numpy", ours.state, ours.config)


# ================================================================ paddle


class _GpuPlace:
    def is_gpu_place(self):
        return True


def paddle_native(cls_name: str, *args, **kwargs):
    """A real, enabled paddle scaler on this CPU-only build (as test_paddle_backend.py's
    fixture: the place check answers "GPU" for the constructor only). Its scale becomes a
    0-d tensor: paddle 3.3.1's backoff prints float(scale), which NumPy 2 refuses for shape
    [1]; the arithmetic is the same."""
    import paddle
    import paddle.amp.grad_scaler as grad_scaler

    saved = grad_scaler._dygraph_tracer
    grad_scaler._dygraph_tracer = lambda: SimpleNamespace(_expected_place=_GpuPlace())
    try:
        native = getattr(paddle.amp, cls_name)(*args, **kwargs)
    finally:
        grad_scaler._dygraph_tracer = saved
    assert native.is_enable()
    native._scale = paddle.to_tensor(np.float32(native._scale.numpy().reshape(-1)[0]))
    return native


def paddle_run(native, kinds: str, model=None, opt=None):
    import paddle

    if model is None:
        paddle.seed(0)
        model = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    scales = []
    for kind in kinds:
        x = paddle.ones([2, 4])
        if kind == "I":
            x[0, 0] = float("inf")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with paddle.amp.auto_cast(dtype="float16"):  # paddle's scale() wants it
                scaled = native.scale(model(x).sum())
        scaled.backward()
        if hasattr(native, "step"):
            native.step(opt)
            native.update()
        else:  # AmpScaler: minimize unscales, steps and updates
            native.minimize(opt, scaled)
        opt.clear_grad()
        scales.append(float(native._scale.numpy().reshape(-1)[0]))  # ours keeps it there too
    return scales, model, opt


PADDLE_CALLS = [
    ("GradScaler", (True, 1024.0, 2.0, 0.5, 3, 2), {}),
    ("GradScaler", (), {"init_loss_scaling": 2048.0, "incr_every_n_steps": 2}),
    ("GradScaler", (), {"init_loss_scaling": 512.0, "incr_ratio": 3.0, "decr_ratio": 0.25,
                        "incr_every_n_steps": 4, "decr_every_n_nan_or_inf": 1}),
    ("AmpScaler", (True, 1024.0), {"incr_every_n_steps": 3}),
]


@pytest.fixture
def paddle_amp_dtype():
    paddle = pytest.importorskip("paddle")
    from paddle.amp.auto_cast import amp_global_state

    saved = amp_global_state().amp_dtype
    try:
        yield paddle
    finally:
        amp_global_state().amp_dtype = saved


@pytest.mark.framework("paddle")
@pytest.mark.parametrize(("cls_name", "args", "kwargs"), PADDLE_CALLS)
def test_paddle_call_config_follows_paddles_own_trajectory(paddle_amp_dtype, cls_name, args,
                                                           kwargs):
    config, _ = config_from_call(f"paddle.amp.{cls_name}", args, kwargs)
    scales, _, _ = paddle_run(paddle_native(cls_name, *args, **kwargs), KINDS)
    assert hexes(scales) == reference(config, KINDS)


@pytest.mark.framework("paddle")
def test_paddle_torch_port_needs_the_explicit_hysteresis(paddle_amp_dtype):
    # What a paddle 2.x port without decr_every_n_nan_or_inf=1 would run instead.
    config = ScalerConfig(1024.0, growth_interval=3)
    kwargs, _ = native_call(config, "paddle")
    ported = paddle_run(paddle_native("GradScaler", **kwargs), KINDS)[0]
    assert hexes(ported) == reference(config, KINDS)
    paddle2 = config_from_call("paddle.amp.GradScaler", (), {k: v for k, v in kwargs.items()
                               if k != "decr_every_n_nan_or_inf"}, version="2")[0]
    assert reference(paddle2, KINDS) != reference(config, KINDS)


@pytest.mark.framework("paddle")
def test_paddle_native_call_round_trips_and_from_native_keeps_state(paddle_amp_dtype):
    config = ScalerConfig(1024.0, 3.0, 0.25, 3, hysteresis=2)
    kwargs, problems = native_call(config, "paddle")
    assert problems == []
    native = paddle_native("GradScaler", **kwargs)
    assert from_native(native).config == config
    _, model, opt = paddle_run(native, "FFIFFI")  # a pending non-finite update
    ours = from_native(native)
    assert ours.backend == "paddle" and ours.state == ScalerState(1024.0, 0, 1)
    a, _, _ = paddle_run(native, KINDS, model, opt)
    b, _, _ = paddle_run(ours, KINDS)
    assert hexes(a) == hexes(b)


@pytest.mark.framework("paddle")
def test_paddle_disabled_on_cpu_is_a_disabled_scaler(paddle_amp_dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native = paddle_amp_dtype.amp.GradScaler()  # paddle 3.3.1 disables it on CPU
    assert not from_native(native).is_enabled()


# ================================================================ keras


def keras_run(opt, kinds: str, var=None):
    import keras

    if var is None:
        var = keras.Variable(np.ones(3, np.float32))
    scales = []
    for kind in kinds:
        grad = np.full(3, np.inf if kind == "I" else 1.0, np.float32)
        opt.apply([keras.ops.convert_to_tensor(grad)], [var])
        scales.append(float(keras.ops.convert_to_numpy(opt.dynamic_scale)))
    return scales, var


@pytest.mark.framework("keras")
@pytest.mark.parametrize(("args", "kwargs"), [((1024.0, 3), {}), ((), {"dynamic_growth_steps": 2}),
                                              ((), {"initial_scale": 512.0})])
def test_keras_call_config_follows_keras_own_trajectory(args, kwargs):
    keras = pytest.importorskip("keras")
    inner = keras.optimizers.SGD(0.01)
    config, notes = config_from_call("keras.optimizers.LossScaleOptimizer", (inner, *args),
                                     kwargs)
    kinds = KINDS if config.init_scale < 2**15 else "FFIFF"  # no growth past float32 here
    native = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), *args, **kwargs)
    scales, _ = keras_run(native, kinds)
    assert hexes(scales) == reference(config, kinds)


@pytest.mark.framework("keras")
def test_keras_native_call_round_trips_and_from_native_keeps_state():
    keras = pytest.importorskip("keras")
    from unifiedamp.backends.keras import KerasGradScaler, SpecLossScaleOptimizer

    config = ScalerConfig(1024.0, growth_interval=3)
    kwargs, problems = native_call(config, "keras")
    assert problems == []
    inner = keras.optimizers.SGD(0.01)
    native = keras.optimizers.LossScaleOptimizer(inner, **kwargs)
    assert from_native(native).config == config
    _, var = keras_run(native, "FFIFF")
    ours = from_native(native)
    assert isinstance(ours, KerasGradScaler) and isinstance(ours.optimizer, SpecLossScaleOptimizer)
    assert ours.optimizer.inner_optimizer is inner
    assert ours.state == ScalerState(512.0, 2, 0)
    a, _ = keras_run(native, KINDS, var)
    b, _ = keras_run(ours.optimizer, KINDS, var)
    assert hexes(a) == hexes(b)
    assert from_native(ours.optimizer).optimizer is ours.optimizer


# ================================================================ jmp


def jmp_run(loss_scale, kinds: str):
    import jax.numpy as jnp

    scales = []
    for kind in kinds:
        loss_scale = loss_scale.adjust(jnp.asarray(kind == "F"))
        scales.append(float(loss_scale.loss_scale))
    return scales, loss_scale


JMP_CALLS = [((2.0**10,), {"period": 3}), ((2.0**10, 0, 3, 4), {}),
             ((2.0,), {"period": 4, "min_loss_scale": 0.5})]


@pytest.mark.framework("jax")
@pytest.mark.parametrize(("args", "kwargs"), JMP_CALLS)
def test_jmp_call_config_follows_jmps_own_trajectory(args, kwargs):
    jmp = pytest.importorskip("jmp")
    import jax.numpy as jnp

    arrays = tuple(jnp.float32(a) if isinstance(a, float) else a for a in args)
    config, _ = config_from_call("jmp.DynamicLossScale", arrays, kwargs)
    kinds = KINDS + "IIIIII"  # down to the floor
    scales, _ = jmp_run(jmp.DynamicLossScale(*arrays, **{
        k: jnp.float32(v) if k == "min_loss_scale" else v for k, v in kwargs.items()}), kinds)
    assert hexes(scales) == reference(config, kinds)


@pytest.mark.framework("jax")
def test_jmp_round_trip_state_and_the_jit_floor():
    jmp = pytest.importorskip("jmp")
    import jax
    import jax.numpy as jnp

    config = ScalerConfig(1024.0, growth_interval=3, min_scale=0.5)
    kwargs, problems = native_call(config, "jmp")
    assert "drops min_loss_scale=0.5" in problems[0]
    native = jmp.DynamicLossScale(jnp.float32(kwargs["loss_scale"]), period=kwargs["period"],
                                  factor=int(kwargs["factor"]),
                                  min_loss_scale=jnp.float32(kwargs["min_loss_scale"]))
    assert from_native(native).config == config
    _, native = jmp_run(native, "FFIFF")
    ours = from_native(native)
    assert ours.backend == "jax" and ours.state == ScalerState(512.0, 2, 0)
    a, _ = jmp_run(native, KINDS)
    b = []
    for kind in KINDS:
        ours = ours.update(jnp.asarray(kind == "F"))
        b.append(ours.get_scale())
    assert hexes(a) == hexes(b)
    # The problem line is true: through jit, jmp's floor is 1.0 again.
    low = jmp.DynamicLossScale(jnp.float32(1.0), min_loss_scale=jnp.float32(0.5))
    assert float(low.adjust(jnp.asarray(False)).loss_scale) == 0.5
    jitted = jax.jit(lambda s: s.adjust(jnp.asarray(False)))(low)
    assert float(jitted.loss_scale) == 1.0


@pytest.mark.framework("jax")
def test_jmp_static_and_noop():
    jmp = pytest.importorskip("jmp")
    import jax.numpy as jnp

    static = from_native(jmp.StaticLossScale(jnp.float32(128.0)))
    assert static.config == ScalerConfig(128.0, dynamic=False) and static.get_scale() == 128.0
    assert not from_native(jmp.NoOpLossScale()).is_enabled()
