"""Deliberately broken scalers: the conformance suite must catch each of them.

Used by test_conformance_meta.py as ``--unifiedamp-backend broken_scalers:NAME``.
"""

from __future__ import annotations

import math

from unifiedamp import spec
from unifiedamp.backends.numpy import NumpyGradScaler
from unifiedamp.spec import ScalerState


class NeverBacksOff(NumpyGradScaler):
    def _next_state(self, found_inf):
        return super()._next_state(False)


class GrowsOneStepLate(NumpyGradScaler):
    def _next_state(self, found_inf):
        late = self.config.replace(growth_interval=self.config.growth_interval + 1)
        return spec.update(late, self.state, found_inf)


class DropsTrackerOnLoad(NumpyGradScaler):
    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._state = self._state._replace(growth_tracker=0)


class ClampsAtOne(NumpyGradScaler):
    def _next_state(self, found_inf):
        state = super()._next_state(found_inf)
        return state._replace(scale=max(state.scale, 1.0))


class ForgetsFirstOptimizerInf(NumpyGradScaler):
    # Paddle 3.3.1's behaviour: update() sees only the last step()'s flag.
    def update(self, new_scale=None):
        self._found_inf = dict(list(self._found_inf.items())[-1:])
        super().update(new_scale)


class RoundsInFloat64(NumpyGradScaler):
    def _next_state(self, found_inf):
        c, (scale, growth, hyst) = self.config, self.state
        if not c.dynamic:
            return ScalerState(scale, 0, 0)
        if found_inf:
            growth, hyst = 0, hyst + 1
            if hyst >= c.hysteresis:
                scale, hyst = scale * c.backoff_factor, 0
                if c.min_scale is not None:
                    scale = max(scale, c.min_scale)
            return ScalerState(scale, growth, hyst)
        hyst, growth = 0, growth + 1
        if growth >= c.growth_interval:
            candidate = scale * c.growth_factor
            if c.max_scale is not None:
                candidate = min(candidate, c.max_scale)
            if math.isfinite(candidate) and candidate <= 3.4028234663852886e38:
                scale = candidate
            growth = 0
        return ScalerState(scale, growth, hyst)
