"""Schedule declarations: the value of an actor's ``periodic`` option.

``@dramatiq.actor(periodic=cron("0 3 * * *", tz="Europe/Paris"))`` and
``@dramatiq.actor(periodic=every(seconds=30))`` declare when an actor fires and what happens after
downtime. The objects also speak the two-method protocol periodiq's scheduler loop calls on every
``periodic`` option (``validate(now)`` and ``next_valid_date(now)``), which is how the ``periodiq``
process drives Tenure's exactly-once scheduler without any change to periodiq (see ``scheduler.py``).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo

from . import cronmath

if TYPE_CHECKING:
    from .scheduler import Scheduler

logger = logging.getLogger(__name__)

Catchup = Literal["latest", "all", "none"]
CATCHUP_POLICIES: tuple[str, ...] = ("latest", "all", "none")

#: How old a missed tick may be and still fire after downtime, in seconds.
DEFAULT_GRACE_S = 3600.0
#: A tick fired later than this counts as a catch-up (and, with ``catchup="none"``, is dropped), in seconds.
ON_TIME_S = 10.0
#: Most ticks one wake fires for one schedule with ``catchup="all"``.
MAX_CATCHUP_FIRES = 100
#: Shortest interval schedule, in milliseconds.
MIN_INTERVAL_MS = 1000
#: Zone of cron schedules declared without ``tz`` (unless the middleware is given another).
DEFAULT_TZ = "UTC"


@dataclass(frozen=True)
class ScheduledJob:
    """What a job-creating schedule submits on each tick (see :func:`tasks.scheduling.schedule_job`).

    Attributes:
      kind: A registered job kind (``jobs.registry``).
      owner_id: The owner of the jobs it creates.
      payload: The jobs' payload (the kind's keyword arguments).
    """

    kind: str
    owner_id: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Binding:
    """What a declaration learns when its actor is declared (set by ``ScheduleMiddleware``)."""

    actor_name: str
    queue_name: str
    scheduler: Callable[[], Scheduler]


@dataclass(eq=False, kw_only=True)
class Schedule:
    """A declared schedule. Subclasses say when ticks are; this class says what to do with them.

    Parameters:
      catchup: After downtime: ``"latest"`` fires the most recent missed tick once, ``"all"`` fires
        every missed tick in order (at most ``MAX_CATCHUP_FIRES`` per wake), ``"none"`` fires only
        ticks that are on time (``ON_TIME_S``).
      grace_s: Missed ticks older than this never fire.
      jitter_s: Delay delivery by a deterministic per-schedule offset in ``[0, jitter_s)``; the tick's
        identity stays the nominal time, so jitter never affects exactly-once.
      max_staleness_s: A worker skips a fired message that starts more than this after its due time
        (None: never skip, unlike periodiq's 30 s default).
      name: The schedule's name; the actor name by default.
      job: Submit this job on each tick (in the fire's transaction) instead of sending the actor's
        message; set by :func:`tasks.scheduling.schedule_job`.

    Raises:
      ValueError: For an unknown policy or a negative/zero duration.
    """

    catchup: Catchup = "latest"
    grace_s: float = DEFAULT_GRACE_S
    jitter_s: float = 0.0
    max_staleness_s: float | None = None
    name: str | None = None
    job: ScheduledJob | None = None
    _binding: Binding | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.catchup not in CATCHUP_POLICIES:
            raise ValueError(f"catchup must be one of {', '.join(CATCHUP_POLICIES)}, got {self.catchup!r}")
        if not self.grace_s > 0:
            raise ValueError(f"grace_s must be positive, got {self.grace_s!r}")
        if self.jitter_s < 0:
            raise ValueError(f"jitter_s must not be negative, got {self.jitter_s!r}")
        if self.max_staleness_s is not None and not self.max_staleness_s > 0:
            raise ValueError(f"max_staleness_s must be positive or None, got {self.max_staleness_s!r}")

    # -- when ticks are (subclasses) ---------------------------------------------------------------
    def ticks(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """The latest *limit* ticks in ``(after_ms, until_ms]`` (epoch ms, ascending)."""
        raise NotImplementedError

    def next_tick(self, after_ms: int) -> int | None:
        """The first tick strictly after *after_ms*, or None if there is none."""
        raise NotImplementedError

    def count_ticks(self, after_ms: int, until_ms: int, cap: int) -> int:
        """How many ticks lie in ``(after_ms, until_ms]``; counting may stop past *cap* (then > cap)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The declaration as shown to people (``cron 0 3 * * * Europe/Paris``)."""
        raise NotImplementedError

    # -- what to fire ------------------------------------------------------------------------------
    def plan(self, *, lower_ms: int, now_ms: int) -> list[int]:
        """Ticks to fire now, given that nothing at or before *lower_ms* may fire.

        Parameters:
          lower_ms: The latest of the last scheduled fire, the schedule's creation and its last resume.
          now_ms: The current time.

        Returns:
          Nominal tick times to fire, oldest first, following the catch-up policy and the grace window.
        """
        grace_ms = int(self.grace_s * 1000)
        if self.catchup == "none":
            grace_ms = min(grace_ms, int(ON_TIME_S * 1000))
        after = max(lower_ms, now_ms - grace_ms - 1)
        limit = MAX_CATCHUP_FIRES if self.catchup == "all" else 1
        return self.ticks(after, now_ms, limit)

    def skipped_before(self, lower_ms: int, tick: int, cap: int) -> tuple[int, int | None]:
        """The ticks after *lower_ms* and before *tick* that never fired: (count, earliest).

        The count stops at *cap* + 1 ("more than *cap*"); (0, None) when there are none.
        """
        count = min(self.count_ticks(lower_ms, tick - 1, cap), cap + 1)
        return (count, self.next_tick(lower_ms)) if count else (0, None)

    def jitter_ms(self) -> int:
        """This schedule's delivery offset: stable across processes and restarts."""
        span = int(self.jitter_s * 1000)
        if span <= 0:
            return 0
        return zlib.crc32(self.schedule_name.encode("utf-8")) % span

    # -- binding ------------------------------------------------------------------------------------
    @property
    def schedule_name(self) -> str:
        if self.name:
            return self.name
        if self._binding is None:
            raise RuntimeError("this schedule is not bound to an actor yet")
        return self._binding.actor_name

    @property
    def binding(self) -> Binding:
        if self._binding is None:
            raise RuntimeError(
                "schedule not bound to an actor: add tasks.scheduling.ScheduleMiddleware to the broker "
                "(tasks.scheduling.install(broker)) before declaring periodic actors"
            )
        return self._binding

    def bind(self, binding: Binding, *, default_tz: str = DEFAULT_TZ) -> None:
        """Attach the declaration to its actor (called once, by ``ScheduleMiddleware``).

        Raises:
          ValueError: When the same object is already bound to another actor.
        """
        if self._binding is not None and self._binding.actor_name != binding.actor_name:
            raise ValueError(
                f"one schedule object cannot be shared by actors {self._binding.actor_name!r} and "
                f"{binding.actor_name!r}; call cron()/every() once per actor"
            )
        self._binding = binding

    # -- periodiq's scheduler protocol --------------------------------------------------------------
    def validate(self, now: Any) -> bool:
        """periodiq asks "should I send this actor now?": fire due ticks exactly once ourselves, say no.

        periodiq would send without a transaction or a record, so Tenure's scheduler fires here,
        inside one transaction per tick, and periodiq never sends anything itself.
        """
        self.binding.scheduler().on_wake(self)
        return False

    def next_valid_date(self, now: Any) -> datetime:
        """periodiq asks when to wake up next: at this schedule's next tick (bounded, see Scheduler)."""
        import pendulum  # periodiq's own dependency; its loop subtracts pendulum datetimes

        wake_ms = self.binding.scheduler().wake_at(self)
        return pendulum.from_timestamp(wake_ms / 1000)

    def __str__(self) -> str:
        return self.describe()


@dataclass(eq=False, kw_only=True)
class CronSchedule(Schedule):
    """Ticks where a 5-field cron expression matches, read in the time zone *tz*.

    Parameters:
      expr: ``"m h dom mon dow"`` or ``@yearly|@annually|@monthly|@weekly|@daily|@midnight|@hourly``.
      tz: IANA zone name; None means the middleware's default (UTC unless configured).
    """

    expr: str = "* * * * *"
    tz: str | None = None
    _expr: str = field(default="", init=False, repr=False)
    _zone: ZoneInfo | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._expr = cronmath.normalize_cron(self.expr)
        if self.tz is not None:
            self._zone = cronmath.zone(self.tz)

    def bind(self, binding: Binding, *, default_tz: str = DEFAULT_TZ) -> None:
        super().bind(binding, default_tz=default_tz)
        if self._zone is None:
            self._zone = cronmath.zone(default_tz)

    @property
    def zone(self) -> ZoneInfo:
        return self._zone or cronmath.zone(DEFAULT_TZ)

    def ticks(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        return cronmath.cron_ticks(self._expr, self.zone, after_ms, until_ms, limit)

    def next_tick(self, after_ms: int) -> int | None:
        return cronmath.cron_next(self._expr, self.zone, after_ms)

    def count_ticks(self, after_ms: int, until_ms: int, cap: int) -> int:
        return cronmath.cron_count(self._expr, self.zone, after_ms, until_ms, cap)

    def describe(self) -> str:
        return f"cron {self.expr} {self.zone.key}"


@dataclass(eq=False, kw_only=True)
class IntervalSchedule(Schedule):
    """Ticks every *period_ms*, aligned on the Unix epoch (plus *offset_ms*), time-zone free."""

    period_ms: int = 60_000
    offset_ms: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.period_ms < MIN_INTERVAL_MS:
            raise ValueError(f"interval must be at least {MIN_INTERVAL_MS} ms, got {self.period_ms}")
        if not 0 <= self.offset_ms < self.period_ms:
            raise ValueError("offset must be in [0, period)")

    def ticks(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        return cronmath.interval_ticks(self.period_ms, self.offset_ms, after_ms, until_ms, limit)

    def next_tick(self, after_ms: int) -> int | None:
        return cronmath.interval_next(self.period_ms, self.offset_ms, after_ms)

    def count_ticks(self, after_ms: int, until_ms: int, cap: int) -> int:
        return cronmath.interval_count(self.period_ms, self.offset_ms, after_ms, until_ms)

    def describe(self) -> str:
        text = f"every {self.period_ms / 1000:g}s"
        return text + (f" +{self.offset_ms / 1000:g}s" if self.offset_ms else "")


def cron(
    expr: str,
    *,
    tz: str | None = None,
    catchup: Catchup = "latest",
    grace_s: float = DEFAULT_GRACE_S,
    jitter_s: float = 0.0,
    max_staleness_s: float | None = None,
    name: str | None = None,
) -> CronSchedule:
    """A cron schedule, periodiq's ``cron()`` with a time zone and policies.

    Parameters:
      expr: 5-field cron expression or ``@`` alias; Sunday is 0 or 7.
      tz: IANA zone the expression is read in (default UTC, or the middleware's ``default_tz``).
      catchup, grace_s, jitter_s, max_staleness_s, name: See :class:`Schedule`.

    Raises:
      ValueError: For an invalid expression, zone or policy.

    Returns:
      The declaration to pass as ``@dramatiq.actor(periodic=...)``.
    """
    return CronSchedule(
        expr=expr,
        tz=tz,
        catchup=catchup,
        grace_s=grace_s,
        jitter_s=jitter_s,
        max_staleness_s=max_staleness_s,
        name=name,
    )


def every(
    seconds: float = 0,
    *,
    minutes: float = 0,
    hours: float = 0,
    offset_s: float = 0,
    catchup: Catchup = "latest",
    grace_s: float = DEFAULT_GRACE_S,
    jitter_s: float = 0.0,
    max_staleness_s: float | None = None,
    name: str | None = None,
) -> IntervalSchedule:
    """An interval schedule (sub-minute allowed), ticking at epoch-aligned multiples of the period.

    Parameters:
      seconds, minutes, hours: The period (summed); at least one second.
      offset_s: Shift every tick by this much, in ``[0, period)``.
      catchup, grace_s, jitter_s, max_staleness_s, name: See :class:`Schedule`.

    Raises:
      ValueError: For a period under one second or an invalid policy.

    Returns:
      The declaration to pass as ``@dramatiq.actor(periodic=...)``.
    """
    period_ms = round((seconds + 60 * minutes + 3600 * hours) * 1000)
    return IntervalSchedule(
        period_ms=period_ms,
        offset_ms=round(offset_s * 1000),
        catchup=catchup,
        grace_s=grace_s,
        jitter_s=jitter_s,
        max_staleness_s=max_staleness_s,
        name=name,
    )


def as_schedule(value: Any) -> Schedule:
    """Accept Tenure's declarations and periodiq's own ``cron()`` objects (read with Tenure's math).

    Raises:
      TypeError: For anything else.
    """
    if isinstance(value, Schedule):
        return value
    try:
        from periodiq import CronSpec
    except ImportError:  # pragma: no cover - periodiq is a dependency
        CronSpec = None  # type: ignore[assignment,misc]  # noqa: N806
    if CronSpec is not None and isinstance(value, CronSpec):
        return cron(str(value))
    raise TypeError(f"periodic= takes tasks.scheduling.cron(...) or every(...), got {type(value).__name__}")
