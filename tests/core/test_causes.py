"""A failure is named by its cause: each departure from the spec is told apart from the
others, several in one run are all found, and the runner looks past the first divergence."""

from __future__ import annotations

import math

import pytest
from zoo_copies import PaddleRuleCopy

from unifiedamp.conformance._causes import DEPARTURES, Observed, explain, replay
from unifiedamp.conformance._runner import run_steps
from unifiedamp.spec import ScalerConfig, ScalerState

C = ScalerConfig

#: Departure -> (config, steps, start): a run where it, and no other, shows.
PROBES = {
    "grows one step late": (C(1024.0, growth_interval=2), "FFF", None),
    "grows one step early": (C(1024.0, growth_interval=3), "FFF", None),
    # Two growths tell it from a growth one step late (DeepSpeed's rule).
    "first growth one step late": (C(1024.0, growth_interval=2), "FFFFF", None),
    "grows only when the tracker equals the interval":
        (C(1024.0, growth_interval=5), "FF", ScalerState(1024.0, 7, 0)),
    "counts modulo the interval": (C(1024.0, growth_interval=5), "FFF", ScalerState(1024.0, 7, 0)),
    "multiplies by a float64 factor": (C(77.0, growth_factor=1.1, growth_interval=1), "FF", None),
    "first update in float64": (C(3.0, growth_factor=1.1, growth_interval=1), "FF", None),
    "keeps the scale in float64": (C(2.0**127, growth_interval=1), "F", None),
    "growth overflows to inf": (C(2.0**127, growth_interval=1), "F", None),
    "clamps growth at float32's maximum": (C(2.0**127, growth_interval=1), "F", None),
    "floor of 1": (C(2.0), "II", None),
    "floor at the smallest normal float32": (C(2.0**-125), "II", None),
    "floor at the smallest float32": (C(2.0**-148), "II", None),
    "flushes subnormals to zero": (C(2.0**-125), "II", None),
    "flushes a subnormal 1/scale to zero": (C(2.0**127, growth_interval=1000), "F", None),
    "takes a finite step whose 1/scale overflows": (C(2.0**-148), "F", None),
    "skips the step that grows": (C(1024.0, growth_interval=1), "F", None),
    "steps on inf/NaN gradients": (C(1024.0), "I", None),
    "hysteresis not refilled by finite steps": (C(1024.0, hysteresis=2), "IFI", None),
    "hysteresis not re-armed at a backoff": (C(1024.0, hysteresis=2), "III", None),
    "the update ignores overflows": (C(1024.0, growth_interval=1), "I", None),
    "NaN taken as finite": (C(1024.0, growth_interval=1), "N", None),
    "static mode keeps the trackers":
        (C(64.0, dynamic=False), "F", ScalerState(64.0, 2, 1)),
}


def test_every_departure_has_a_probe() -> None:
    assert set(PROBES) == set(DEPARTURES)


@pytest.mark.parametrize("departure", sorted(PROBES))
def test_each_departure_is_named_alone(departure: str) -> None:
    config, steps, start = PROBES[departure]
    seen = replay(config, steps, [departure], start=start)
    assert seen != replay(config, steps, start=start), f"the probe of {departure!r} shows nothing"
    assert explain(config, steps, seen, start=start) == [departure]


def test_the_spec_itself_has_no_cause() -> None:
    config = C(1024.0, growth_interval=2, hysteresis=2)
    assert explain(config, "FFIFIIF", replay(config, "FFIFIIF")) == []


def test_two_departures_in_one_run_are_both_named() -> None:
    # Flax's DynamicScale: a growth one step late, then a growth past float32's maximum
    # clamped to it; the first divergence alone shows only the late growth.
    config = C(2.0**126, growth_interval=1)
    seen = replay(config, "FFFF", ["grows one step late", "clamps growth at float32's maximum"])
    assert explain(config, "FFFF", seen) == ["grows one step late",
                                             "clamps growth at float32's maximum"]


def test_a_run_no_departure_explains_says_what_differs() -> None:
    config = C(1024.0)
    seen = [Observed(ScalerState(3.0, 0, 0), False)]
    assert explain(config, "F", seen) == [
        "unexplained: at step 1 of 'F' the scaler holds (3.0, 0, 0) stepped, the spec "
        "(1024.0, 1, 0) stepped"]


def test_unknown_departures_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown departures \['grows late'\]: one of"):
        replay(C(), "F", ["grows late"])


@pytest.fixture
def copy(monkeypatch: pytest.MonkeyPatch):
    def build(bug: str = "") -> PaddleRuleCopy:
        monkeypatch.setenv("UNIFIEDAMP_PLANTED_BUG", bug)
        return PaddleRuleCopy()
    return build


def test_the_runner_looks_past_the_first_divergence(copy) -> None:
    # A real (copied) scaler with a late growth and Paddle's floor of 1: one run, two causes.
    divergence = run_steps(copy("growth_one_step_late"), C(2.0, growth_interval=2), "FFFIIII")
    assert divergence is not None and divergence.step == 2
    assert divergence.causes == ("grows one step late", "floor of 1")
    assert str(divergence).startswith("[grows one step late; floor of 1] steps: diverged at "
                                      "step 2 of 'FFFIIII'")


def test_optimizer_state_built_by_a_skipped_step_is_a_taken_step(copy) -> None:
    # State that first appears on a skipped step must still hold its zeros.
    divergence = run_steps(copy("state_on_skipped_step"), C(1024.0), "IF")
    assert divergence is not None and (divergence.step, divergence.what) == (1, "skip"), \
        divergence
    assert "the step was taken; the reference skips it (an inf)" in str(divergence)


def test_a_skip_is_reported_as_a_skip_when_trackers_are_not_compared(copy, monkeypatch) -> None:
    monkeypatch.setenv("UNIFIEDAMP_COPY_COMPARE", "scale_and_skip")
    divergence = run_steps(copy("skips_growth_step"), C(1024.0, growth_interval=2), "FFF")
    assert divergence is not None and (divergence.step, divergence.what) == (2, "skip")
    assert divergence.causes == ("skips the step that grows",)


def test_a_raise_is_named_with_its_type(copy) -> None:
    class Raising(PaddleRuleCopy):
        def iterate(self, handle, kinds):
            if kinds == "I":
                raise RuntimeError("loss scale at minimum")
            return super().iterate(handle, kinds)

    divergence = run_steps(Raising(), C(1024.0), "FI")
    assert divergence is not None and divergence.causes == ("raises RuntimeError",)
    assert "it raised RuntimeError: loss scale at minimum" in str(divergence)
    assert not math.isnan(divergence.expected.scale)
