"""Makes a collapsing loss scale loud instead of silent."""

from __future__ import annotations

import numbers
import warnings

from unifiedamp.errors import ScaleCollapseError, ScaleCollapseWarning
from unifiedamp.spec import FLOAT32_MIN_NORMAL, f32_hex

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable




class CollapseMonitor:
    """Reports, once per episode, a scale below float32's smallest normal or a run of skips.

    An episode ends when the scale is normal again and the run of skipped
    steps is broken; the next collapse is reported again.

    Args:
        max_consecutive_skips: Consecutive skipped iterations that count as a
            collapse (``None``: only the scale is watched).
        on_collapse: ``"warn"`` (a :class:`ScaleCollapseWarning`) or ``"raise"``
            (a :class:`ScaleCollapseError`, after the update has been applied).

    Example:
        >>> monitor = CollapseMonitor(max_consecutive_skips=2, on_collapse="raise")
        >>> monitor.observe(1, 512.0, skipped=True)
        >>> monitor.observe(2, 256.0, skipped=True)
        Traceback (most recent call last):
        ...
        unifiedamp.errors.ScaleCollapseError: Loss scale collapsed at step 2: ...
    """

    def __init__(self, max_consecutive_skips: int | None = 100, on_collapse: str = "warn"):
        # Any integer type (numpy's too, as configs accept), never a bool. int is named
        # beside Integral for type checkers, which do not know that int is an Integral.
        if max_consecutive_skips is not None and (
            not isinstance(max_consecutive_skips, (int, numbers.Integral))
            or isinstance(max_consecutive_skips, bool)
            or max_consecutive_skips < 1
        ):
            raise ValueError(
                f"max_consecutive_skips must be None or an int >= 1, got {max_consecutive_skips!r}"
            )
        if on_collapse not in ("warn", "raise"):
            raise ValueError(f"on_collapse must be 'warn' or 'raise', got {on_collapse!r}")
        self.max_consecutive_skips = (None if max_consecutive_skips is None
                                      else int(max_consecutive_skips))
        self.on_collapse = on_collapse
        self.consecutive_skips = 0
        self._reported = False
        #: No skip in a row and nothing reported: a good update at a normal scale would
        #: change nothing, so a scaler may leave out its observe() call.
        self.settled = True

    def __setstate__(self, saved: dict) -> None:
        # A copy pickled before ``settled`` existed.
        self.__dict__.update(saved)
        self.__dict__.setdefault("settled", self.consecutive_skips == 0 and not self._reported)

    def observe(self, step: int, scale: float, skipped: bool,
                detail: Callable[[], str] | None = None) -> None:
        """Records one update: ``step`` counts updates from 1, ``scale`` is the new scale."""
        self.report(step, scale, self.consecutive_skips + 1 if skipped else 0, detail)

    def clear(self) -> None:
        """Ends an episode: the scale is normal and the last step was not skipped."""
        self.consecutive_skips = 0
        self._reported = False
        self.settled = True

    def report(self, step: int, scale: float, consecutive_skips: int,
               detail: Callable[[], str] | None = None) -> None:
        """Checks a state read at ``step``: the scale and the skips in a row up to it.

        ``detail`` is called only when a collapse is reported: its text (the last
        overflow report, from the backend) ends the message."""
        self.consecutive_skips = consecutive_skips
        reasons = []
        limit = self.max_consecutive_skips
        if limit is not None and self.consecutive_skips >= limit:
            reasons.append(
                f"the gradients were inf/NaN at each of the last {self.consecutive_skips} steps, "
                "so none of them trained: look for NaN/inf in the loss, the inputs or the "
                "model, or lower the learning rate")
        if scale < FLOAT32_MIN_NORMAL:
            reasons.append(
                f"it is below float32's smallest normal number {FLOAT32_MIN_NORMAL:.8g}, so "
                "scaled values lose precision: usually the result of many skipped steps; "
                "set min_scale to keep a floor")
        if not reasons:
            self._reported = False
            self.settled = consecutive_skips == 0
            return
        self.settled = False
        if self._reported:
            return
        self._reported = True
        message = (
            f"Loss scale collapsed at step {step}: scale {scale!r} ({f32_hex(scale)}); "
            f"{'; and '.join(reasons)}. (on_collapse='raise' stops training instead; "
            "max_consecutive_skips=None watches only the scale.)"
        )
        extra = detail() if detail is not None else ""
        if extra:
            message += " " + extra
        if self.on_collapse == "raise":
            raise ScaleCollapseError(message)
        warnings.warn(message, ScaleCollapseWarning, stacklevel=4)
