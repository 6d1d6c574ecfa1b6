"""Tick arithmetic: when cron and interval schedules are due, as UTC epoch milliseconds.

Cron expressions are evaluated by cronsim in the schedule's own time zone. cronsim follows Debian
cron on DST: a job at a fixed wall-clock time (``30 2 * * *``) runs once at the first valid minute
after a spring-forward gap (03:00) and once, on the first pass, through a fall-back overlap; jobs
with a ``*`` or a range in the minute or hour field follow elapsed time and see every real instant.
Day of week 0 and 7 are both Sunday. Interval ticks are aligned on the Unix epoch, so every
process computes the same instants without talking to the others.
"""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

#: The ``@`` shorthands accepted by periodiq (and Vixie cron), spelled out.
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def normalize_cron(expr: str) -> str:
    """Expand an ``@`` alias and check that *expr* is a valid 5-field cron expression.

    Parameters:
      expr: ``"m h dom mon dow"`` or an alias such as ``"@weekly"``.

    Raises:
      ValueError: For an unknown alias, a wrong number of fields or a bad field.

    Returns:
      The 5-field expression.
    """
    text = " ".join(expr.split())
    if text.startswith("@"):
        if text.lower() not in CRON_ALIASES:
            raise ValueError(f"unknown cron alias {expr!r}; known: {', '.join(sorted(CRON_ALIASES))}")
        text = CRON_ALIASES[text.lower()]
    if len(text.split()) != 5:
        # cronsim also takes a seconds field; periodiq's syntax (and ours) is minute-grained.
        raise ValueError(f"cron expression {expr!r} must have 5 fields (m h dom mon dow)")
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as e:
        raise ValueError(f"invalid cron expression {expr!r}: {e}") from None
    return text


def zone(name: str) -> ZoneInfo:
    """The IANA time zone *name*.

    Raises:
      ValueError: When the zone is unknown.
    """
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as 'Europe/Paris')") from None


def to_ms(dt: datetime) -> int:
    """Epoch milliseconds of an aware datetime."""
    return int(dt.timestamp() * 1000)


def from_ms(ms: int, tz: ZoneInfo | None = None) -> datetime:
    """An aware datetime for epoch milliseconds, in *tz* (UTC by default)."""
    return datetime.fromtimestamp(ms / 1000, tz=tz or UTC)


def cron_ticks(expr: str, tz: ZoneInfo, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """The latest *limit* cron instants in ``(after_ms, until_ms]``, oldest first.

    Parameters:
      expr: A 5-field expression (see :func:`normalize_cron`).
      tz: The zone the expression's wall-clock fields are read in.
      after_ms: Exclusive lower bound, epoch ms.
      until_ms: Inclusive upper bound, epoch ms.
      limit: How many of the most recent instants to keep.

    Returns:
      Epoch milliseconds, ascending.
    """
    kept: deque[int] = deque(maxlen=max(limit, 1))
    for tick in _cron_iter(expr, tz, after_ms):
        if tick > until_ms:
            break
        kept.append(tick)
    return list(kept) if limit > 0 else []


def cron_count(expr: str, tz: ZoneInfo, after_ms: int, until_ms: int, cap: int) -> int:
    """How many cron instants lie in ``(after_ms, until_ms]``, counting at most *cap* + 1 of them."""
    count = 0
    for tick in _cron_iter(expr, tz, after_ms):
        if tick > until_ms or count > cap:
            break
        count += 1
    return count


def cron_next(expr: str, tz: ZoneInfo, after_ms: int) -> int | None:
    """The first cron instant strictly after *after_ms* (None if there is none within 50 years)."""
    return next(_cron_iter(expr, tz, after_ms), None)


def _cron_iter(expr: str, tz: ZoneInfo, after_ms: int):  # type: ignore[no-untyped-def]
    start = from_ms(after_ms, tz)
    sim = CronSim(expr, start)
    while True:
        try:
            tick = to_ms(next(sim))
        except StopIteration:
            return
        # For fixed wall-clock times cronsim iterates naive local time, so starting inside the second
        # pass of a fall-back hour can yield the (earlier) first pass again: skip what is not after.
        if tick > after_ms:
            yield tick


def interval_ticks(period_ms: int, offset_ms: int, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """The latest *limit* instants ``k * period + offset`` in ``(after_ms, until_ms]``, oldest first."""
    if limit <= 0 or until_ms <= after_ms:
        return []
    last = (until_ms - offset_ms) // period_ms
    first = (after_ms - offset_ms) // period_ms + 1
    first = max(first, last - limit + 1)
    return [k * period_ms + offset_ms for k in range(first, last + 1)]


def interval_count(period_ms: int, offset_ms: int, after_ms: int, until_ms: int) -> int:
    """How many instants ``k * period + offset`` lie in ``(after_ms, until_ms]``."""
    if until_ms <= after_ms:
        return 0
    return (until_ms - offset_ms) // period_ms - (after_ms - offset_ms) // period_ms


def interval_next(period_ms: int, offset_ms: int, after_ms: int) -> int:
    """The first instant ``k * period + offset`` strictly after *after_ms*."""
    return ((after_ms - offset_ms) // period_ms + 1) * period_ms + offset_ms
