"""Hypothesis strategies for scaler configs, step sequences and gradient trees.

Example:
    >>> from hypothesis import given
    >>> @given(configs(), step_sequences())
    ... def check(config, steps):
    ...     assert set(steps) <= set("FIN")
    >>> check()
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from hypothesis import strategies as st

from unifiedamp._tree import leaves, tree_map
from unifiedamp.spec import ScalerConfig

__all__ = ["configs", "configs_for", "finite_trees", "nonfinite_trees", "powers_of_two",
           "step_sequences"]


def powers_of_two(lo: int = -20, hi: int = 40) -> st.SearchStrategy[float]:
    """Scales of the form 2**k: exact in every float format, as usual in practice."""
    return st.integers(lo, hi).map(lambda k: 2.0**k)


# Strategies are built once (at import, or once per dtype) and drawn from many times:
# Hypothesis validates each strategy object the first time it draws from it, and strategies
# built anew in every draw made generating the examples cost more than running them.
_INIT_SCALES = powers_of_two(-130, 127) | st.floats(1e-30, 3e38)
_GROWTH_FACTORS = st.sampled_from([1.0, 2.0, 4.0]) | st.floats(1.0, 8.0)
_BACKOFF_FACTORS = st.sampled_from([0.5, 0.25, 1.0]) | st.floats(0.05, 1.0)
_BOUNDS = st.lists(st.floats(1e-30, 1e30), min_size=2, max_size=2)
_DYNAMIC = st.sampled_from([True, True, True, False])


@st.composite
def configs(draw: Any) -> ScalerConfig:
    """Valid dynamic-scaling configs, biased towards the edges the spec cares about:
    factors of 1, non-power-of-two factors, short intervals, hysteresis, clamps,
    scales near float32's limits, static mode.
    """
    init = draw(_INIT_SCALES)
    growth = draw(_GROWTH_FACTORS)
    backoff = draw(_BACKOFF_FACTORS)
    bounds = sorted(draw(_BOUNDS))
    # Bounds hold init_scale, as a valid config needs.
    min_scale = min(bounds[0], init) if draw(st.booleans()) else None
    max_scale = max(bounds[1], init) if draw(st.booleans()) else None
    return ScalerConfig(
        init, growth, backoff, draw(st.integers(1, 6)),
        hysteresis=draw(st.integers(1, 3)), min_scale=min_scale, max_scale=max_scale,
        dynamic=draw(_DYNAMIC),
    )


def configs_for(adapter: Any, fit: Any) -> st.SearchStrategy[ScalerConfig]:
    """:func:`configs` within an adapter's config space: ``fit(adapter, config)`` sets the
    fields the scaler cannot change and returns ``None`` for a config it cannot run,
    which is then drawn again."""
    return configs().map(lambda config: fit(adapter, config)).filter(
        lambda config: config is not None)


def step_sequences(max_size: int = 30) -> st.SearchStrategy[str]:
    """Iterations whose gradients are finite (F), hold an inf (I) or a NaN (N)."""
    return st.text(alphabet="FIN", max_size=max_size)


def _signed_power(m: int, k: int, sign: float) -> float:
    return sign * m * 2.0**k


# Magnitudes 2**-8 .. 2**4 or zero, so that scaling by 2**-4 .. 2**8 neither
# overflows nor leaves the normal range, even in float16: scale-then-unscale
# is then exact.
_VALUES = st.lists(st.builds(_signed_power, st.integers(1, 7), st.integers(-8, 1),
                             st.sampled_from([1.0, -1.0])) | st.just(0.0),
                   min_size=1, max_size=6)


@functools.cache
def _leaf(dtype: str) -> st.SearchStrategy[np.ndarray]:
    return _VALUES.map(functools.partial(np.array, dtype=dtype))


def finite_trees(dtypes: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """Nested dicts/lists of finite arrays of the given dtypes (possibly empty)."""
    return _finite_trees(tuple(dtypes))


@functools.cache
def _finite_trees(dtypes: tuple[str, ...]) -> st.SearchStrategy[Any]:
    leaves = st.sampled_from(dtypes).flatmap(_leaf)
    return st.recursive(
        st.lists(leaves, max_size=3),
        lambda children: st.dictionaries(st.sampled_from("abcd"), children, max_size=3)
        | st.lists(children, max_size=3),
        max_leaves=8,
    )


@functools.cache
def _nonempty_trees(dtypes: tuple[str, ...]) -> st.SearchStrategy[Any]:
    return _finite_trees(dtypes).filter(lambda t: len(leaves(t)) > 0)


@st.composite
def nonfinite_trees(draw: Any, dtypes: tuple[str, ...]) -> Any:
    """A finite tree with one element of one leaf set to +inf, -inf or NaN."""
    tree = draw(_nonempty_trees(tuple(dtypes)))
    target = draw(st.integers(0, len(leaves(tree)) - 1))
    bad = draw(st.sampled_from([np.inf, -np.inf, np.nan]))
    counter = iter(range(len(leaves(tree))))

    def poison(leaf: np.ndarray) -> np.ndarray:
        leaf = leaf.copy()
        if next(counter) == target:
            leaf[draw(st.integers(0, leaf.size - 1))] = bad
        return leaf

    return tree_map(poison, tree)

