"""What a compiled step costs, read from XLA's optimized program: the kernels it launches.

Used by ``tests/jax/test_compiled_program.py`` (the targets of a scaled step) and
``benchmarks/bench_jax.py`` (the same numbers beside the times). The ENTRY computation's
instructions are what the runtime executes, each a kernel (a fusion, a dot, a custom call)
or a copy; a ``conditional`` runs one of its branches, so it counts as itself plus the
largest branch (the step taken when the gradients are finite). Parameters, constants,
tuples, tuple elements and bitcasts launch nothing and are not counted.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["ProgramCounts", "program_counts"]

_FREE = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                   "after-all", "partition-id", "replica-id"})
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_SHAPE = re.compile(r"\[([\d,]*)\]")


def _dims(shape: str) -> tuple[int, ...]:
    """The sorted dimensions of an array type (a transposed copy has the same)."""
    found = _SHAPE.search(shape)
    return tuple(sorted(int(d) for d in found.group(1).split(",") if d)) if found else ()


@dataclass(frozen=True)
class ProgramCounts:
    """The kernels of one compiled step (:func:`program_counts`).

    Attributes:
        ops: Kernels and copies a finite step runs, by opcode (a conditional's largest
            branch included, the ``conditional`` itself counted once).
        param_copies: Copies whose result has a parameter's element count (of ``sizes``).
        bytes_accessed: XLA's ``cost_analysis()`` estimate.
        flops: XLA's ``cost_analysis()`` estimate.
        lines: Lines of the optimized HLO text.
    """

    ops: Counter
    param_copies: int
    bytes_accessed: float
    flops: float
    lines: int

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def split(self) -> tuple[int, int, int]:
        """``(fusions, copies, dots)``; a dot includes XLA's custom-call matmuls."""
        return (self.ops["fusion"], self.ops["copy"],
                self.ops["dot"] + self.ops["custom-call"])

    def row(self, plain: ProgramCounts | None = None) -> str:
        fusion, copy, dot = self.split()
        cond = f", {self.ops['conditional']} cond" if self.ops["conditional"] else ""
        text = (f"{self.total} ops ({fusion} fusion / {copy} copy / {dot} dot{cond}),"
                f" {self.param_copies} param-sized copies, {self.bytes_accessed / 1e6:.2f} MB")
        if plain is not None:
            text += (f" ({self.total - plain.total:+d} ops, "
                     f"{self.bytes_accessed / plain.bytes_accessed:.3f}x bytes)")
        return text


def _split_type(rest: str) -> tuple[str, str]:
    """``(type, what follows)`` for an instruction's text after ``=``."""
    if not rest.startswith("("):
        head, _, tail = rest.partition(" ")
        return head, tail
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[:i + 1], rest[i + 1:].lstrip()
    return rest, ""


def _parse(text: str) -> tuple[dict[str, list[tuple[str, str, str]]], str]:
    computations: dict[str, list[tuple[str, str, str]]] = {}
    entry = ""
    current = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and not line.startswith((" ", "HloModule")):
                current = computations.setdefault(header.group(2), [])
                if header.group(1):
                    entry = header.group(2)
            continue
        if line.startswith("}"):
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if match:
            shape, rest = _split_type(line[match.end():])
            current.append((rest.partition("(")[0].strip(), shape, rest))
    return computations, entry


def _count(computations: dict[str, Any], name: str,
           shapes: frozenset[tuple[int, ...]]) -> tuple[Counter, int]:
    ops: Counter = Counter()
    copies = 0
    for opcode, shape, rest in computations[name]:
        if opcode in _FREE:
            continue
        ops[opcode] += 1
        if opcode == "copy":
            copies += _dims(shape) in shapes
        if opcode in ("conditional", "while", "call"):
            called = re.findall(r"%([\w.\-]+)", rest.partition("computations=")[2]
                                or rest.partition("body=")[2] or rest.partition("to_apply=")[2])
            branches = [_count(computations, c, shapes) for c in called if c in computations]
            if branches:
                b_ops, b_copies = max(branches, key=lambda b: sum(b[0].values()))
                ops += b_ops
                copies += b_copies
    return ops, copies


def program_counts(compiled: Any, params: Any = ()) -> ProgramCounts:
    """The counts of a ``jax.jit(f).lower(...).compile()``; a copy is parameter-sized when
    its shape is a leaf's of ``params`` (a pytree of arrays; transposed too).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> x = jnp.ones(4)
        >>> c = program_counts(jax.jit(lambda x: x * 2 + 1).lower(x).compile(), [x])
        >>> c.total, c.param_copies
        (1, 0)
    """
    text = compiled.as_text()
    computations, entry = _parse(text)
    import jax

    shapes = frozenset(tuple(sorted(leaf.shape)) for leaf in jax.tree.leaves(params)
                       if leaf.ndim)
    ops, copies = _count(computations, entry, shapes)
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    cost = cost or {}
    return ProgramCounts(ops, copies, float(cost.get("bytes accessed", 0.0)),
                         float(cost.get("flops", 0.0)), len(text.splitlines()))
