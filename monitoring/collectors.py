"""Scrape-time metrics computed from the database (a prometheus-client custom collector).

:class:`DatabaseCollector` is registered in the *fresh* registry each ``/metrics`` request builds
(next to ``MultiProcessCollector``), so its numbers are read once per scrape, in the web process,
and never go through the multiprocess files. It is pluggable: it takes a list of *sources*, each
yielding metric families of :mod:`monitoring.metrics`. A failing source is logged and reported as
``tenure_collector_source_up{source=…} 0``; the other sources and the process metrics still answer.

Sources provided here:

- :class:`BrokerSource` — messages per queue and state, lag, paused queues, consumers per queue
  (each broker's own counters: SQLite, Redis, RabbitMQ), expired-but-unreaped leases (SQLite);
- :class:`JobsSource` — jobs per status, outbox backlog (callables given by the job layer);
- :class:`ScheduleSource` — last/next fire per schedule (a callable given by the scheduler).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dramatiq.common import current_millis

from broker import SQLiteBroker
from broker.depth import broker_kind, queue_depths

from . import metrics as m
from .store import lease_expired_by_queue

logger = logging.getLogger(__name__)

#: Message states reported by ``tenure_queue_messages`` (always all four, zeros included).
QUEUE_STATES = ("ready", "delayed", "leased", "dead")


class Source(Protocol):
    """Something that computes metric families at scrape time."""

    #: Short label value for ``tenure_collector_source_up{source=…}``.
    name: str

    def collect(self) -> Iterable[Any]:
        """Yield prometheus-client metric families (see :meth:`monitoring.metrics.DbMetric.family`)."""
        ...


class DatabaseCollector:
    """A prometheus-client collector running every source once per scrape.

    Parameters:
      sources: The sources to run, in order.
    """

    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = list(sources)
        self._failing: set[str] = set()

    def describe(self) -> list[Any]:
        # No up-front description: registering must not run database queries.
        return []

    def collect(self) -> Iterable[Any]:
        up = m.COLLECTOR_SOURCE_UP.family()
        took = m.COLLECTOR_SOURCE_DURATION.family()
        for source in self.sources:
            t0 = time.perf_counter()
            try:
                families = list(source.collect())
            except Exception:
                # Logged when the source starts failing, not on every scrape (Prometheus scrapes often).
                if source.name not in self._failing:
                    logger.exception("Metrics source %r failed during a scrape.", source.name)
                self._failing.add(source.name)
                families, ok = [], 0
            else:
                if source.name in self._failing:
                    logger.info("Metrics source %r answers again.", source.name)
                self._failing.discard(source.name)
                ok = 1
            up.add_metric([source.name], ok)
            took.add_metric([source.name], time.perf_counter() - t0)
            yield from families
        yield up
        yield took


class BrokerSource:
    """Queue depth, lag, consumers and pause flags from the broker's own counters; expired leases (SQLite).

    The counts come from :func:`broker.depth.queue_depths` (SQLite, Redis and RabbitMQ; see there what
    each broker can tell). A count the broker cannot tell is not exported rather than exported as 0:
    on RabbitMQ there is no ``state="leased"`` sample and no lag unless its management API is configured
    (``TENURE_RABBITMQ_MANAGEMENT_URL``) and has sampled the queue; on Redis no consumers. Expired but
    unreaped leases exist only on the SQLite broker (one read-only query of :mod:`monitoring.store`).

    Parameters:
      broker: The broker the web app already has (any Dramatiq broker; an unknown kind yields nothing).
      clock: Milliseconds since the epoch (tests inject one).
    """

    name = "broker"

    def __init__(self, broker: Any, *, clock: Callable[[], int] = current_millis) -> None:
        self.broker = broker
        self.clock = clock

    def collect(self) -> Iterable[Any]:
        depths = queue_depths(self.broker, clock=self.clock)
        if not depths and broker_kind(self.broker) is None:
            return []
        messages = m.QUEUE_MESSAGES.family()
        lag = m.QUEUE_OLDEST_READY_AGE.family()
        paused = m.QUEUE_PAUSED.family()
        consumers = m.QUEUE_CONSUMERS.family()
        for d in depths:
            for state in QUEUE_STATES:
                count = getattr(d, state)
                if count is not None:
                    messages.add_metric([d.queue, state], count)
            if d.oldest_ready_age_ms is not None:
                lag.add_metric([d.queue], d.oldest_ready_age_ms / 1000)
            paused.add_metric([d.queue], int(d.paused))
            if d.consumers is not None:
                consumers.add_metric([d.queue], d.consumers)
        families = [messages, lag, paused, consumers]
        if isinstance(self.broker, SQLiteBroker):
            with self.broker.store.read() as conn:
                expired = lease_expired_by_queue(conn, self.clock())
            unreaped = m.LEASES_EXPIRED_UNREAPED.family()
            for queue in sorted({d.queue for d in depths} | set(expired)):
                unreaped.add_metric([queue], expired.get(queue, 0))
            families.append(unreaped)
        return families


@dataclass(frozen=True)
class OutboxBacklog:
    """Unpublished outbox rows and the age of the oldest, in seconds (``None``: unknown, not exported)."""

    rows: int
    oldest_age_s: float | None = None


class JobsSource:
    """Jobs per status and the outbox backlog, read through the job layer's public functions.

    ``jobs`` must not import ``monitoring``, so the web app hands the job layer's query functions
    in (see docs/monitoring.md). Missing callables are skipped: the source then yields nothing.

    Parameters:
      status_counts: Returns ``{status: count}`` (statuses with no job may be omitted; the
        statuses in *statuses* are always exported, as 0 when absent).
      outbox_backlog: Returns an :class:`OutboxBacklog` (or ``None`` when there is no outbox, as
        with the SQLite broker where the enqueue shares the job's transaction).
      statuses: Statuses always exported.
    """

    name = "jobs"

    def __init__(
        self,
        status_counts: Callable[[], Mapping[str, int]] | None = None,
        outbox_backlog: Callable[[], OutboxBacklog | None] | None = None,
        *,
        statuses: Sequence[str] = ("queued", "running", "succeeded", "failed", "cancelled", "interrupted"),
    ) -> None:
        self.status_counts = status_counts
        self.outbox_backlog = outbox_backlog
        self.statuses = tuple(statuses)

    def collect(self) -> Iterable[Any]:
        families = []
        if self.status_counts is not None:
            counts = dict(self.status_counts())
            jobs = m.JOBS.family()
            for status in sorted(set(self.statuses) | set(counts)):
                jobs.add_metric([status], counts.get(status, 0))
            families.append(jobs)
        if self.outbox_backlog is not None:
            backlog = self.outbox_backlog()
            if backlog is not None:
                rows = m.OUTBOX_BACKLOG.family()
                rows.add_metric([], backlog.rows)
                families.append(rows)
                if backlog.oldest_age_s is not None:
                    age = m.OUTBOX_OLDEST_AGE.family()
                    age.add_metric([], backlog.oldest_age_s)
                    families.append(age)
        return families

    @classmethod
    def for_engine(cls, engine: Any) -> JobsSource:
        """The source for Tenure's job database, through the job layer's store functions.

        Uses ``jobs.store.job_count_by_status`` and ``jobs.store.outbox_pending_count`` in a
        ``jobs.db.read`` transaction. Before the database is migrated the queries fail: the source
        then reports ``tenure_collector_source_up{source="jobs"} 0`` and the rest of the scrape answers.
        """
        from jobs import JobStatus
        from jobs import db as jobs_db
        from jobs import store as jobs_store

        def status_counts() -> Mapping[str, int]:
            with jobs_db.read(engine) as conn:
                return jobs_store.job_count_by_status(conn)

        def outbox_backlog() -> OutboxBacklog:
            with jobs_db.read(engine) as conn:
                return OutboxBacklog(rows=jobs_store.outbox_pending_count(conn))

        return cls(status_counts, outbox_backlog, statuses=[s.value for s in JobStatus])


@dataclass(frozen=True)
class ScheduleFireInfo:
    """One schedule's last fired tick and next due tick, as Unix timestamps in seconds."""

    schedule: str
    last_fire_s: float | None
    next_fire_s: float | None


class ScheduleSource:
    """Last/next fire per schedule, from a callable the scheduler's layer provides.

    Parameters:
      fires: Returns one :class:`ScheduleFireInfo` per declared schedule.
    """

    name = "schedules"

    def __init__(self, fires: Callable[[], Iterable[ScheduleFireInfo]]) -> None:
        self.fires = fires

    def collect(self) -> Iterable[Any]:
        last = m.SCHEDULE_LAST_FIRE.family()
        nxt = m.SCHEDULE_NEXT_FIRE.family()
        for info in sorted(self.fires(), key=lambda i: i.schedule):
            if info.last_fire_s is not None:
                last.add_metric([info.schedule], info.last_fire_s)
            if info.next_fire_s is not None:
                nxt.add_metric([info.schedule], info.next_fire_s)
        return [last, nxt]


def default_sources(
    broker: Any,
    *,
    jobs: JobsSource | None = None,
    schedules: ScheduleSource | None = None,
) -> list[Source]:
    """The sources ``/metrics`` uses: the broker's, plus the job layer's and the scheduler's when given."""
    sources: list[Source] = [BrokerSource(broker)]
    if jobs is not None:
        sources.append(jobs)
    if schedules is not None:
        sources.append(schedules)
    return sources
