"""Every exception and warning unifiedamp raises, in one place (all exported from
``unifiedamp``).

Example:
    >>> import unifiedamp as ua
    >>> issubclass(ua.UnknownBackendError, ValueError)
    True
"""

from __future__ import annotations


class FrameworkConflictError(ImportError):
    """Importing this framework now would crash the process.

    Example:
        >>> issubclass(FrameworkConflictError, ImportError)
        True
    """


class ScaleCollapseWarning(RuntimeWarning):
    """The loss scale collapsed: training is stepping on nothing but non-finite gradients."""


class ScaleCollapseError(RuntimeError):
    """Raised instead of :class:`ScaleCollapseWarning` when ``on_collapse="raise"``."""


class MissingBackendError(ImportError):
    """The backend's framework (or the backend itself) cannot be imported.

    Example:
        >>> issubclass(MissingBackendError, ImportError)
        True
    """


class UnknownBackendError(ValueError):
    """``backend=`` names no built-in backend and no registered entry point.

    Example:
        >>> issubclass(UnknownBackendError, ValueError)
        True
    """


class AmbiguousBackendError(UnknownBackendError):
    """``backend=None`` with several frameworks imported: which one is meant is not known.

    Example:
        >>> issubclass(AmbiguousBackendError, UnknownBackendError)
        True
    """


class NoInfChecksError(RuntimeError, AssertionError):
    """``update()``/``step()`` found no inf check to act on.

    torch raises an AssertionError here; this is also a RuntimeError, like the
    other call-order errors, so either except clause catches it. The message starts
    with torch's sentence and goes on with the cause and the fix
    (:meth:`prior_to_update`, :meth:`for_optimizer`).

    Example:
        >>> import unifiedamp as ua
        >>> ua.GradScaler(backend="numpy").update()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unifiedamp.errors.NoInfChecksError: No inf checks were recorded prior to update. \
Nothing checked the gradients since the last update(): call scaler.step(optimizer) ...
    """

    @classmethod
    def prior_to_update(cls) -> NoInfChecksError:
        """``update()`` with no check since the last update: torch's words, then why
        and what to do."""
        return cls("No inf checks were recorded prior to update. Nothing checked the "
                   "gradients since the last update(): call scaler.step(optimizer) (or "
                   "scaler.unscale_(optimizer)) before scaler.update(), once per iteration; "
                   "functional steps pass the flag unscale() returned, scaler.update(finite). "
                   "update() twice in a row, optimizer.step() called instead of "
                   "scaler.step(optimizer), or, accumulating gradients, an update() on an "
                   "iteration that did not step each leave nothing to act on.")

    @classmethod
    def for_optimizer(cls, gradients: str = "call scaler.scale(loss).backward()"
                      ) -> NoInfChecksError:
        """``step(optimizer)`` where none of the optimizer's parameters has a gradient:
        torch's words, then why and what to do (``gradients``: how this framework makes
        them)."""
        return cls("No inf checks were recorded for this optimizer. None of its parameters "
                   f"has a gradient, so there is nothing to check or step: {gradients} "
                   "before scaler.step(optimizer), with a loss that reaches this optimizer's "
                   "parameters (a frozen or unused part of the model gets no gradient), and "
                   "clear the gradients after step(), not between the backward pass and "
                   "step().")


class ScaleNotCalledError(RuntimeError, AssertionError):
    """``step()`` or ``unscale_()`` came before any ``scale()`` (torch and paddle backends).

    torch raises an AssertionError here (``Attempted step but _scale is None``);
    this is also a RuntimeError, like the other call-order errors, so either
    except clause catches it.

    Example:
        >>> issubclass(ScaleNotCalledError, AssertionError)
        True
    """


class ForeignArrayError(TypeError, ValueError):
    """An array of another framework given to a backend (a torch tensor to the numpy
    backend, a NumPy array to the torch backend): every backend refuses it in the same
    words, naming the conversion and the backend of its framework.

    A TypeError; also a ValueError, which torch's and Paddle's ``scale()`` raise for a
    value that is not a tensor, so either except clause catches it.

    Example:
        >>> issubclass(ForeignArrayError, TypeError), issubclass(ForeignArrayError, ValueError)
        (True, True)
    """


class EmptyStateDictError(ValueError, RuntimeError):
    """``load_state_dict({})``: a dict saved by a disabled scaler holds nothing to load.

    A ValueError, like every invalid state dict; also a RuntimeError, which
    ``torch.amp.GradScaler`` and ``paddle.amp.GradScaler`` raise here, so code written
    for them (``except RuntimeError`` around a resume) still catches it.

    Example:
        >>> import unifiedamp as ua
        >>> ua.GradScaler(backend="numpy").load_state_dict({})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        unifiedamp.errors.EmptyStateDictError: Invalid scaler state_dict: it is empty, ...
    """
