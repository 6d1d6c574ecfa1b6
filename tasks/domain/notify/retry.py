"""When to try a notification again: ``Retry-After`` parsing and the Standard Webhooks backoff schedule.

The durable retry itself belongs to the job layer (a re-enqueue with a delay survives a crash; a
sleep inside the worker does not); these functions only compute the delay.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

#: The spec's schedule after the first attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h.
SPEC_SCHEDULE_S: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
#: A Retry-After longer than this is capped (a receiver asking for days should be retried sooner).
MAX_RETRY_AFTER_S = 24 * 3600.0
#: Jitter, as a fraction of the delay, so retries from many jobs do not arrive together.
JITTER_FRACTION = 0.1


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date).

    Parameters
    ----------
    value:
        The header value, or None.
    now:
        Current Unix time (for the HTTP-date form); defaults to the wall clock.

    Returns
    -------
    float or None
        Non-negative seconds, capped at :data:`MAX_RETRY_AFTER_S`; None when absent or unparseable.
    """
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        current = now if now is not None else datetime.now(UTC).timestamp()
        seconds = when.timestamp() - current
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def next_retry_delay_s(
    attempt: int,
    retry_after_s: float | None = None,
    *,
    schedule: tuple[float, ...] = SPEC_SCHEDULE_S,
    rng: random.Random | None = None,
) -> float:
    """Delay before attempt ``attempt + 1``: the schedule with jitter, but never less than ``Retry-After``.

    Parameters
    ----------
    attempt:
        Attempts made so far (1 after the first failure).
    retry_after_s:
        The receiver's ``Retry-After``, if it sent one.
    schedule:
        Base delays; the last one repeats.
    rng:
        Random source for the jitter (tests pass a seeded one).

    Returns
    -------
    float
        Seconds.
    """
    base = schedule[min(max(attempt, 1), len(schedule)) - 1]
    jitter = (rng or random).uniform(-JITTER_FRACTION, JITTER_FRACTION) * base
    return max(base + jitter, retry_after_s or 0.0)
