"""Porting traps on the torch backend: torch's call habits, torch's own scaler and
Lightning's default plugin reading our state, and clear errors for misuse."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from imperative_misuse_checks import check_update_new_scale_types  # noqa: E402
from torch_helpers import lightning_fit  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402
from unifiedamp.backends.torch import ScaleNotCalledError, TorchGradScaler  # noqa: E402
from unifiedamp.errors import NoInfChecksError  # noqa: E402
from unifiedamp.spec._state_dict import STATE_KEYS  # noqa: E402

TORCH_KEYS = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="measures a CPU-only machine")


def linear(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def iterate(scaler, model, opt, kind):
    x = torch.ones(2, 4)
    if kind == "I":
        x[0, 0] = float("inf")
    scaler.scale(model(x).sum()).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def trained(kinds="FFIFF", **config):
    config = {"init_scale": 1024.0, "growth_interval": 4, **config}
    scaler = ua.GradScaler(backend="torch", **config)
    model, opt = linear()
    for kind in kinds:
        iterate(scaler, model, opt, kind)
    return scaler


# ---------------------------------------------------------------- item 7: torch reads our state


def test_state_dict_loads_into_torchs_own_scaler_and_continues_the_trajectory():
    ours = trained("FFIFF", growth_factor=3.0, backoff_factor=0.25)
    saved = json.loads(json.dumps(ours.state_dict()))  # through JSON, as a checkpoint would
    assert TORCH_KEYS <= set(saved) and saved["format"] == spec.STATE_FORMAT
    native = torch.amp.GradScaler("cpu")
    native.load_state_dict(saved)
    assert (native.get_scale(), native._get_growth_tracker()) == (ours.get_scale(), 2)
    assert (native.get_growth_factor(), native.get_backoff_factor(),
            native.get_growth_interval()) == (3.0, 0.25, 4)
    model_a, opt_a = linear()
    model_b, opt_b = linear()
    for step, kind in enumerate("FFIIFFFFF", 1):
        iterate(ours, model_a, opt_a, kind)
        iterate(native, model_b, opt_b, kind)
        assert spec.f32_hex(native.get_scale()) == spec.f32_hex(ours.get_scale()), step
        assert native._get_growth_tracker() == ours._get_growth_tracker(), step


def test_torch_keys_carry_float32_factors_so_torch_computes_the_spec():
    # torch multiplies by the factor as given; the spec by its float32 rounding.
    ours = trained("", growth_factor=1.1, growth_interval=1)
    native = torch.amp.GradScaler("cpu")
    native.load_state_dict(ours.state_dict())
    assert native.get_growth_factor() == spec.f32(1.1)
    assert ours.state_dict()["config"]["growth_factor"] == 1.1  # the canonical config is exact
    model_a, opt_a = linear()
    model_b, opt_b = linear()
    for _ in range(5):
        iterate(ours, model_a, opt_a, "F")
        iterate(native, model_b, opt_b, "F")
    assert spec.f32_hex(native.get_scale()) == spec.f32_hex(ours.get_scale())


def test_state_dict_has_no_torch_keys_for_a_config_torch_cannot_run():
    for config in ({"hysteresis": 2}, {"min_scale": 1.0}, {"max_scale": 1e6},
                   {"growth_factor": 1.0}, {"backoff_factor": 1.0}, {"dynamic": False}):
        d = ua.GradScaler(backend="torch", **config).state_dict()
        # A torch scaler loading it would follow another rule: better a KeyError than
        # a silently different run.
        assert set(d) == set(STATE_KEYS), config


@pytest.mark.parametrize("backend", ["torch", "numpy", "jax", "mlx"])
def test_state_dict_with_torch_keys_is_still_the_canonical_dict_for_every_backend(backend):
    module = {"jax": "optax", "mlx": "mlx.core"}.get(backend)
    if module:
        pytest.importorskip(module)
    saved = json.loads(json.dumps(trained("FFIFF", growth_factor=3.0).state_dict()))
    # Read as canonical (it has "format"): init_scale comes from the dict, which
    # torch's format does not carry.
    config, state = spec.parse_state_dict(saved, base=spec.ScalerConfig(8.0))
    assert config == spec.ScalerConfig(1024.0, 3.0, growth_interval=4)
    assert state == spec.ScalerState(512.0, 2, 0)
    adapter = type(ua.GradScaler(backend=backend)).conformance_adapter()
    handle = adapter.load(adapter.new(spec.ScalerConfig()), saved)
    assert tuple(adapter.read(handle)) == (512.0, 2, 0)
    assert adapter.save(handle)["config"] == config.to_dict()


RESUME_MID_EPOCH = pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint")


@RESUME_MID_EPOCH
def test_lightning_default_plugin_resumes_a_checkpoint_written_with_our_scaler(tmp_path):
    ckpt = tmp_path / "ours.ckpt"
    ours = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
    lightning_fit(ours, 5, ckpt_out=ckpt)
    assert ours.state == spec.ScalerState(1024.0, 1, 0)  # F I F F F: 512, then 1024, then 1
    start, native = lightning_fit(None, 7, ckpt_in=ckpt)
    assert type(native) is torch.amp.GradScaler  # Lightning's default
    assert start == (1024.0, 1)


@RESUME_MID_EPOCH
def test_our_scaler_resumes_a_lightning_checkpoint_of_the_default_scaler(tmp_path):
    ckpt = tmp_path / "native.ckpt"
    _, native = lightning_fit(None, 5, ckpt_out=ckpt)
    assert type(native) is torch.amp.GradScaler
    start, ours = lightning_fit(ua.GradScaler(backend="torch"), 7, ckpt_in=ckpt)
    assert start == (native.get_scale(), native._get_growth_tracker())
    assert ours.config.growth_interval == native.get_growth_interval()


# ---------------------------------------------------------------- item 8: torch's call habits


def test_device_is_accepted_as_the_first_positional_argument_like_torch():
    for device in ("cpu", torch.device("cpu")):
        scaler = TorchGradScaler(device, 1024.0, 3.0, 0.25, 7, True)
        assert scaler.config == spec.ScalerConfig(1024.0, 3.0, 0.25, 7, True)
        assert scaler._scale.device.type == "cpu"
    facade = ua.GradScaler("cpu", 8.0, backend="torch")
    assert type(facade) is TorchGradScaler and facade.get_scale() == 8.0
    native_style = ua.GradScaler("cpu", init_scale=8.0, backend="torch")
    assert native_style.config.init_scale == 8.0


def test_device_given_twice_or_not_a_device_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"device given twice: 'cpu' as the first positional "
                                        r"argument and device='cpu'"):
        TorchGradScaler("cpu", device="cpu")
    with pytest.raises(ValueError, match=r"'1024' is not a torch device.*init_scale=1024\.0"):
        TorchGradScaler("1024")


@NO_CUDA
def test_cuda_device_without_cuda_raises_naming_the_device_and_the_fix():
    for args, kwargs in (((), {"device": "cuda"}), (("cuda:0",), {}),
                         ((), {"device": torch.device("cuda", 1)})):
        with pytest.raises(RuntimeError, match=r"device='cuda.*' but CUDA is not available: "
                                               r"pass device='cpu' or enabled=False"):
            TorchGradScaler(*args, **kwargs)
    disabled = TorchGradScaler("cuda", enabled=False)  # a pass-through needs no device
    assert not disabled.is_enabled() and disabled.scale(torch.ones(())).item() == 1.0


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="needs a machine without MPS")
def test_a_device_torch_cannot_use_raises_naming_it_and_the_fix():
    with pytest.raises(RuntimeError, match=r"^device='mps' cannot hold the scale \(Could not "
                                           r"run .*\): pass device='cpu' or enabled=False$"):
        TorchGradScaler(device="mps")


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("verb", ["step", "unscale_"])
def test_step_or_unscale_before_any_scale_raises_like_torch(device, verb):
    scaler = TorchGradScaler(device=device)
    native = torch.amp.GradScaler("cpu")
    model, opt = linear()
    model(torch.ones(2, 4)).sum().backward()  # an unscaled loss
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(AssertionError) as torch_error:
        getattr(native, verb)(opt)
    with pytest.raises(RuntimeError, match="scaler.scale") as ours:
        getattr(scaler, verb)(opt)
    assert isinstance(ours.value, AssertionError)  # as torch's, for code that catches that
    assert str(ours.value).startswith(str(torch_error.value))
    assert "call scaler.scale(loss).backward() before" in str(ours.value)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # After a scale() the same scaler works.
    opt.zero_grad()
    iterate(scaler, model, opt, "F")
    assert scaler.num_steps == 1 and not scaler.last_step_skipped
    # A pickled copy, like torch's, needs a scale() again before its first step.
    copy = pickle.loads(pickle.dumps(scaler))
    with pytest.raises(ScaleNotCalledError, match=f"Attempted {verb} but _scale is None"):
        getattr(copy, verb)(opt)


def test_a_disabled_scaler_steps_without_scale():
    scaler = TorchGradScaler(enabled=False)
    model, opt = linear()
    model(torch.ones(2, 4)).sum().backward()
    scaler.step(opt)
    scaler.update()


# ---------------------------------------------------------------- item 15: misuse


def test_functional_unscale_names_a_leaf_that_is_not_a_tensor():
    scaler = TorchGradScaler(8.0, device="cpu")
    for grads, name in (([1.0], "float"), ((torch.ones(1), None), "NoneType")):
        with pytest.raises(TypeError, match=rf"grads must be a Tensor or a list/tuple/dict of "
                                            rf"Tensors, got a {name} leaf"):
            scaler.unscale(grads)
    with pytest.raises(TypeError, match=r"unscale\(\) takes torch tensors .* got a "
                                        r"numpy\.ndarray leaf .* torch\.as_tensor"):
        scaler.unscale({"w": np.ones(2)})
    with pytest.raises(NoInfChecksError):  # nothing was recorded by the refused calls
        scaler.update()


def test_update_new_scale_takes_numpy_values_like_the_numpy_backend():
    scaler = TorchGradScaler(1024.0)
    model, opt = linear()
    iterate(scaler, model, opt, "F")
    for value, expected in ((np.float32(8.0), 8.0), (np.array(4.0), 4.0),
                            (np.array([2.0], np.float16), 2.0), (np.int64(16), 16.0), (32, 32.0),
                            (np.array([[0.1]]), spec.f32(0.1))):
        scaler.update(new_scale=value)
        assert scaler.get_scale() == expected, value
    for bad in (np.ones(2), np.array(["8"]), np.array(1 + 1j), True, np.bool_(True),
                [8.0], "8"):
        with pytest.raises(TypeError, match=r"^new_scale must be a float or a 1-element "
                                            r"array/tensor"):
            scaler.update(new_scale=bad)
    for bad in (np.float32("nan"), np.array([0.0]), np.float64(1e39)):
        with pytest.raises(ValueError, match="new_scale must be finite and > 0 in float32"):
            scaler.update(new_scale=bad)
    assert scaler.get_scale() == spec.f32(0.1)


def test_update_new_scale_takes_the_same_types_on_every_imperative_backend():
    # The numpy backend's case: tests/core/test_numpy_backend.py, under the same name.
    scaler = ua.GradScaler(1024.0, backend="torch", device="cpu")  # the scale exists already
    check_update_new_scale_types(scaler)


def test_max_consecutive_skips_takes_a_numpy_int_like_the_config():
    scaler = ua.GradScaler(backend="torch", growth_interval=np.int64(5),
                           max_consecutive_skips=np.int64(5))
    assert scaler.config.growth_interval == 5
