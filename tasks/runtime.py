"""What every actor shares: its settings, the domain engine, the output-root write gate, retry hints,
and adapters from a :class:`~jobs.context.JobContext` to the domain's ``progress``/``should_stop`` callbacks.

Configuration is the process's one :class:`settings.environment.Settings` (``tasks/__init__.py`` builds it from
the environment at start; :func:`task_settings` returns it): the actors' own variables (ASR model,
ffmpeg, fonts, notification channels, write-gate cooldown) are fields of it, validated with the rest.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from pathlib import Path

from sqlalchemy import Engine

from jobs import JobCancelled, JobContext, StaleAttempt, current_job
from jobs.db import make_engine
from jobs.registry import default_backoff
from settings.environment import DEFAULT_OUTPUT_ROOT, Settings, current_settings

from .domain.control import DomainError

logger = logging.getLogger(__name__)

#: Progress is written at most this often (ffmpeg reports twice a second; ASR per segment).
PROGRESS_INTERVAL_S = 0.25
#: Cancellation is read from the database at most this often (the renderer polls ten times a second).
CANCEL_POLL_INTERVAL_S = 0.25


_lock = threading.Lock()
_engine: tuple[int, Engine] | None = None


def task_settings() -> Settings:
    """This process's settings (the one :class:`~settings.environment.Settings` the composition root installed)."""
    return current_settings()


def domain_engine() -> Engine:
    """The engine for domain rows: the job database (same file, so one transaction covers both)."""
    global _engine
    with _lock:
        if _engine is None or _engine[0] != os.getpid():
            settings = current_settings()
            _engine = (os.getpid(), make_engine(settings.database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms))
        return _engine[1]


def reset_for_tests() -> None:
    """Forget the cached engine (tests that change the settings call ``set_current_settings`` too)."""
    global _engine
    with _lock:
        _engine = None


# -- retry hints --------------------------------------------------------------------------------------
_hints: weakref.WeakKeyDictionary[JobContext, float] = weakref.WeakKeyDictionary()


def retry_in(ctx: JobContext, seconds: float) -> None:
    """Ask for the next attempt of *ctx* no sooner than *seconds* from now (e.g. a ``Retry-After``).

    The job layer's backoff only sees the attempt number; :func:`hinted_backoff` (the kinds'
    ``backoff``) reads this hint in the same thread when the failure is recorded.
    """
    _hints[ctx] = max(0.0, float(seconds))


def hinted_backoff(attempt: int) -> float:
    """Backoff of the actors: the job layer's default, but never less than a hint set by :func:`retry_in`."""
    ctx = current_job()
    hint = _hints.get(ctx) if ctx is not None else None
    base = default_backoff(attempt)
    return max(base, hint) if hint is not None else base


class RetryLater(DomainError):
    """A transient failure; the job's retry policy runs it again (after the hinted delay, if any)."""


def output_root(ctx: JobContext) -> Path:
    return Path(str(ctx.config.get("output_root") or DEFAULT_OUTPUT_ROOT))


# -- progress and cancellation adapters ---------------------------------------------------------------
class Reporter:
    """``progress`` and ``should_stop`` callbacks for a domain call, bound to a job.

    Progress is throttled and mapped into ``[lo, hi]`` of the job's bar; ``should_stop`` reads the
    cancel flag at most every :data:`CANCEL_POLL_INTERVAL_S` and remembers why it said stop, so the
    actor can re-raise the job layer's own exception after the domain cleaned up.
    """

    def __init__(
        self, ctx: JobContext, lo: float = 0.0, hi: float = 1.0, *, poll_interval_s: float = CANCEL_POLL_INTERVAL_S
    ) -> None:
        self.ctx = ctx
        self.lo, self.hi = lo, hi
        self.poll_interval_s = poll_interval_s
        self.stop_reason: BaseException | None = None
        self._last_progress = 0.0
        self._last_poll = 0.0

    def progress(self, fraction: float, message: str) -> None:
        now = time.monotonic()
        if fraction < 1.0 and now - self._last_progress < PROGRESS_INTERVAL_S:
            return
        self._last_progress = now
        value = self.lo + (self.hi - self.lo) * min(1.0, max(0.0, fraction))
        try:
            self.ctx.progress(value, message[:200])
        except StaleAttempt as exc:
            self.stop_reason = exc

    def should_stop(self) -> bool:
        if self.stop_reason is not None:
            return True
        now = time.monotonic()
        if now - self._last_poll < self.poll_interval_s:
            return False
        self._last_poll = now
        try:
            self.ctx.check_cancelled()
        except (JobCancelled, StaleAttempt) as exc:
            self.stop_reason = exc
            return True
        return False

    def reraise(self) -> None:
        """Raise the job layer's reason for stopping, if the domain stopped because of one."""
        if self.stop_reason is not None:
            raise self.stop_reason
