"""Callbacks and errors shared by every domain module: progress, cancellation, the error root."""

from __future__ import annotations

from collections.abc import Callable

#: ``progress(fraction, message)``: fraction in [0, 1]; called on the caller's thread.
Progress = Callable[[float, str], None]
#: ``should_stop() -> bool``: polled at checkpoints; True means "stop now and clean up".
ShouldStop = Callable[[], bool]


class DomainError(Exception):
    """A domain operation failed."""


class Cancelled(DomainError):
    """The operation was cancelled at a checkpoint; partial output was removed."""


def no_progress(fraction: float, message: str) -> None:
    """A ``Progress`` that ignores every report."""


def never_stop() -> bool:
    """A ``ShouldStop`` that never asks to stop."""
    return False


def raise_if_stopped(should_stop: ShouldStop, where: str) -> None:
    """Raise :class:`Cancelled` when ``should_stop()`` is true.

    Parameters
    ----------
    should_stop:
        The caller's cancellation callback.
    where:
        What was about to happen, for the error message.

    Raises
    ------
    Cancelled
        When the callback returns true.
    """
    if should_stop():
        raise Cancelled(f"cancelled before {where}")


def clamp_fraction(value: float) -> float:
    """Clamp a progress fraction to [0, 1] (ffmpeg's last block reports 100.1 %)."""
    return 0.0 if value < 0 else 1.0 if value > 1 else value
