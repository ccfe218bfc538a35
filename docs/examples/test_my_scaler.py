"""Proving MyScaler follows the unifiedamp spec: run ``pytest docs/examples``."""

import numpy as np
import pytest
from my_scaler import MyScaler

from unifiedamp.conformance import STEP_KINDS, ImperativeAdapter, Problem, ScalerContract
from unifiedamp.spec import ScalerState


class SGD:
    def __init__(self):
        self.params, self.grads, self.steps = [np.zeros(3, np.float32)], [None], 0

    def step(self):
        self.params[0] -= 0.1 * self.grads[0]
        self.steps += 1


def make_problem():
    opt = SGD()

    def set_grads(kind, scaler):
        # |values| <= 0.5: a finite step must stay finite at every float32 scale.
        opt.grads = [scaler.scale(np.array([0.5, STEP_KINDS[kind], 0.25], np.float32))]

    return Problem(opt, set_grads, lambda: [opt.params[0], np.array(opt.steps)])


class Adapter(ImperativeAdapter):
    """ImperativeAdapter reads state through state_dict(); MyScaler has none, so read it here."""

    def read(self, handle):
        s = handle[0]
        return ScalerState(s.scale_, s.good, s.bad)

    def reconfigure(self, handle, changes):
        handle[0].interval = changes.get("growth_interval", handle[0].interval)
        return handle


class TestMyScaler(ScalerContract):
    backend = "myscaler"

    @pytest.fixture
    def adapter(self):
        return Adapter(MyScaler, make_problem, name="myscaler",
                       capabilities=frozenset({"multi_optimizer", "set_config", "disable"}),
                       info={"framework": "numpy", "version": np.__version__, "device": "cpu"})
