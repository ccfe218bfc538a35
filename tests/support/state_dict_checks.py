"""State-dict checks every backend shares, as classes each session's ``test_state_dict.py``
instantiates with its ``backend``: a tracker loaded past its bound acts at the next update
(every backend), and a tracker or interval past int32 loads nothing (the imperative
NumPy and torch backends)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import unifiedamp as ua
from unifiedamp import spec
from unifiedamp.backends.numpy import SGD


class TrackerBoundContract:
    """``backend``: numpy, torch, paddle, jax, mlx or keras (on the session's Keras backend)."""

    backend: str | None = None

    def test_a_tracker_loaded_past_its_bound_acts_at_the_next_update_on_every_backend(self):
        # A state set_growth_interval / set_hysteresis can reach, saved and loaded (a paddle
        # dict whose decr_count exceeds decr_every_n_nan_or_inf is the same state): a growth
        # tracker past the interval grows at the next finite update, a hysteresis tracker past
        # the hysteresis backs off at the next non-finite one (the rule's >=). The conformance
        # suite's test_a_loaded_tracker_past_the_interval_grows_on_the_next_finite_step holds
        # the first for every scaler; this holds both for every backend here.
        backend = self.backend
        pytest.importorskip("mlx.core" if backend == "mlx" else backend)
        config = spec.ScalerConfig(1024.0, growth_interval=4, hysteresis=2)
        cases = [(spec.ScalerState(1024.0, 9, 0), True, spec.ScalerState(2048.0, 0, 0)),
                 (spec.ScalerState(1024.0, 0, 5), False, spec.ScalerState(512.0, 0, 0)),
                 (spec.ScalerState(1024.0, 0, 5), True, spec.ScalerState(1024.0, 1, 0))]
        for loaded, finite, expected in cases:
            scaler = ua.GradScaler(**config.to_dict(), backend=backend)
            scaler = scaler.restore(spec.to_state_dict(config, loaded, "numpy"))
            assert scaler.state == loaded
            reference = spec.update(config, loaded, found_inf=not finite)
            assert reference == expected
            if backend in ("jax", "mlx"):
                xp = importlib.import_module("jax.numpy" if backend == "jax" else "mlx.core")
                scaler = scaler.update(xp.array(finite))
            else:
                scaler = update_imperative(scaler, backend, finite)
            assert scaler.state == expected, (backend, loaded, finite)


class Int32LoadContract:
    """``backend``: an imperative backend (numpy or torch)."""

    backend: str | None = None

    @pytest.mark.parametrize("bad", [{"growth_tracker": 2**31}, {"hysteresis_tracker": 2**40},
                                     {"config": {"growth_interval": 2**31}}])
    def test_a_tracker_or_interval_past_int32_loads_nothing_on_any_backend(self, bad):
        # torch wrote the config and the scale, then failed on the int32 tracker.
        backend = self.backend
        if backend == "torch":
            pytest.importorskip("torch")
        scaler = ua.GradScaler(1024.0, growth_interval=100, backend=backend)
        scaler.load_state_dict(
            ua.GradScaler(512.0, growth_interval=50, backend="numpy").state_dict())
        before_config, before_state = scaler.config, scaler.state
        d = scaler.state_dict()
        d.update({k: v for k, v in bad.items() if k != "config"})
        d["config"].update(bad.get("config", {}))
        with pytest.raises(ValueError, match="nothing was loaded"):
            scaler.load_state_dict(d)
        assert scaler.config == before_config and scaler.state == before_state


def update_imperative(scaler, backend, finite):
    """One iteration of a backend's own verbs with a finite or an inf gradient."""
    value = 1.0 if finite else np.inf
    if backend == "numpy":
        opt = SGD([np.zeros(2, np.float32)])
        opt.grads = [np.array([1.0, value], np.float32)]
        scaler.step(opt)
        scaler.update()
    elif backend == "torch":
        import torch

        w = torch.nn.Parameter(torch.zeros(2))
        opt = torch.optim.SGD([w], lr=0.1)
        scaler.scale((w * torch.tensor([1.0, value])).sum()).backward()
        scaler.step(opt)
        scaler.update()
    elif backend == "paddle":
        import paddle

        w = paddle.create_parameter([2], "float32")
        opt = paddle.optimizer.SGD(parameters=[w])
        scaler.scale((w * paddle.to_tensor([1.0, value])).sum()).backward()
        scaler.step(opt)
        scaler.update()
    else:  # keras: the wrapped optimizer's apply
        import keras

        w = keras.Variable(np.zeros(2, np.float32))
        opt = scaler.wrap(keras.optimizers.SGD(0.1))
        opt.build([w])
        opt.apply([keras.ops.convert_to_tensor(np.array([1.0, value], np.float32)
                                               * scaler.get_scale())], [w])
    return scaler
