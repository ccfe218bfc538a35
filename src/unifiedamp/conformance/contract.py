"""The contract every scaler must honour, as pytest test methods to inherit.

Subclass :class:`ScalerContract` in a test module and provide an ``adapter``
fixture (see :mod:`unifiedamp.conformance.interface`)::

    import pytest
    from unifiedamp.conformance import ScalerContract

    class TestMyScaler(ScalerContract):
        backend = "mine"            # selects entries of an xfails file, if any

        @pytest.fixture
        def adapter(self):
            return MyScaler.conformance_adapter()

Each test checks one behaviour and is named after it. A test that needs a
capability the adapter does not declare is skipped, with the reason.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from unifiedamp import spec
from unifiedamp._tree import tree_map
from unifiedamp.conformance import strategies
from unifiedamp.conformance._runner import describe_scale, normalise, run_steps, run_vector, same
from unifiedamp.conformance._state_checks import (
    check_loaded,
    check_resume,
    check_saved,
    load_causes,
)
from unifiedamp.conformance.interface import CAPABILITIES
from unifiedamp.spec import ScalerConfig, ScalerState

DEFAULT_MAX_EXAMPLES = 200

#: Test class -> what its adapter said about itself; the plugin prints it at the end.
SEEN: dict[str, dict[str, Any]] = {}

__all__ = ["DEFAULT_MAX_EXAMPLES", "ScalerContract", "fit", "require"]


def require(adapter: Any, capability: str) -> None:
    """Skips the calling test unless the adapter declares ``capability``."""
    if capability not in adapter.capabilities:
        pytest.skip(f"{adapter.name} does not declare capability {capability!r} "
                    f"({CAPABILITIES[capability]})")


def fit(adapter: Any, config: ScalerConfig) -> ScalerConfig | None:
    """``config`` within the adapter's config space: its :attr:`~Adapter.fixed` fields set,
    or ``None`` where the scaler cannot run it even so.

    Example:
        >>> from unifiedamp.conformance.interface import Adapter
        >>> class NoHysteresis(Adapter):
        ...     fixed = {"hysteresis": 1}
        >>> fit(NoHysteresis(), ScalerConfig(8.0, hysteresis=3)).hysteresis
        1
    """
    fixed = getattr(adapter, "fixed", {})
    try:
        config = config.replace(**{k: v(config) if callable(v) else v for k, v in fixed.items()})
    except ValueError:
        return None
    return config if _why_not(adapter, config) is None else None


def _why_not(adapter: Any, config: ScalerConfig) -> str | None:
    """Why the adapter's scaler cannot run ``config`` (its ``expresses``), or ``None``."""
    expresses = getattr(adapter, "expresses", None)
    return None if expresses is None else expresses(config)


def _fitted(adapter: Any, config: ScalerConfig, *, strict: bool = False) -> ScalerConfig:
    """``fit``, or a skip that says why the scaler cannot run the test's config
    (``strict``: the test is about that config, so it may not be changed either)."""
    fitted = fit(adapter, config)
    if fitted is None or (strict and fitted != config):
        why = _why_not(adapter, config) or "outside its config space"
        pytest.skip(f"{adapter.name} cannot run this test's config {config.to_dict()}: {why}")
    return fitted


def _same(adapter: Any, expected: ScalerState, got: ScalerState) -> bool:
    return same(expected, got, getattr(adapter, "compare", "full"))


def _hypothesis(check: Any, adapter: Any) -> None:
    # A scaler with a small config space rejects most generated configs: that is not a
    # failure of the scaler, and not a pass either.
    try:
        check()
    except Unsatisfiable as exc:
        why = _why_not(adapter, ScalerConfig())
        pytest.skip(f"too few generated configs are in {adapter.name}'s config space"
                    + (f" (the default config: {why})" if why else "")
                    + f": {str(exc).split('. ')[0]}")


def _hex(leaf: Any) -> tuple[str, tuple[int, ...], str]:
    # Bitwise comparison of leaves, NaN-safe and dtype-aware.
    a = np.asarray(leaf)
    return (str(a.dtype), a.shape, a.tobytes().hex())


def _hex_tree(tree: Any) -> Any:
    return tree_map(_hex, tree)


def _dtypes(tree: Any) -> Any:
    return tree_map(lambda leaf: str(np.asarray(leaf).dtype), tree)


# Random configs reach subnormal scales on purpose; the collapse warning is for training loops.
@pytest.mark.filterwarnings("ignore::unifiedamp.ScaleCollapseWarning")
class ScalerContract:
    """Contract tests for one scaler, driven through the ``adapter`` fixture."""

    #: The backend name used to look up known deviations in an xfails file.
    backend: str | None = None

    @pytest.fixture
    def adapter(self) -> Any:
        raise NotImplementedError(
            "provide an 'adapter' fixture returning your scaler's conformance adapter"
        )

    @pytest.fixture(autouse=True)
    def _record_adapter(self, adapter: Any) -> None:
        if type(self).__name__ not in SEEN:
            SEEN[type(self).__name__] = {
                "adapter": adapter.name, **adapter.info(),
                "capabilities": sorted(adapter.capabilities),
                "not_declared": sorted(set(CAPABILITIES) - set(adapter.capabilities))}

    @pytest.fixture
    def max_examples(self, request: pytest.FixtureRequest) -> int:
        """Hypothesis examples per property: --unifiedamp-max-examples, then
        UNIFIEDAMP_MAX_EXAMPLES, then 200."""
        option = None
        try:
            option = request.config.getoption("unifiedamp_max_examples")
        except ValueError:  # the plugin is not loaded
            pass
        return int(option or os.environ.get("UNIFIEDAMP_MAX_EXAMPLES") or DEFAULT_MAX_EXAMPLES)

    def _settings(self, max_examples: int) -> settings:
        # derandomize: the same examples on every run, so a verdict never changes between runs.
        return settings(max_examples=max_examples, deadline=None, database=None,
                        derandomize=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                               HealthCheck.function_scoped_fixture])

    # ------------------------------------------------------------ the update rule

    @pytest.mark.parametrize("vector", spec.VECTORS, ids=lambda v: v.name)
    def test_vector(self, adapter: Any, vector: spec.Vector) -> None:
        """The fixed table: growth timing, backoff, hysteresis, clamps, inf guard, NaN,
        interval 1, lowered interval, static mode, non-power-of-two factors in float32."""
        _require_vector(adapter, vector)
        divergence = run_vector(adapter, vector)
        assert divergence is None, str(divergence)

    @pytest.mark.parametrize("vector", spec.VECTORS, ids=lambda v: v.name)
    def test_vector_compiled(self, adapter: Any, vector: spec.Vector) -> None:
        """The same table through the framework's compiler (capability ``jit``)."""
        require(adapter, "jit")
        _require_vector(adapter, vector)
        divergence = run_vector(adapter, vector, compiled=True)
        assert divergence is None, f"compiled: {divergence}"

    def test_random_configs_and_steps_match_reference(self, adapter: Any,
                                                      max_examples: int) -> None:
        @self._settings(max_examples)
        @given(strategies.configs_for(adapter, fit), strategies.step_sequences())
        def check(config: ScalerConfig, steps: str) -> None:
            divergence = run_steps(adapter, config, steps, name="random")
            assert divergence is None, str(divergence)

        _hypothesis(check, adapter)

    def test_inf_in_any_of_two_optimizers_backs_off_once(self, adapter: Any) -> None:
        require(adapter, "multi_optimizer")
        config = _fitted(adapter, ScalerConfig(1024.0, growth_interval=2))
        for kinds in ("IF", "FI", "NF", "II"):
            handle = adapter.new(config, optimizers=2)
            handle = adapter.iterate(handle, "FF")
            handle = adapter.iterate(handle, kinds)
            got = normalise(adapter.read(handle))
            expected = ScalerState(512.0, 0, 0)
            assert _same(adapter, expected, got), (
                "[an inf in one of two optimizers is not one overflow] "
                f"optimizer gradients {kinds!r} after one finite step: expected {expected}, "
                f"got {got}; config {config.to_dict()}")

    # ------------------------------------------------------------ skipping

    def test_skipped_step_leaves_params_and_optimizer_state_untouched(self,
                                                                       adapter: Any) -> None:
        handle = adapter.new(_fitted(adapter, ScalerConfig(1024.0)))
        handle = adapter.iterate(adapter.iterate(handle, "F"), "F")
        before: Any = None  # bound by the loop, for the check after it
        for kind in "IN":
            before = adapter.snapshot(handle)
            handle = adapter.iterate(handle, kind)
            after = adapter.snapshot(handle)
            assert _hex_tree(after) == _hex_tree(before), (
                "[a skipped step changes the parameters or optimizer state] "
                f"a step with {'an inf' if kind == 'I' else 'a NaN'} gradient changed the "
                "parameters or the optimizer state")
        handle = adapter.iterate(handle, "F")
        assert _hex_tree(adapter.snapshot(handle)) != _hex_tree(before), (
            "[the adapter's snapshot does not see the optimizer] a finite step changed "
            "nothing")

    def test_the_growth_step_is_unscaled_with_the_old_scale(self, adapter: Any) -> None:
        """The step whose update grows the scale was scaled by the old scale and must be
        unscaled by it: with power-of-two scales the parameters then move exactly as in a
        run whose scale never grows. A scaler that updates the scale before it unscales
        steps with gradients ``growth_factor`` times too small."""
        growing = _fitted(adapter, ScalerConfig(1024.0, growth_interval=2), strict=True)
        steady = _fitted(adapter, ScalerConfig(1024.0, growth_interval=1000), strict=True)
        a, b = adapter.new(growing), adapter.new(steady)
        for step in range(1, 5):
            a, b = adapter.iterate(a, "F"), adapter.iterate(b, "F")
            scale = normalise(adapter.read(a)).scale
            assert _hex_tree(adapter.snapshot(a)) == _hex_tree(adapter.snapshot(b)), (
                "[unscales the growth step with the new scale] "
                f"after finite step {step} (scale now {scale}, growth_interval 2) the "
                "parameters differ from a run at a steady scale of 1024: a step that grew "
                "the scale was unscaled with the new scale, not the old one")

    # ------------------------------------------------------------ scale / unscale

    def test_scale_then_unscale_is_identity_and_keeps_dtype(self, adapter: Any,
                                                            max_examples: int) -> None:
        require(adapter, "scale_tree")
        require(adapter, "functional_unscale")

        @self._settings(max_examples)
        @given(strategies.powers_of_two(-4, 8), strategies.finite_trees(adapter.dtypes))
        def check(scale: float, tree: Any) -> None:
            handle = adapter.new(_fitted(adapter, ScalerConfig(scale)))
            scaled = adapter.scale_tree(handle, tree)
            assert _dtypes(scaled) == _dtypes(tree), (
                f"[scale() changes a leaf's dtype] {_dtypes(tree)} became {_dtypes(scaled)}")
            unscaled, finite = adapter.unscale_tree(handle, scaled)
            assert finite is True, "[reports finite gradients non-finite] after scale()"
            assert _hex_tree(unscaled) == _hex_tree(tree), (
                f"[unscale(scale(x)) is not x] with scale {scale}")

        _hypothesis(check, adapter)

    def test_found_inf_for_any_inf_or_nan_leaf(self, adapter: Any, max_examples: int) -> None:
        require(adapter, "functional_unscale")

        @self._settings(max_examples)
        @given(strategies.nonfinite_trees(adapter.dtypes))
        def check(tree: Any) -> None:
            _, finite = adapter.unscale_tree(adapter.new(_fitted(adapter, ScalerConfig(8.0))),
                                             tree)
            assert finite is False, "[misses an inf or NaN leaf] the tree was reported finite"

        _hypothesis(check, adapter)

    def test_large_finite_gradients_are_finite(self, adapter: Any) -> None:
        """The check is on the gradients as given (scaled), as torch's kernel does: finite
        values near float32's maximum are finite, even where unscaling takes them past
        it, and even where their sum would overflow."""
        require(adapter, "functional_unscale")
        tree = {"g": np.full(4, 3e38, np.float32), "h": [np.full(2, -3e38, np.float32)]}
        _, finite = adapter.unscale_tree(adapter.new(_fitted(adapter, ScalerConfig(2.0**-10))),
                                         tree)
        assert finite is True, (
            "[counts finite gradients that unscaling overflows as inf] finite gradients of "
            "3e38 were reported non-finite at a scale of 2**-10")

    def test_no_inf_found_in_empty_or_finite_trees(self, adapter: Any,
                                                   max_examples: int) -> None:
        require(adapter, "functional_unscale")
        config = _fitted(adapter, ScalerConfig(8.0))
        handle = adapter.new(config)
        empty: object
        for empty in ([], {}, [[], {}]):
            assert adapter.unscale_tree(handle, empty)[1] is True, (
                f"[reports finite gradients non-finite] {empty!r}")

        @self._settings(max_examples)
        @given(strategies.finite_trees(adapter.dtypes))
        def check(tree: Any) -> None:
            assert adapter.unscale_tree(adapter.new(config), tree)[1] is True, (
                "[reports finite gradients non-finite] a finite tree")

        _hypothesis(check, adapter)

    # ------------------------------------------------------------ state_dict

    def test_state_dict_round_trip_mid_interval(self, adapter: Any) -> None:
        require(adapter, "state_dict")
        config = _fitted(adapter, ScalerConfig(1024.0, growth_interval=4, hysteresis=2))
        for prefix in ("FF", "FFFFFI"):  # mid-growth, then mid-hysteresis
            check_resume(adapter, adapter, config, prefix, "FFIIFFFFIF",
                         fit(adapter, ScalerConfig()) or config)

    def test_every_reachable_state_reloads(self, adapter: Any, max_examples: int) -> None:
        """A scaler reloads whatever it wrote: after random configs and steps, and after
        backoffs that take the scale to 0, save -> JSON -> load gives the same state."""
        require(adapter, "state_dict")

        def reload(config: ScalerConfig, steps: str) -> None:
            handle = adapter.new(config)
            for kind in steps:
                handle = adapter.iterate(handle, kind)
            saved = normalise(adapter.read(handle))
            try:
                d = json.loads(json.dumps(adapter.save(handle)))
            except (TypeError, ValueError) as exc:
                # A state no canonical dict holds (an inf scale): why the scaler got there.
                divergence = run_steps(adapter, config, steps)
                causes = f"[{'; '.join(divergence.causes)}] " if divergence else ""
                raise AssertionError(
                    f"{causes}saving the state {tuple(saved)} reached after {steps!r} raised "
                    f"{type(exc).__name__}: {exc}; config {config.to_dict()}") from None
            check_saved(d, saved, f"after {steps!r}")
            fresh = adapter.new(_fitted(adapter, ScalerConfig()))
            got = normalise(adapter.read(adapter.load(fresh, d)))
            assert _same(adapter, saved, got), (
                f"{load_causes(saved, got, getattr(adapter, 'compare', 'full'))} "
                f"saved after {steps!r}: scale {describe_scale(saved.scale)}, trackers "
                f"{saved.growth_tracker}, {saved.hysteresis_tracker}; reloaded: scale "
                f"{describe_scale(got.scale)}, trackers {got.growth_tracker}, "
                f"{got.hysteresis_tracker}; config {config.to_dict()}")

        reload(_fitted(adapter, ScalerConfig(2.0**-148)), "III")  # the scale reaches 0

        @self._settings(max_examples)
        @given(strategies.configs_for(adapter, fit), strategies.step_sequences())
        def check(config: ScalerConfig, steps: str) -> None:
            reload(config, steps)

        _hypothesis(check, adapter)

    def test_a_loaded_tracker_past_the_interval_grows_on_the_next_finite_step(
            self, adapter: Any) -> None:
        """A state reached by lowering the interval, then saved and loaded: the next finite
        update grows (``>=``; torch's kernel tests ``tracker + 1 == interval``)."""
        require(adapter, "state_dict")
        config = _fitted(adapter, ScalerConfig(1024.0, growth_interval=5))
        loaded = ScalerState(1024.0, 7, 0)
        d = spec.to_state_dict(config, loaded, "reference")
        handle = adapter.load(adapter.new(config.replace(growth_interval=100)), d)
        check_loaded(adapter, loaded, handle)
        divergence = run_steps(adapter, config, "F", name="loaded with growth_tracker 7, "
                               "growth_interval 5", handle=handle, start=loaded)
        assert divergence is None, str(divergence)

    def test_static_mode_resets_the_trackers_of_a_loaded_state(self, adapter: Any) -> None:
        require(adapter, "state_dict")
        config = _fitted(adapter, ScalerConfig(64.0, growth_interval=5, hysteresis=3,
                                               dynamic=False), strict=True)
        d = spec.to_state_dict(config, ScalerState(64.0, 2, 1), "reference")
        handle = adapter.load(adapter.new(_fitted(adapter, ScalerConfig())), d)
        check_loaded(adapter, ScalerState(64.0, 2, 1), handle)
        divergence = run_steps(adapter, config, "F", name="a static state with trackers 2, 1",
                               handle=handle, start=ScalerState(64.0, 2, 1))
        assert divergence is None, str(divergence)

    def test_loading_keeps_enabled_as_the_scaler_was_built(self, adapter: Any) -> None:
        """Whether to scale belongs to the run (device, dtype), not to the checkpoint."""
        require(adapter, "state_dict")
        for built, saved in ((False, True), (True, False)):
            d = spec.to_state_dict(_fitted(adapter, ScalerConfig(64.0, enabled=saved)),
                                   ScalerState(64.0), "reference")
            built_config = _fitted(adapter, ScalerConfig(8.0, enabled=built), strict=True)
            try:
                written = adapter.save(adapter.load(adapter.new(built_config), d))
            except (TypeError, ValueError) as exc:
                cause = "[a disabled scaler saves no state]" if not built else "[raises on load]"
                raise AssertionError(f"{cause} built with enabled={built}, loading and saving "
                                     f"raised {type(exc).__name__}: {exc}") from None
            assert written["config"]["enabled"] is built, (
                "[load takes enabled from the state dict] "
                f"a scaler built with enabled={built} took enabled={saved} from a state dict")

    def test_state_dict_moves_between_backends(self, adapter: Any) -> None:
        require(adapter, "state_dict")
        from unifiedamp.backends.numpy import NumpyGradScaler
        from unifiedamp.conformance.adapters.numpy import NumpyAdapter

        reference = NumpyAdapter(NumpyGradScaler)
        config = _fitted(adapter, ScalerConfig(1024.0, 3.0, 0.25, 3, hysteresis=2,
                                               min_scale=2.0))
        for source, target in ((adapter, reference), (reference, adapter)):
            for prefix in ("FF", "FFFI"):
                check_resume(source, target, config, prefix, "FIIFFFIIIF",
                             fit(target, ScalerConfig()) or config)

    # ------------------------------------------------------------ enabled=False

    def test_disabled_scaler_is_a_pass_through(self, adapter: Any) -> None:
        require(adapter, "disable")
        config = _fitted(adapter, ScalerConfig(1024.0, growth_interval=1, enabled=False))
        handle = adapter.new(config)
        if "scale_tree" in adapter.capabilities:
            tree = {"loss": np.array([3.0], adapter.dtypes[0])}
            assert _hex_tree(adapter.scale_tree(handle, tree)) == _hex_tree(tree), (
                "[a disabled scaler scales the loss]")
        for kind in "IF":
            before = adapter.snapshot(handle)
            handle = adapter.iterate(handle, kind)
            assert _hex_tree(adapter.snapshot(handle)) != _hex_tree(before), (
                f"[a disabled scaler skips a step] ({kind})")
            got = normalise(adapter.read(handle))
            cause = ("a disabled scaler's state moves" if got.scale == 1024.0
                     else f"a disabled scaler reports a scale of {got.scale!r}")
            assert _same(adapter, ScalerState(1024.0, 0, 0), got), (
                f"[{cause}] a disabled scaler's state moved after a {kind!r} step: scale "
                f"{describe_scale(got.scale)}, trackers {got.growth_tracker}, "
                f"{got.hysteresis_tracker} (expected 1024.0, 0, 0)")
        if "state_dict" in adapter.capabilities:
            assert adapter.save(handle)["config"]["enabled"] is False, (
                "[a disabled scaler saves enabled=True]")

    # ------------------------------------------------------------ compilation, ranks

    def test_inf_on_one_rank_skips_on_every_rank(self, adapter: Any) -> None:
        require(adapter, "distributed")
        config = _fitted(adapter, ScalerConfig(1024.0, growth_interval=2))
        handle = adapter.new(config)
        states = adapter.distributed_iterate(handle, ["F", "I"])
        expected = spec.update(config, ScalerState.initial(config), True)
        for rank, state in enumerate(states):
            assert _same(adapter, expected, normalise(state)), (
                f"[ranks disagree after an inf on one rank] rank {rank}: expected {expected}, "
                f"got {state} after an inf on rank 1 only")


def _require_vector(adapter: Any, vector: spec.Vector) -> None:
    """Skips a vector the scaler cannot run, naming the field that is out of its reach."""
    config = ScalerConfig(**vector.config)
    for changes in [{}, *vector.changes.values()]:
        config = config.replace(**changes)
        if changes:
            require(adapter, "set_config")
        if fit(adapter, config) != config:
            why = _why_not(adapter, config) or "outside its config space"
            pytest.skip(f"{adapter.name} cannot run vector {vector.name}: {why}")
