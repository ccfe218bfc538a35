"""A functional scaler (JAX, MLX) that an eager update, restore or setter replaced refuses the
verbs: the checks both backends share, as a class each session's ``test_superseded.py``
subclasses with its ``backend``, a loss and an overflowing gradient tree of its framework.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import unifiedamp as ua

FIX = r"scaler = scaler\.update\(finite\)"

VERBS = {
    "scale": lambda c, s: s.scale(c.loss()),
    "unscale": lambda c, s: s.unscale(c.overflow()),
    "update": lambda c, s: s.update(True),
    "update(new_scale=)": lambda c, s: s.update(new_scale=2.0),
    "with_config": lambda c, s: s.with_config(growth_interval=3),
    "set_growth_factor": lambda c, s: s.set_growth_factor(3.0),
}
REPLACE = {
    "update": lambda c, s: s.update(False),
    "new_scale": lambda c, s: s.update(new_scale=4.0),
    "restore": lambda c, s: s.restore(ua.GradScaler(64.0, backend=c.backend).state_dict()),
    "setter": lambda c, s: s.set_hysteresis(2),
}


class SupersededContract:
    backend: ClassVar[str]
    class_name: ClassVar[str]

    def loss(self) -> Any:
        raise NotImplementedError

    def overflow(self) -> Any:
        """A gradient tree with an inf, new each call."""
        raise NotImplementedError

    def test_dropping_updates_result_raises_with_the_fix(self):
        s = ua.GradScaler(1024.0, backend=self.backend)
        g, f = s.unscale(self.overflow())
        s.update(f)  # torch's line: the result is dropped
        with pytest.raises(RuntimeError, match=rf"unscale\(\) refused: update\(\) already "
                                               rf"replaced this {self.class_name}.*{FIX}"):
            s.unscale(self.overflow())
        # Reading the old value stays allowed: it is what it was.
        assert (s.get_scale(), s.num_skipped_steps) == (1024.0, 0)

    def test_keeping_the_result_backs_off_like_torch(self):
        s = ua.GradScaler(1024.0, backend=self.backend)
        for _ in range(3):
            g, f = s.unscale(self.overflow())
            s = s.update(f)
        assert (s.get_scale(), s.num_skipped_steps) == (128.0, 3)

    @pytest.mark.parametrize("verb", VERBS)
    @pytest.mark.parametrize("by", REPLACE)
    def test_every_verb_is_refused_after_every_replacement(self, verb, by):
        s = ua.GradScaler(8.0, backend=self.backend)
        new = REPLACE[by](self, s)
        with pytest.raises(RuntimeError, match=FIX):
            VERBS[verb](self, s)
        VERBS[verb](self, new)  # the result is current

    def test_restore_into_a_replaced_template_is_allowed(self):
        # restore keeps none of the replaced scale or trackers: loading several dicts into
        # one template is a reasonable use.
        template = ua.GradScaler(backend=self.backend)
        a = template.restore(ua.GradScaler(64.0, backend=self.backend).state_dict())
        b = template.restore(ua.GradScaler(16.0, backend=self.backend).state_dict())
        assert (a.get_scale(), b.get_scale()) == (64.0, 16.0)
