"""Nested containers of arrays, walked one way: dicts, lists, tuples and NamedTuples.

For the places without a tree library of their own (the NumPy and torch
backends, the conformance suite); the JAX and MLX backends use ``jax.tree`` and
``mlx.utils``. Anything that is not one of these containers is a leaf, ``None``
included. Containers keep their type and their order (dict insertion order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unifiedamp.errors import ForeignArrayError

__all__ = ["leaves", "refuse_foreign", "tree_map"]

#: The containers walked; anything else is a leaf.
_CONTAINERS = (dict, list, tuple)


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """The tree with ``fn`` applied to every leaf (to the leaves at the same place in
    ``tree`` and each of ``rest``, trees of the same structure).

    Example:
        >>> from typing import NamedTuple
        >>> class Pair(NamedTuple):
        ...     a: float
        ...     b: float
        >>> tree_map(lambda x: x * 2, {"p": Pair(1, 2), "l": [3, (4,)]})
        {'p': Pair(a=2, b=4), 'l': [6, (8,)]}
        >>> tree_map(lambda x, y: x + y, [1, (2,)], [10, (20,)])
        [11, (22,)]
    """
    # With one tree (the usual case) a leaf is handed to fn where its container is mapped,
    # with no call of this function per leaf: the torch backend maps gradients at every
    # step, where each Python call is host time (tests/torch/test_call_counts.py).
    if isinstance(tree, dict):
        for other in rest:
            if not isinstance(other, dict) or other.keys() != tree.keys():
                raise ValueError(_mismatch(tree, other))
        if not rest:
            return {key: tree_map(fn, value) if isinstance(value, _CONTAINERS) else fn(value)
                    for key, value in tree.items()}
        return {key: tree_map(fn, value, *(other[key] for other in rest))
                for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        for other in rest:
            if not isinstance(other, (list, tuple)) or len(other) != len(tree):
                raise ValueError(_mismatch(tree, other))
        if not rest:
            mapped = [tree_map(fn, value) if isinstance(value, _CONTAINERS) else fn(value)
                      for value in tree]
        else:
            mapped = [tree_map(fn, value, *others)
                      for value, *others in zip(tree, *rest, strict=True)]
        # A NamedTuple is built from its fields, a plain tuple or list from one iterable.
        return type(tree)(*mapped) if hasattr(tree, "_fields") else type(tree)(mapped)
    return fn(tree, *rest)


def _mismatch(tree: Any, other: Any) -> str:
    return (f"the trees differ in structure: {type(tree).__name__} of "
            f"{len(tree)} against {type(other).__name__} {other!r:.80}")


def leaves(tree: Any) -> list[Any]:
    """Every leaf of the tree, in container order.

    Example:
        >>> leaves({"a": [1, 2], "b": (3, {"c": 4}), "d": []})
        [1, 2, 3, 4]
    """
    out: list[Any] = []
    tree_map(out.append, tree)
    return out


#: The module that defines a leaf's type -> the backend of its framework.
_BACKEND_OF_MODULE = {"numpy": "numpy", "torch": "torch", "paddle": "paddle", "jax": "jax",
                      "jaxlib": "jax", "mlx": "mlx", "tensorflow": "keras", "keras": "keras"}


def refuse_foreign(tree: Any, *, what: str, own: tuple[str, ...], expected: str,
                   convert: str) -> None:
    """Raises :class:`~unifiedamp.errors.ForeignArrayError` for the first leaf that is an
    array of a framework other than ``own`` (top-level module names): converting it quietly
    would copy it, to the host or across devices, behind the user's back.

    Example:
        >>> import numpy as np
        >>> refuse_foreign([np.ones(1)], what="scale()", own=("torch",),
        ...                expected="torch tensors", convert="torch.as_tensor")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unifiedamp.errors.ForeignArrayError: scale() takes torch tensors or a list/tuple/dict \
of them, got a numpy.ndarray leaf of shape (1,) and dtype float64; convert it with \
torch.as_tensor, or use backend='numpy' for its arrays
    """
    for leaf in leaves(tree):
        root = type(leaf).__module__.partition(".")[0]
        if root in _BACKEND_OF_MODULE and root not in own:
            shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
            kind = f" of shape {tuple(shape)} and dtype {dtype}" if shape is not None else ""
            raise ForeignArrayError(
                f"{what} takes {expected} or a list/tuple/dict of them, got a "
                f"{root}.{type(leaf).__name__} leaf{kind}; convert it with {convert}, "
                f"or use backend={_BACKEND_OF_MODULE[root]!r} for its arrays")
