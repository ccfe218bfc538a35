"""A loss scaler written from scratch, as a framework author might: no unifiedamp inside.

It keeps torch's verbs over NumPy optimizers (``params``, ``grads``, ``step()``)
and does the spec's arithmetic in numpy.float32.
"""

import numpy as np


class MyScaler:
    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, *, hysteresis=1, min_scale=None,
                 max_scale=None, dynamic=True):
        self.enabled, self.dynamic = enabled, dynamic
        self.growth, self.backoff = np.float32(growth_factor), np.float32(backoff_factor)
        self.interval, self.hysteresis = growth_interval, hysteresis
        self.lo = None if min_scale is None else np.float32(min_scale)
        self.hi = None if max_scale is None else np.float32(max_scale)
        self.scale_, self.good, self.bad = np.float32(init_scale), 0, 0
        self.found = {}

    def scale(self, x):
        return x * self.scale_ if self.enabled else x

    def _reciprocal(self):
        # Below ~2.94e-39 it is inf, and every unscaled gradient would be inf or NaN:
        # the spec counts that as an inf, so the step is skipped.
        with np.errstate(over="ignore", divide="ignore"):
            return np.float32(1.0) / self.scale_

    def unscale(self, grads):
        finite = np.isfinite(self._reciprocal()) and all(np.isfinite(g).all() for g in grads)
        self.found["functional"] = not finite
        return [g / self.scale_ for g in grads], finite

    def step(self, opt):
        if not self.enabled:
            return opt.step()
        inf = not np.isfinite(self._reciprocal()) or any(
            not np.isfinite(g).all() for g in opt.grads if g is not None)
        self.found[id(opt)] = inf
        with np.errstate(over="ignore"):  # a tiny scale may overflow: the spec allows it
            opt.grads = [None if g is None else g / self.scale_ for g in opt.grads]
        if not inf:
            opt.step()

    def update(self):
        if not self.enabled:
            return
        inf, self.found = any(self.found.values()), {}
        if not self.dynamic:
            self.good = self.bad = 0
        elif inf:
            self.good, self.bad = 0, self.bad + 1
            if self.bad >= self.hysteresis:
                self.scale_, self.bad = self.scale_ * self.backoff, 0
                if self.lo is not None:
                    self.scale_ = max(self.scale_, self.lo)
        else:
            self.bad, self.good = 0, self.good + 1
            if self.good >= self.interval:
                with np.errstate(over="ignore"):
                    candidate = self.scale_ * self.growth
                if self.hi is not None:
                    candidate = min(candidate, self.hi)
                if np.isfinite(candidate):
                    self.scale_ = candidate
                self.good = 0
