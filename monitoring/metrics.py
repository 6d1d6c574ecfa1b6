"""Every Tenure metric, defined once: names, types, labels, buckets.

Two kinds live here:

* **Process metrics** (counters, histograms, the in-progress gauge) are recorded inside the process
  where the event happens (a Dramatiq worker, a gunicorn worker, the scheduler). With
  ``PROMETHEUS_MULTIPROC_DIR`` set *before the process starts* they are written to per-pid mmap
  files that ``/metrics`` merges; without it they live in :data:`REGISTRY` of this process.
* **Database metrics** (:data:`DB_METRICS`) are computed at scrape time by
  :class:`monitoring.collectors.DatabaseCollector`; only their names, help and labels are here.

Conventions: every name starts with ``tenure_``, times are seconds, labels are low-cardinality
(queue, actor/kind, outcome, state, schedule): never a job id, a message id or a user.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

#: The registry process metrics are defined in (used as is when not in multiprocess mode).
REGISTRY = CollectorRegistry(auto_describe=True)

#: Buckets of the duration and queue-wait histograms, in seconds (5 ms … 6 h).
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600)
QUEUE_WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600)

#: ``outcome`` label values of :data:`MESSAGES_PROCESSED` (one per delivery that reached a worker).
OUTCOMES = ("ok", "error", "retried", "skipped", "dead_lettered")
#: ``result`` label values of :data:`SCHEDULE_FIRES`.
SCHEDULE_RESULTS = ("fired", "duplicate", "skipped")
#: ``outcome`` label values of :data:`JOBS_FINISHED`.
JOB_OUTCOMES = ("succeeded", "failed", "cancelled", "interrupted")
#: ``table`` label values of :data:`ROWS_PRUNED`.
PRUNED_TABLES = ("jobs", "job_events", "outbox", "dead_letters", "schedule_fires", "audit_log")

# -- process metrics -------------------------------------------------------------------------------

MESSAGES_ENQUEUED = Counter(
    "tenure_messages_enqueued",
    "Messages enqueued (including Retries' re-enqueues), per queue and actor.",
    ("queue", "actor"),
    registry=REGISTRY,
)
MESSAGES_PROCESSED = Counter(
    "tenure_messages_processed",
    "Deliveries a worker finished, by outcome: ok, error (raised; acked without retry), retried "
    "(raised; re-enqueued by Retries), skipped (SkipMessage), dead_lettered (nacked).",
    ("queue", "actor", "outcome"),
    registry=REGISTRY,
)
MESSAGE_DURATION = Histogram(
    "tenure_message_duration_seconds",
    "Time an actor ran for one delivery (before_process_message to after_process_message).",
    ("queue", "actor"),
    buckets=DURATION_BUCKETS_S,
    registry=REGISTRY,
)
MESSAGE_QUEUE_WAIT = Histogram(
    "tenure_message_queue_wait_seconds",
    "Time from enqueue (or from the due time of a delayed message) to the start of processing.",
    ("queue", "actor"),
    buckets=QUEUE_WAIT_BUCKETS_S,
    registry=REGISTRY,
)
MESSAGES_IN_PROGRESS = Gauge(
    "tenure_messages_in_progress",
    "Deliveries being processed now (live processes only).",
    ("queue", "actor"),
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
WORKER_PROCESSES = Gauge(
    "tenure_worker_processes",
    "Dramatiq worker processes running the Tenure metrics middleware (live processes only).",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
WORKER_THREADS = Gauge(
    "tenure_worker_threads",
    "Worker threads of live Dramatiq worker processes (capacity for saturation panels).",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
WEB_WORKERS = Gauge(
    "tenure_web_workers",
    "Web (gunicorn) worker processes serving Tenure (live processes only; set in gunicorn's post_fork).",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
LEASE_RENEWALS = Counter(
    "tenure_lease_renewals",
    "Leases renewed by the SQLite broker's heartbeat (one per held delivery per beat).",
    registry=REGISTRY,
)
LEASES_LOST = Counter(
    "tenure_leases_lost",
    "Acks/nacks that found their lease gone (another process may run the message again).",
    registry=REGISTRY,
)
STALE_ATTEMPTS = Counter(
    "tenure_stale_attempts",
    "Job writes rejected because they came from a stale attempt (fenced by status/attempt/worker).",
    registry=REGISTRY,
)
SCHEDULE_FIRES = Counter(
    "tenure_schedule_fires",
    "Schedule ticks handled by a scheduler process, by result: fired, duplicate (another process "
    "fired the tick), skipped (paused, or a missed tick dropped by the catch-up policy).",
    ("schedule", "result"),
    registry=REGISTRY,
)
JOBS_FINISHED = Counter(
    "tenure_jobs_finished",
    "Job executions that reached an end, by kind and outcome (succeeded, failed, cancelled, interrupted).",
    ("kind", "outcome"),
    registry=REGISTRY,
)

WORKER_RESTARTS = Counter(
    "tenure_worker_restarts",
    "Processes a supervisor (tenure worker, tenure scheduler, tenure relay) started to replace one that "
    "died, per role (its --role) and slot (0 … processes - 1).",
    ("role", "slot"),
    registry=REGISTRY,
)
WORKER_SLOTS_GIVEN_UP = Gauge(
    "tenure_worker_slots_given_up",
    "Slots a live supervisor stopped restarting after too many consecutive crashes, per role.",
    ("role",),
    multiprocess_mode="livesum",
    registry=REGISTRY,
)

ROWS_PRUNED = Counter(
    "tenure_rows_pruned",
    "Rows the resync deleted once past their retention, by table: jobs (workflow steps included), "
    "job_events, outbox (published rows), dead_letters, schedule_fires.",
    ("table",),
    registry=REGISTRY,
)


def record_stale_attempt() -> None:
    """Count one write rejected as coming from a stale attempt."""
    STALE_ATTEMPTS.inc()


def record_schedule_fire(schedule: str, result: str, ticks: int = 1) -> None:
    """Count *ticks* ticks of one schedule that a scheduler handled with *result*.

    Parameters:
      schedule: The schedule's declared name (a bounded set; never a tick timestamp).
      result: One of :data:`SCHEDULE_RESULTS`.
      ticks: How many ticks (a wake after downtime may skip many at once).

    Raises:
      ValueError: For an unknown result (keeps the label set bounded) or a negative count.
    """
    if result not in SCHEDULE_RESULTS:
        raise ValueError(f"unknown schedule fire result {result!r}; expected one of {SCHEDULE_RESULTS}")
    if ticks < 0:
        raise ValueError(f"a tick count cannot be negative, got {ticks}")
    SCHEDULE_FIRES.labels(schedule, result).inc(ticks)


def declare_schedule(schedule: str) -> None:
    """Export the fire counters of a declared schedule at 0, one per result.

    A counter that first appears at 1 shows no increase to Prometheus, so without this the first
    fire after a start (or after an outage) would not count in ``increase()`` and
    ``TenureNoSchedulerFire`` would wait for the second one. Every process that declares the
    schedule calls it; the sum over processes is unchanged.
    """
    for result in SCHEDULE_RESULTS:
        SCHEDULE_FIRES.labels(schedule, result)


def declare_worker_slots(role: str, slots: int) -> None:
    """Expose a supervisor's series at 0 from its start (a restart then shows as an increase).

    Parameters:
      role: The supervisor's ``--role`` (validated by the CLI: a short lower-case name, so bounded).
      slots: Its number of slots; the ``slot`` label takes the values ``0 … slots - 1``.
    """
    for slot in range(slots):
        WORKER_RESTARTS.labels(role, str(slot))
    WORKER_SLOTS_GIVEN_UP.labels(role).set(0)


def record_worker_restart(role: str, slot: int) -> None:
    """Count one replacement process started in *slot* by a supervisor of *role*."""
    WORKER_RESTARTS.labels(role, str(slot)).inc()


def record_worker_slots_given_up(role: str, count: int) -> None:
    """How many slots this supervisor of *role* has given up on (live gauge of this process)."""
    WORKER_SLOTS_GIVEN_UP.labels(role).set(count)


def record_pruned(table: str, rows: int) -> None:
    """Count rows the resync deleted from *table* (one of :data:`PRUNED_TABLES`).

    Raises:
      ValueError: For an unknown table (keeps the label set bounded).
    """
    if table not in PRUNED_TABLES:
        raise ValueError(f"unknown pruned table {table!r}; expected one of {PRUNED_TABLES}")
    if rows > 0:
        ROWS_PRUNED.labels(table).inc(rows)


# -- database metrics (computed at scrape time) ----------------------------------------------------


@dataclass(frozen=True)
class DbMetric:
    """A metric the scrape-time collector computes from the database."""

    name: str
    kind: str  # "gauge" | "counter"
    documentation: str
    labels: tuple[str, ...] = ()

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labels)


QUEUE_MESSAGES = DbMetric(
    "tenure_queue_messages",
    "gauge",
    "Messages in the broker per queue and state: ready (due), delayed (eta in the future), leased (in flight), "
    "dead; a state the broker cannot count has no sample (see docs/monitoring.md).",
    ("queue", "state"),
)
QUEUE_OLDEST_READY_AGE = DbMetric(
    "tenure_queue_oldest_ready_age_seconds",
    "gauge",
    "Age of the oldest due ready message per queue (now - eta); 0 when nothing is waiting. The lag.",
    ("queue",),
)
QUEUE_PAUSED = DbMetric("tenure_queue_paused", "gauge", "1 while the queue is paused by an operator.", ("queue",))
QUEUE_CONSUMERS = DbMetric(
    "tenure_queue_consumers",
    "gauge",
    "Consumers per queue: processes with a recent lease heartbeat (SQLite), the queue's consumers (RabbitMQ).",
    ("queue",),
)
LEASES_EXPIRED_UNREAPED = DbMetric(
    "tenure_leases_expired_unreaped",
    "gauge",
    "Leased messages whose lease expired and that no process has returned to ready yet.",
    ("queue",),
)
JOBS = DbMetric("tenure_jobs", "gauge", "Job records per status.", ("status",))
OUTBOX_BACKLOG = DbMetric("tenure_outbox_backlog", "gauge", "Outbox rows not yet published to the broker.")
OUTBOX_OLDEST_AGE = DbMetric(
    "tenure_outbox_oldest_age_seconds", "gauge", "Age of the oldest unpublished outbox row (0 when empty)."
)
JOBS_WAITING = DbMetric(
    "tenure_jobs_waiting",
    "gauge",
    "Queued jobs waiting for admission (no broker message yet) per queue and reason: fair_share, concurrency, "
    "rate, steps (a workflow's earlier steps).",
    ("queue", "reason"),
)
LIMIT_IN_USE = DbMetric(
    "tenure_limit_in_use",
    "gauge",
    "Per declared limit, over all its keys: running jobs (concurrency) or starts in the last period (rate).",
    ("limit", "type"),
)
LIMIT_WAITING = DbMetric(
    "tenure_limit_waiting", "gauge", "Jobs waiting for a key of the limit to have room.", ("limit", "type")
)
LIMIT_KEYS_AT_LIMIT = DbMetric(
    "tenure_limit_keys_at_limit", "gauge", "Keys of the limit at their limit now.", ("limit", "type")
)
SCHEDULE_LAST_FIRE = DbMetric(
    "tenure_schedule_last_fire_timestamp_seconds",
    "gauge",
    "Unix time of the last tick fired per schedule.",
    ("schedule",),
)
SCHEDULE_NEXT_FIRE = DbMetric(
    "tenure_schedule_next_fire_timestamp_seconds",
    "gauge",
    "Unix time of the next tick per schedule, as the schedulers last planned it (they write it on every "
    "wake): in the past when no scheduler handled the tick that came due.",
    ("schedule",),
)
COLLECTOR_SOURCE_UP = DbMetric(
    "tenure_collector_source_up",
    "gauge",
    "1 when the scrape-time source answered, 0 when it failed (see the web process log).",
    ("source",),
)
COLLECTOR_SOURCE_DURATION = DbMetric(
    "tenure_collector_source_duration_seconds",
    "gauge",
    "Time the scrape-time source took during this scrape.",
    ("source",),
)

#: Every scrape-time metric, by name.
DB_METRICS: dict[str, DbMetric] = {
    m.name: m
    for m in (
        QUEUE_MESSAGES,
        QUEUE_OLDEST_READY_AGE,
        QUEUE_PAUSED,
        QUEUE_CONSUMERS,
        LEASES_EXPIRED_UNREAPED,
        JOBS,
        JOBS_WAITING,
        LIMIT_IN_USE,
        LIMIT_WAITING,
        LIMIT_KEYS_AT_LIMIT,
        OUTBOX_BACKLOG,
        OUTBOX_OLDEST_AGE,
        SCHEDULE_LAST_FIRE,
        SCHEDULE_NEXT_FIRE,
        COLLECTOR_SOURCE_UP,
        COLLECTOR_SOURCE_DURATION,
    )
}


def exposed_names() -> set[str]:
    """Every sample name ``/metrics`` can expose (``_total``, ``_bucket``, ``_sum``, ``_count`` included)."""
    names: set[str] = set(DB_METRICS)
    for family in REGISTRY.collect():
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            names.add(family.name)
    return names
