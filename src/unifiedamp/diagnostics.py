"""Why a step was skipped, and what the scale did: framework-free report and history types.

Every backend fills these: the imperative scalers (torch, numpy, paddle, keras) from
``scaler.overflow_report()`` and ``scaler.history()``, the functional ones (jax, mlx)
from arrays their jitted steps return (``docs/diagnostics.md``). Nothing here imports
a framework; NumPy is imported where an array is counted, matplotlib only to plot.

Example:
    >>> import numpy as np
    >>> from unifiedamp.diagnostics import OverflowReport, count_overflow
    >>> grads = {"fc1.weight": np.ones(3, np.float32),
    ...          "fc2.weight": np.array([1.0, np.inf, np.nan], np.float32)}
    >>> report = OverflowReport(step=7, scale=65536.0, checked=2, loss_finite=True,
    ...     overflows=[o for n, g in grads.items() if (o := count_overflow(n, g))])
    >>> report.names
    ['fc2.weight']
    >>> print(report)  # doctest: +NORMALIZE_WHITESPACE
    Step 7 was skipped at scale 65536: 1 of 2 gradients held inf/NaN.
      fc2.weight (3,): 1 inf, 1 NaN, largest finite |g| 1
    The loss was finite before scaling: the scaled gradients overflowed float16 and
    the scaler backs off, as designed.
"""

from __future__ import annotations

import json
import math
import numbers
import os

from unifiedamp._atomic_write import atomic_path, write_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any, Protocol

    class _Ring(Protocol):
        """A ring's array: a sequence, or a NumPy/device array read on the host."""

        def __len__(self) -> int: ...
        def __getitem__(self, index: int, /) -> Any: ...

__all__ = ["GradientOverflow", "OverflowReport", "ScaleHistory", "count_overflow",
           "plot_history", "FIXES"]

#: The usual fixes when the model, not the scale, makes the gradients non-finite.
FIXES = ("lower the learning rate, train in bfloat16 (no loss scaling needed), or clip "
         "the gradients after unscaling them (torch/paddle: scaler.unscale_(optimizer), then "
         "clip the norm; optax: clip_by_global_norm inside loss_scaled)")


class GradientOverflow:
    """One gradient that held inf or NaN.

    Attributes:
        name: The parameter's name (from ``scaler.watch(model)``, a tree path, or
            ``param_groups[g][i]``).
        shape: The gradient's shape.
        inf: How many elements were +inf or -inf.
        nan: How many were NaN.
        max_finite: The largest finite magnitude among the others (0.0 if none).
    """

    __slots__ = ("name", "shape", "inf", "nan", "max_finite")

    def __init__(self, name: str, shape: Sequence[int], inf: int, nan: int, max_finite: float):
        self.name = str(name)
        self.shape = tuple(int(n) for n in shape)
        self.inf = int(inf)
        self.nan = int(nan)
        self.max_finite = float(max_finite)

    def __repr__(self) -> str:
        return (f"GradientOverflow({self.name!r}, shape={self.shape}, inf={self.inf}, "
                f"nan={self.nan}, max_finite={self.max_finite!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GradientOverflow) and self.to_dict() == other.to_dict()

    def __str__(self) -> str:
        shape = "(" + ", ".join(map(str, self.shape)) + ("," if len(self.shape) == 1 else "") + ")"
        return (f"{self.name} {shape}: {self.inf} inf, {self.nan} NaN, "
                f"largest finite |g| {self.max_finite:.6g}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict; ``GradientOverflow(**d)`` reads it back."""
        return {"name": self.name, "shape": list(self.shape), "inf": self.inf,
                "nan": self.nan, "max_finite": self.max_finite}


def count_overflow(name: str, grad: Any) -> GradientOverflow | None:
    """The :class:`GradientOverflow` of one host array (NumPy, or anything ``np.asarray``
    reads), or None when every element is finite.

    Example:
        >>> import numpy as np
        >>> count_overflow("w", np.array([-np.inf, 2.0, -3.0], np.float32))
        GradientOverflow('w', shape=(3,), inf=1, nan=0, max_finite=3.0)
        >>> count_overflow("b", np.zeros(2)) is None
        True
    """
    import numpy as np

    g = np.asarray(grad)
    finite = np.isfinite(g)
    if finite.all():
        return None
    nan = int(np.isnan(g).sum())
    magnitudes = np.abs(g[finite])
    largest = float(magnitudes.max()) if magnitudes.size else 0.0
    return GradientOverflow(name, g.shape, g.size - int(finite.sum()) - nan, nan, largest)


class OverflowReport:
    """Which gradients held inf/NaN at a skipped step, and whether the loss did.

    Attributes:
        step: The update (counted from 1) whose gradients overflowed.
        scale: The scale the loss had been multiplied by.
        overflows: The gradients that held inf or NaN, in parameter order.
        checked: How many gradients were looked at.
        loss_finite: Whether the loss was finite before scaling (None: not known).
        note: Anything the backend adds (why the gradients were not available...).
    """

    def __init__(self, step: int, scale: float, overflows: Iterable[GradientOverflow],
                 checked: int, loss_finite: bool | None = None, note: str = ""):
        self.step = int(step)
        self.scale = float(scale)
        self.overflows = tuple(overflows)
        self.checked = int(checked)
        self.loss_finite = None if loss_finite is None else bool(loss_finite)
        self.note = str(note)

    @property
    def names(self) -> list[str]:
        """The names of the gradients that held inf or NaN."""
        return [o.name for o in self.overflows]

    def cause(self) -> str:
        """One sentence: the model's fault or the scale's, with what to do (empty when not
        known: the loss was not seen, or no gradient was counted).

        Example:
            >>> OverflowReport(3, 1024.0, [], checked=0, loss_finite=False).cause()[:45]
            'The loss itself was inf/NaN before scaling: t'
        """
        if self.loss_finite is False:
            return ("The loss itself was inf/NaN before scaling: the model, not the scale, "
                    f"is the problem; {FIXES}.")
        if self.loss_finite is True and self.overflows:
            return ("The loss was finite before scaling: the scaled gradients overflowed "
                    "float16 and the scaler backs off, as designed.")
        return ""

    def summary(self, limit: int = 3) -> str:
        """One line: the step, the scale and the first ``limit`` gradients."""
        names = ", ".join(f"{o.name} ({o.inf} inf, {o.nan} NaN)" for o in self.overflows[:limit])
        more = len(self.overflows) - limit
        names += f" and {more} more" if more > 0 else ""
        return f"step {self.step} at scale {self.scale:g}: {names or 'no gradient named'}"

    def collapse_detail(self) -> str:
        """What a collapse warning ends with: this report's summary and its cause."""
        return f"Last overflow: {self.summary()}. {self.cause()}".rstrip()

    def __str__(self) -> str:
        lines = [f"Step {self.step} was skipped at scale {self.scale:g}: "
                 f"{len(self.overflows)} of {self.checked} gradients held inf/NaN."]
        lines += [f"  {o}" for o in self.overflows]
        if self.note:
            lines.append(self.note)
        if self.cause():
            lines.append(self.cause())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"OverflowReport(step={self.step}, scale={self.scale!r}, names={self.names}, "
                f"checked={self.checked}, loss_finite={self.loss_finite})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OverflowReport) and self.to_dict() == other.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``from_dict`` reads it back).

        Example:
            >>> r = OverflowReport(2, 8.0, [GradientOverflow("w", (2,), 1, 0, 0.5)], checked=1)
            >>> OverflowReport.from_dict(r.to_dict()) == r
            True
        """
        return {"step": self.step, "scale": self.scale, "checked": self.checked,
                "loss_finite": self.loss_finite, "note": self.note,
                "overflows": [o.to_dict() for o in self.overflows]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OverflowReport:
        """The report :meth:`to_dict` wrote.

        Raises:
            ValueError: ``d`` is not such a dict (a missing key, an overflow record that
                is not :class:`GradientOverflow`'s dict).
        """
        required = ("step", "scale", "overflows", "checked")
        missing = [k for k in required if not isinstance(d, dict) or k not in d]
        if missing:
            raise ValueError(f"OverflowReport.from_dict: missing {missing} (the dict "
                             f"OverflowReport.to_dict() writes has {list(required)}, "
                             "'loss_finite' and 'note'); got "
                             f"{sorted(d) if isinstance(d, dict) else type(d).__name__}")
        try:
            return cls(d["step"], d["scale"], [GradientOverflow(**o) for o in d["overflows"]],
                       d["checked"], d.get("loss_finite"), d.get("note", ""))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"OverflowReport.from_dict: {exc} (write the dict with "
                             "OverflowReport.to_dict())") from None


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")  # NumPy's


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not _is_bool(value)


class ScaleHistory:
    """Per recorded update: its number (counted from 1), the scale it left (what
    ``get_scale()`` returns after it) and whether it skipped its step.

    One convention with ``unifiedamp plot``, ``unifiedamp demo`` and the loggers
    (``docs/diagnostics.md``, "Steps and scales"): at step n, the scale after the n-th
    update. Backends keep the last N records in a ring on the device (no host read per
    step) and build this from it: :meth:`from_ring`.

    Example:
        >>> # a ring of 3 slots after 4 records: record 4 overwrote record 1 in slot 0
        >>> h = ScaleHistory.from_ring([4, 2, 3], [8.0, 32.0, 16.0], [0, 1, 1], count=4)
        >>> h.as_list()
        [(2, 32.0, True), (3, 16.0, True), (4, 8.0, False)]
        >>> ScaleHistory.from_json(h.to_json()).as_list() == h.as_list()
        True
    """

    def __init__(self, iterations: Iterable[int], scales: Iterable[float],
                 skipped: Iterable[bool]):
        iterations, scales, skipped = list(iterations), list(scales), list(skipped)
        if not len(iterations) == len(scales) == len(skipped):
            raise ValueError(f"iterations, scales and skipped differ in length: "
                             f"{len(iterations)}, {len(scales)}, {len(skipped)}")
        # Everything is checked before anything is kept: a history read from a file is
        # untrusted, and a string "false" must not read as True.
        for k, (i, s, b) in enumerate(zip(iterations, scales, skipped, strict=True)):
            if not _is_int(i) or i < 0:
                raise ValueError(f"iteration {k} must be an int >= 0, got {i!r}")
            if k and i <= iterations[k - 1]:
                raise ValueError(f"iterations must increase, got {iterations[k - 1]!r} then "
                                 f"{i!r} at record {k}")
            if not _is_real(s) or not math.isfinite(s) or s < 0:
                raise ValueError(f"scale {k} must be a finite number >= 0, got {s!r}")
            if not _is_bool(b):
                raise ValueError(f"skipped {k} must be true or false, got {b!r}")
        self.iterations = [int(i) for i in iterations]
        self.scales = [float(s) for s in scales]
        self.skipped = [bool(s) for s in skipped]

    @classmethod
    def from_ring(cls, iterations: _Ring, scales: _Ring, skipped: _Ring,
                  count: int) -> ScaleHistory:
        """Unrolls a ring of N slots where record k (from 0) went to slot k % N and
        ``count`` records were written: the last min(count, N), oldest first."""
        size = len(scales)
        count = int(count)
        order = (range(count) if count <= size
                 else [(count + i) % size for i in range(size)])
        # A ring stores the skip flag as 0/1 in the device's int or bool dtype.
        return cls([iterations[i] for i in order], [scales[i] for i in order],
                   [bool(skipped[i]) for i in order])

    def __len__(self) -> int:
        return len(self.iterations)

    def __repr__(self) -> str:
        return (f"ScaleHistory({len(self)} updates, {sum(self.skipped)} skipped, "
                f"last scale {self.scales[-1] if self.scales else None!r})")

    def as_list(self) -> list[tuple[int, float, bool]]:
        """``[(iteration, scale, skipped), ...]``, oldest first."""
        return list(zip(self.iterations, self.scales, self.skipped, strict=True))

    def as_arrays(self) -> dict[str, Any]:
        """NumPy arrays: ``iteration`` (int64), ``scale`` (float32), ``skipped`` (bool)."""
        import numpy as np

        return {"iteration": np.asarray(self.iterations, np.int64),
                "scale": np.asarray(self.scales, np.float32),
                "skipped": np.asarray(self.skipped, bool)}

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The history as JSON (what ``unifiedamp plot`` reads); written to ``path`` if given.

        ``"scale_after_update": true`` says what the scales are: a file without it was
        written by an earlier release (:meth:`from_json` reads both).
        """
        text = json.dumps({"iteration": self.iterations, "scale": self.scales,
                           "skipped": self.skipped, "scale_after_update": True})
        if path is not None:
            write_bytes(path, (text + "\n").encode())
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike[str]) -> ScaleHistory:
        """Reads :meth:`to_json`'s output: a JSON string or a file's path.

        A file of an earlier release (no ``"scale_after_update"``) recorded the scale each
        update *started* from, which is the scale the update before it left: each record
        takes the scale of the record after it, and the last one (whose scale after its
        update the file does not hold) is left out.

        Example:
            >>> old = '{"iteration": [1, 2, 3], "scale": [8.0, 8.0, 4.0], ' \\
            ...       '"skipped": [false, true, false]}'
            >>> ScaleHistory.from_json(old).as_list()
            [(1, 8.0, False), (2, 4.0, True)]
        """
        text = str(text_or_path)
        if not text.lstrip().startswith(("{", "[")):
            with open(text_or_path, encoding="utf-8") as f:
                text = f.read()
        try:
            d = json.loads(text)
            history = cls(d["iteration"], d["scale"], d["skipped"])
            after = d.get("scale_after_update", False)
            if not isinstance(after, bool):
                raise ValueError(f"scale_after_update must be true or false, got {after!r}")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ValueError(f"not a scale history (a JSON object with 'iteration', 'scale' "
                             f"and 'skipped' lists, as ScaleHistory.to_json writes): {exc}"
                             ) from None
        return history if after else history._from_scales_before()

    def _from_scales_before(self) -> ScaleHistory:
        """This history read as an earlier release wrote it, each scale the one its update
        started from: record n gets record n + 1's scale, where n + 1 is the next record."""
        records = self.as_list()
        kept = [(i, following[1], skipped) for (i, _, skipped), following
                in zip(records, records[1:], strict=False) if following[0] == i + 1]
        return ScaleHistory([r[0] for r in kept], [r[1] for r in kept], [r[2] for r in kept])


def plot_history(history: ScaleHistory, output: str | os.PathLike[str],
                 title: str | None = None) -> None:
    """Draws the scale on a log axis with skipped steps marked, into ``output`` (PNG, SVG...):
    at step n (the n-th update, from 1) the scale that update left, the last one included.

    Needs matplotlib (``pip install 'unifiedamp[demo]'``).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "scale.png")
        >>> plot_history(ScaleHistory([1, 2, 3], [8.0, 4.0, 4.0], [True, False, False]), path)
        >>> open(path, "rb").read(4)
        b'\x89PNG'
    """
    if not len(history):
        raise ValueError("the history is empty: no update was recorded")
    _save_figure(_history_figure(history, title), output)


def _history_figure(history: ScaleHistory, title: str | None = None) -> Any:
    """:func:`plot_history`'s figure (matplotlib, Agg)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'unifiedamp[demo]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    _draw_scale(ax, history.iterations, history.scales, color="tab:blue", label="scale")
    skips = [(i, s) for i, s, k in history.as_list() if k]
    if skips:
        ax.scatter(*zip(*skips, strict=True), marker="x", color="tab:red", zorder=3,
                   label=f"skipped ({len(skips)})")
    ax.set_yscale("log", base=2)
    # The linear axis's locator is an AutoLocator, a MaxNLocator: its set_params takes integer.
    ax.xaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]
    ax.set_xlabel("step (the n-th update)")
    ax.set_ylabel("loss scale after the update")
    finite = [s for s in history.scales if math.isfinite(s) and s > 0]
    if finite and min(finite) == max(finite):  # a flat line still gets an axis
        ax.set_ylim(min(finite) / 2, max(finite) * 2)
    ax.set_title(title or f"loss scale after each of {len(history)} updates")
    ax.legend(loc="best")
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def _draw_scale(ax: Any, steps: Sequence[int], scales: Sequence[float], **style: Any) -> Any:
    """Draws scales against steps on a matplotlib axis, as ``unifiedamp plot`` and ``unifiedamp
    demo`` do: a step line that takes the scale after update n at step n and holds it to the
    next step, and a dot on the last point, whose level has no next step to span. Returns
    the line (``style``: its matplotlib properties)."""
    (line,) = ax.step(steps, scales, where="post", **style)
    ax.plot(steps[-1:], scales[-1:], marker="o", markersize=4, linestyle="",
            color=line.get_color(), alpha=style.get("alpha"))
    return line


def _image_path_error(output: str | os.PathLike[str]) -> None:
    """Raises ``ValueError`` unless ``output`` can take a plot: a file name whose suffix
    names the format, in a folder that exists. Checked before a long run, not after it."""
    path = os.fspath(output)
    if os.path.isdir(path) or not os.path.splitext(path)[1]:
        raise ValueError(f"{path!r} names no image file: give a file name whose suffix picks "
                         "the format (scale.png, scale.svg, scale.pdf)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{path!r}: the folder {folder} does not exist; create it first")


def _save_figure(fig: Any, output: str | os.PathLike[str], **kwargs: Any) -> None:
    """Saves and closes a matplotlib figure atomically, in the format ``output``'s suffix
    names (``kwargs`` go to ``savefig``)."""
    import matplotlib.pyplot as plt

    suffix = os.path.splitext(os.fspath(output))[1]
    try:
        _image_path_error(output)
        with atomic_path(output, suffix=suffix) as tmp:
            fig.savefig(tmp, format=suffix[1:].lower(), **kwargs)
    finally:
        plt.close(fig)
