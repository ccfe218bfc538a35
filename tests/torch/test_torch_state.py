"""The torch backend's state: torch's own state dict both ways, the canonical state from
another backend, a failed load that changes nothing, pickle and deepcopy (and a pickle of
the previous release), and the refusal to pickle in the middle of an iteration."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_helpers import batch, loss_of, mlp  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp import spec  # noqa: E402


def test_native_state_dict_round_trips_through_a_real_torch_scaler():
    ours = ua.GradScaler(256.0, growth_interval=4, backend="torch")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for poison in (None, None, float("inf"), None):
        ours.scale(loss_of(model, *batch(poison=poison))).backward()
        ours.step(opt)
        ours.update()
        opt.zero_grad()
    native = torch.amp.GradScaler("cpu")
    native.load_state_dict(ours.native_state_dict())
    assert native.get_scale() == ours.get_scale() == 128.0
    assert native._get_growth_tracker() == ours._get_growth_tracker() == 1
    back = ua.GradScaler(backend="torch")
    back.load_state_dict(native.state_dict())
    assert back.state == ours.state
    # torch's format has no init_scale: the loading scaler keeps its own
    assert back.config == ours.config.replace(init_scale=65536.0)
    with pytest.raises(ValueError, match="cannot carry this config"):
        ua.GradScaler(hysteresis=2, backend="torch").native_state_dict()


def test_canonical_state_moves_from_numpy_to_torch_and_resumes(tmp_path):
    source = ua.GradScaler(1024.0, 3.0, 0.25, 3, backend="numpy", hysteresis=2)
    from unifiedamp.backends.numpy import SGD

    opt = SGD([np.zeros(2, np.float32)])
    for grad in ([1.0, 1.0], [1.0, np.inf], [1.0, 1.0]):
        opt.grads = [np.array(grad, np.float32)]
        source.step(opt)
        source.update()
    path = tmp_path / "scaler.json"
    path.write_text(json.dumps(source.state_dict()))
    target = ua.GradScaler(backend="torch")
    target.load_state_dict(json.loads(path.read_text()))
    assert target.state == source.state == spec.ScalerState(1024.0, 1, 0)
    assert target.config == source.config


def test_failed_load_changes_nothing():
    scaler = ua.GradScaler(1024.0, backend="torch")
    scaler.scale(torch.ones(()))
    before = scaler.state_dict()
    with pytest.raises(ValueError, match="nothing was loaded"):
        scaler.load_state_dict({**before, "growth_tracker": -1})
    with pytest.raises(ValueError, match="it is empty"):
        scaler.load_state_dict({})
    assert scaler.state_dict() == before


def test_an_empty_dict_raises_the_runtime_error_torchs_scaler_raises():
    # torch.amp.GradScaler raises RuntimeError ("The source state dict is empty"): a resume
    # written for it (`except RuntimeError`) still catches ours.
    with pytest.raises(RuntimeError, match="empty"):
        torch.amp.GradScaler("cpu").load_state_dict({})
    scaler = ua.GradScaler(1024.0, backend="torch")
    with pytest.raises(RuntimeError, match="it is empty, possibly saved from a disabled"):
        scaler.load_state_dict({})
    assert scaler.get_scale() == 1024.0


def test_pickle_and_deepcopy_keep_config_and_state():
    scaler = ua.GradScaler(1024.0, hysteresis=3, backend="torch")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(loss_of(model, *batch(poison=float("inf")))).backward()
    scaler.step(opt)
    scaler.update()
    for clone in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert clone.state == scaler.state == spec.ScalerState(1024.0, 0, 1)
        assert clone.config == scaler.config and clone.num_skipped_steps == 1
    # A pickle of the previous release, whose skip counters had other names, still loads.
    old = scaler.__getstate__()
    old["_skipped_on_host"] = old.pop("_skip_count_host")
    old["_host_skips"] = old.pop("_consecutive_skips_host")
    old["_skips_on_device"] = old.pop("_device_holds_consecutive_skips")
    clone = type(scaler).__new__(type(scaler))
    clone.__setstate__(old)
    assert clone.state == scaler.state and clone.num_skipped_steps == 1


def test_pickling_in_the_middle_of_an_iteration_says_when_it_can_be_done():
    scaler = ua.GradScaler(1024.0, backend="torch", device="cpu")
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"middle of an iteration.*after update\(\); to "
                                           r"checkpoint, save scaler.state_dict\(\)"):
        pickle.dumps(scaler)
    scaler.step(opt)
    scaler.update()
    assert pickle.loads(pickle.dumps(scaler)).get_scale() == 1024.0
