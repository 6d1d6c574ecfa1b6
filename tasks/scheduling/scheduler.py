"""The exactly-once scheduler: fires each tick of each schedule once, whatever the number of processes.

Every ``periodiq`` process runs periodiq's own loop (sleep until the next date, then ask each
``periodic`` option whether to send). Tenure's declarations answer those questions by calling this
class (see ``specs.Schedule.validate``): on each wake it reads the schedule's row, asks the
declaration's catch-up policy which ticks are due, and fires each in ONE transaction that

1. moves the schedule's fence ``last_fire_ms`` past the tick (``store.schedule_claim_tick``; a row
   lock / SQLite's write lock serialises competing schedulers, the loser matches no row),
2. inserts the ``(schedule, fire_time)`` row, and
3. enqueues the actor's message on the same connection (``SQLiteBroker.enqueue(connection=…)``).

A scheduler killed mid-transaction leaves nothing behind, and another process fires the tick.
With a broker that cannot join the transaction (Redis, RabbitMQ) the message is enqueued right
after the commit: a crash in between loses that one tick (at most once), see docs/schedules.md.

Every wake that handled a tick also records the schedule's next tick (``next_fire_ms``, what the UI
and ``tenure_schedule_next_fire_timestamp_seconds`` show) and counts each tick it handled into
``tenure_schedule_fires_total{schedule, result}`` through the ``schedule.fire`` lifecycle event:
``fired`` (by this process, catch-up included), ``duplicate`` (another process fired it) or
``skipped`` (paused, or left out by the catch-up policy; missed ticks older than the schedule's
``grace_s`` are not counted).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dramatiq.broker import Broker
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from broker import SQLiteBroker
from jobs import db
from jobs.publish import prepare_broker
from jobs.registry import registry
from jobs.submit import submit
from monitoring.logs import log_event

from . import store
from .specs import ON_TIME_S, Schedule, as_schedule
from .store import FireRecord, ScheduleState

logger = logging.getLogger(__name__)

#: After a failed wake (database unavailable…), retry this soon, in milliseconds.
RETRY_MS = 1_000
#: Longest sleep between wakes, in milliseconds: bounds the effect of wall-clock steps.
MAX_SLEEP_MS = 60_000
#: Wake this long after a tick so that the tick is surely due, in milliseconds.
WAKE_MARGIN_MS = 5
#: Message option carrying the fire's identity to workers (and to ``max_staleness_s``).
MESSAGE_OPTION = "tenure_schedule"
#: Most ticks one wake counts as duplicate or skipped (the latest ones): after a long downtime a
#: frequent schedule would otherwise enumerate every missed tick of its grace window.
MAX_COUNTED_TICKS = 1_000

Clock = Callable[[], int]


def now_ms() -> int:
    """Wall-clock epoch milliseconds (ticks are wall-clock instants)."""
    return time.time_ns() // 1_000_000


class ScheduleNotFound(LookupError):
    """No periodic actor declares this schedule."""


class _TickTaken(Exception):
    """The fire row already exists: roll the transaction back."""


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as the UI shows it: its declaration and its state."""

    name: str
    actor_name: str | None
    queue_name: str | None
    spec: str
    #: The job kind a ``schedule_job`` schedule submits on each tick (None: it sends its actor's message).
    job_kind: str | None
    catchup: str | None
    grace_s: float | None
    jitter_s: float | None
    max_staleness_s: float | None
    declared: bool
    paused: bool
    paused_at: int | None
    paused_by: str | None
    last_fire_ms: int | None
    #: The next tick that will fire: None while paused (or when the schedule is no longer declared).
    next_fire_ms: int | None
    #: This schedule's delivery offset after each tick (``jitter_s`` picks it once per schedule).
    jitter_offset_ms: int = 0


class Scheduler:
    """Fires the periodic actors declared on *broker*, recording each fire in *engine*'s database.

    Parameters:
      broker: The broker the periodic actors are declared on (and messages go to).
      engine: The database holding ``schedules`` / ``schedule_fires`` (with SQLiteBroker: its file).
      clock: Epoch-ms clock; injected by tests to simulate downtime.
      owner: Recorded in ``fired_by`` (default ``host:pid``).
    """

    def __init__(self, broker: Broker, engine: Engine, *, clock: Clock = now_ms, owner: str | None = None) -> None:
        self.broker = broker
        self.engine = engine
        self.clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.transactional = isinstance(broker, SQLiteBroker) and engine.dialect.name == "sqlite"
        # Per schedule: ticks at or before this instant were settled by this process (fired by us or
        # by another process, or left out by the policy); only a newer tick needs a database read.
        self._settled: dict[str, int] = {}
        self._retry_at: dict[str, int] = {}

    # -- declarations ------------------------------------------------------------------------------
    def declared(self) -> dict[str, Schedule]:
        """Schedules declared by the broker's periodic actors, by schedule name."""
        found: dict[str, Schedule] = {}
        for actor in list(self.broker.actors.values()):
            value = actor.options.get("periodic")
            if value is not None:
                spec = as_schedule(value)
                found[spec.schedule_name] = spec
        return found

    def get(self, name: str) -> Schedule:
        """The declaration of schedule *name*.

        Raises:
          ScheduleNotFound: No periodic actor declares it.
        """
        spec = self.declared().get(name)
        if spec is None:
            raise ScheduleNotFound(name)
        return spec

    # -- periodiq's loop ---------------------------------------------------------------------------
    def on_wake(self, spec: Schedule) -> None:
        """Fire what is due for *spec*; errors are logged and retried soon (the loop must not die)."""
        name = spec.schedule_name
        now = self.clock()
        if now < self._retry_at.get(name, 0):
            return
        try:
            self.fire_due(spec, now)
        except Exception:
            self._retry_at[name] = now + RETRY_MS
            logger.exception("Schedule %s: could not fire due ticks; retrying in %d ms.", name, RETRY_MS)
        else:
            self._retry_at.pop(name, None)

    def wake_at(self, spec: Schedule) -> int:
        """When periodiq should wake up for *spec* next (epoch ms)."""
        name = spec.schedule_name
        now = self.clock()
        retry = self._retry_at.get(name)
        if retry is not None:
            return max(retry, now + WAKE_MARGIN_MS)
        # From what this process settled, not from now: a tick that came due since the last wake
        # must wake us at once rather than be coalesced into the next one.
        nxt = spec.next_tick(self._settled.get(name, now))
        if nxt is None:
            return now + MAX_SLEEP_MS
        return min(max(nxt, now) + WAKE_MARGIN_MS, now + MAX_SLEEP_MS)

    # -- firing ------------------------------------------------------------------------------------
    def fire_due(self, spec: Schedule, now: int | None = None) -> list[FireRecord]:
        """Fire the ticks of *spec* that its policy says are due at *now*, each exactly once.

        Parameters:
          spec: A bound declaration.
          now: Epoch ms (default: the clock).

        Raises:
          sqlalchemy.exc.SQLAlchemyError, dramatiq.errors.BrokerError: Database or broker trouble;
            nothing of the failed tick was written.

        Returns:
          The fires this call made (ticks fired by other processes are not included).
        """
        now = self.clock() if now is None else now
        name = spec.schedule_name
        settled = self._settled.get(name)
        if settled is not None:
            nxt = spec.next_tick(settled)
            if nxt is None or nxt > now:
                return []
        state = self._state(name)
        next_tick = spec.next_tick(now)
        if state is None:
            # First sight of this schedule anywhere: anchor it now. Ticks before this instant were
            # never owed, so a fresh start inside a matching minute fires nothing.
            with db.write(self.engine) as tx:
                store.schedule_ensure(tx.conn, name, now, spec.describe())
                if next_tick is not None:
                    store.schedule_plan_next(tx.conn, name, next_tick, now)
            self._settled[name] = now
            return []
        fired: list[FireRecord] = []
        tally = _Tally(name, paused=state.paused)
        try:
            planned = [] if state.paused else spec.plan(lower_ms=state.lower_ms, now_ms=now)
            for tick in planned:
                record = self._fire(spec, tick, now, next_tick)
                if record is not None:
                    fired.append(record)
                    tally.fired(record.fire_time)
                else:
                    tally.add(self._unfired_result(name, tick))
            # The other ticks that came due since this process last looked (or since the last fire),
            # within the grace window: older ones could never fire whatever the policy.
            since = settled if settled is not None else state.lower_ms
            after = max(since, now - int(spec.grace_s * 1000) - 1)
            tried = set(planned)
            for tick in spec.ticks(after, now, MAX_COUNTED_TICKS):
                if tick not in tried:
                    tally.add(_settled_result(state, tick))
            if next_tick is not None and not fired and state.next_fire_ms != next_tick:
                with db.write(self.engine) as tx:
                    store.schedule_plan_next(tx.conn, name, next_tick, now)
        finally:
            tally.report()
        self._settled[name] = now
        return fired

    def _unfired_result(self, name: str, tick: int) -> str:
        """Why a planned tick did not fire here: another process fired it, or an operator paused or
        resumed the schedule meanwhile (ticks before a resume never fire)."""
        state = self._state(name)
        if state is None or state.paused or state.anchor_ms >= tick:
            return "skipped"
        return "duplicate"

    def _fire(self, spec: Schedule, tick: int, now: int, next_tick: int | None) -> FireRecord | None:
        name = spec.schedule_name
        cause = "schedule" if now - tick <= ON_TIME_S * 1000 else "catchup"
        due = tick + spec.jitter_ms()
        if spec.job is not None:
            return self._fire_job(spec, tick, due, cause, now, next_tick)
        message = self._message(spec, tick, due, cause)
        delay = max(0, due - now) or None
        # The broker checks its schema in its own write transaction on first use: before ours.
        prepare_broker(self.broker, message.queue_name)
        try:
            with db.write(self.engine) as tx:
                skipped = self._claim(tx.conn, spec, tick, now)
                if skipped is None:
                    return None  # fired by another process (or paused meanwhile)
                record = FireRecord(name, tick, cause, message.message_id, None, due, self.owner, now, 0, *skipped)
                if not store.fire_insert(tx.conn, record):
                    raise _TickTaken
                if next_tick is not None:
                    store.schedule_plan_next(tx.conn, name, next_tick, now)
                if self.transactional:
                    self.broker.enqueue(message, delay=delay, connection=tx.conn)
        except _TickTaken:
            return None
        if not self.transactional:
            self.broker.enqueue(message, delay=delay)
        logger.info("Schedule %s fired tick %s (%s) as message %s.", name, _iso(tick), cause, message.message_id)
        return record

    def _fire_job(
        self, spec: Schedule, tick: int, due: int, cause: str, now: int, next_tick: int | None
    ) -> FireRecord | None:
        """Submit the schedule's job in the fire's transaction (job, idempotency key, message/outbox)."""
        assert spec.job is not None
        name = spec.schedule_name
        kind = registry.get(spec.job.kind)
        prepare_broker(registry.broker_for(kind.name), kind.queue)
        try:
            with Session(self.engine) as session, session.begin():
                conn = session.connection()
                skipped = self._claim(conn, spec, tick, now)
                if skipped is None:
                    return None
                # The key makes the job itself unique per tick too, whatever happens to fire rows.
                job = submit(
                    session,
                    owner_id=spec.job.owner_id,
                    kind=spec.job.kind,
                    payload=spec.job.payload,
                    idempotency_key=f"schedule:{name}:{tick}",
                    delay=max(0, due - now) / 1000,
                )
                record = FireRecord(name, tick, cause, None, job.id, due, self.owner, now, 0, *skipped)
                if not store.fire_insert(conn, record):
                    raise _TickTaken
                if next_tick is not None:
                    store.schedule_plan_next(conn, name, next_tick, now)
        except _TickTaken:
            return None
        logger.info("Schedule %s fired tick %s (%s) as job %s.", name, _iso(tick), cause, record.job_id)
        return record

    def _claim(self, conn: Connection, spec: Schedule, tick: int, now: int) -> tuple[int, int | None] | None:
        """Move the fence past *tick* in the fire's transaction.

        Returns:
          ``(skipped, skipped_from)``: the scheduled ticks between the previous fence and *tick* that
          never fired (the catch-up policy or the grace window dropped them). None when the fence
          refused the tick; a tick that another process fired counts one duplicate on its fire row.
        """
        name = spec.schedule_name
        state = store.schedule_lock(conn, name)
        if state is None or not store.schedule_claim_tick(conn, name, tick, now):
            store.fire_note_duplicate(conn, name, tick)
            return None
        return spec.skipped_before(state.lower_ms, tick, store.MAX_SKIPPED_COUNTED)

    def _message(self, spec: Schedule, tick: int, due: int, cause: str):  # type: ignore[no-untyped-def]
        actor = self.broker.get_actor(spec.binding.actor_name)
        info = {"name": spec.schedule_name, "fire_time": tick, "due_at": due, "cause": cause}
        return actor.message_with_options(**{MESSAGE_OPTION: info})

    def _state(self, name: str) -> ScheduleState | None:
        with db.read(self.engine) as conn:
            return store.schedule_get(conn, name)

    # -- operators' API (the web UI calls these) ---------------------------------------------------
    def run_now(self, name: str, *, by: str | None = None, session: Session | None = None) -> FireRecord:
        """Fire schedule *name* once, now, outside its ticks (works while paused; no jitter).

        Parameters:
          session: A Session on the schedule database whose transaction the fire joins (its brokers
            ready: ``jobs.publish.prepare_broker`` before it opened); None: a transaction of its own.

        Raises:
          ScheduleNotFound: No periodic actor declares it.

        Returns:
          The fire row (its ``fire_time`` is the request instant, never a whole second).
        """
        spec = self.get(name)
        now = self.clock()
        fire_time = now + 1 if now % 1000 == 0 else now
        if spec.job is not None:
            return self._run_job_now(spec, fire_time, now, by or self.owner, session)
        while True:
            message = self._message(spec, fire_time, now, "manual")
            prepare_broker(self.broker, message.queue_name)
            record = FireRecord(name, fire_time, "manual", message.message_id, None, now, by or self.owner, now)
            with db.transaction(session or self.engine) as tx:
                store.schedule_ensure(tx.conn, name, now, spec.describe())
                inserted = store.fire_insert(tx.conn, record)
                if inserted and self.transactional:
                    self.broker.enqueue(message, connection=tx.conn)
                elif inserted:
                    tx.after_commit(lambda message=message: self.broker.enqueue(message))
            if inserted:
                break
            fire_time += 1 if (fire_time + 1) % 1000 else 2  # two requests in one millisecond
        logger.info("Schedule %s run now by %s as message %s.", name, by or self.owner, message.message_id)
        return record

    @contextlib.contextmanager
    def _job_transaction(self, session: Session | None) -> Iterator[Session]:
        """A Session of its own, or a savepoint in the caller's (a taken tick rolls back only its attempt)."""
        if session is None:
            with Session(self.engine) as own, own.begin():
                yield own
            return
        with session.begin_nested():
            yield session

    def _run_job_now(
        self, spec: Schedule, fire_time: int, now: int, by: str, session: Session | None = None
    ) -> FireRecord:
        assert spec.job is not None
        name = spec.schedule_name
        kind = registry.get(spec.job.kind)
        prepare_broker(registry.broker_for(kind.name), kind.queue)
        while True:
            try:
                with self._job_transaction(session) as joined:
                    conn = joined.connection()
                    store.schedule_ensure(conn, name, now, spec.describe())
                    job = submit(
                        joined,
                        owner_id=spec.job.owner_id,
                        kind=spec.job.kind,
                        payload=spec.job.payload,
                        idempotency_key=f"schedule:{name}:{fire_time}",
                    )
                    record = FireRecord(name, fire_time, "manual", None, job.id, now, by, now)
                    if not store.fire_insert(conn, record):
                        raise _TickTaken  # roll the job back too
                break
            except _TickTaken:
                fire_time += 1 if (fire_time + 1) % 1000 else 2
        logger.info("Schedule %s run now by %s as job %s.", name, by, job.id)
        return record

    def pause(self, name: str, *, by: str | None = None, session: Session | None = None) -> bool:
        """Stop firing *name* (in every scheduler process, from its next tick).

        Parameters:
          session: A Session on the schedule database whose transaction to join (None: one of its own).

        Raises:
          ScheduleNotFound: No periodic actor declares it.

        Returns:
          False when it was already paused.
        """
        spec = self.get(name)
        now = self.clock()
        with db.transaction(session or self.engine) as tx:
            store.schedule_ensure(tx.conn, name, now, spec.describe())
            return store.schedule_set_paused(tx.conn, name, True, now, by)

    def resume(self, name: str, *, session: Session | None = None) -> bool:
        """Fire *name* again from its next tick; ticks missed while paused never fire.

        Parameters:
          session: As for :meth:`pause`.

        Raises:
          ScheduleNotFound: No periodic actor declares it.

        Returns:
          False when it was not paused.
        """
        spec = self.get(name)
        now = self.clock()
        with db.transaction(session or self.engine) as tx:
            store.schedule_ensure(tx.conn, name, now, spec.describe())
            return store.schedule_set_paused(tx.conn, name, False, now, None)

    def list(self) -> list[ScheduleView]:
        """Every declared schedule plus any that is in the database but no longer declared."""
        declared = self.declared()
        with db.read(self.engine) as conn:
            states = {s.name: s for s in store.schedule_list(conn)}
        now = self.clock()
        views = []
        for name in sorted(set(declared) | set(states)):
            spec, state = declared.get(name), states.get(name)
            binding = spec.binding if spec is not None else None
            views.append(
                ScheduleView(
                    name=name,
                    actor_name=binding.actor_name if binding else None,
                    queue_name=binding.queue_name if binding else None,
                    spec=spec.describe() if spec is not None else (state.spec if state and state.spec else ""),
                    job_kind=spec.job.kind if spec is not None and spec.job is not None else None,
                    catchup=spec.catchup if spec else None,
                    grace_s=spec.grace_s if spec else None,
                    jitter_s=spec.jitter_s if spec else None,
                    max_staleness_s=spec.max_staleness_s if spec else None,
                    declared=spec is not None,
                    paused=bool(state and state.paused),
                    paused_at=state.paused_at if state else None,
                    paused_by=state.paused_by if state else None,
                    last_fire_ms=state.last_fire_ms if state else None,
                    next_fire_ms=_next_fire_ms(spec, state, now),
                    jitter_offset_ms=spec.jitter_ms() if spec is not None else 0,
                )
            )
        return views

    def fires(self, name: str | None = None, limit: int = 100) -> list[FireRecord]:
        """Recorded fires, newest first, of one schedule or all."""
        with db.read(self.engine) as conn:
            return store.fire_list(conn, name, limit)

    def history(self, per_schedule: int = 10) -> dict[str, list[FireRecord]]:
        """The newest *per_schedule* fires of every schedule, newest first, by schedule name."""
        found: dict[str, list[FireRecord]] = {}
        with db.read(self.engine) as conn:
            for record in store.fire_list_recent(conn, per_schedule):
                found.setdefault(record.schedule, []).append(record)
        return found

    def refresh(self, now: int | None = None) -> int:
        """Write every declared schedule's row and declared text (the view the UI reads).

        The next tick is not written here: only a scheduler's wake writes it, so that a resync run
        by hand cannot make a stopped scheduler look on time.

        Returns:
          How many schedules were refreshed.
        """
        now = self.clock() if now is None else now
        declared = self.declared()
        with db.write(self.engine) as tx:
            for name, spec in declared.items():
                store.schedule_ensure(tx.conn, name, now, spec.describe())
                store.schedule_set_spec(tx.conn, name, spec.describe(), now)
        return len(declared)

    def prune_fires(self, retention_s: float, now: int | None = None) -> int:
        """Delete fire rows older than *retention_s*, keeping each schedule's latest.

        Returns:
          How many rows were deleted.
        """
        now = self.clock() if now is None else now
        with db.write(self.engine) as tx:
            return store.fire_prune(tx.conn, now - int(retention_s * 1000))


def _next_fire_ms(spec: Schedule | None, state: ScheduleState | None, now: int) -> int | None:
    """The next tick as the schedulers planned it (in the past when none runs: overdue); before any
    scheduler did, the declaration's next tick the fence lets through. None while paused."""
    if state is not None and state.paused:
        return None
    if state is not None and state.next_fire_ms is not None:
        return state.next_fire_ms
    if spec is None:
        return None
    return spec.next_tick(max(now, state.lower_ms) if state is not None else now)


def _settled_result(state: ScheduleState, tick: int) -> str:
    """How a due tick this wake did not try to fire was settled, from the state read at the wake."""
    if not state.paused and state.last_fire_ms is not None and tick <= state.last_fire_ms:
        return "duplicate"
    return "skipped"  # paused, before the last resume, or left out by the catch-up policy


class _Tally:
    """The ticks one wake handled, reported as ``schedule.fire`` lifecycle events (metrics + log lines)."""

    def __init__(self, schedule: str, *, paused: bool) -> None:
        self.schedule = schedule
        self.paused = paused
        self.fired_ticks: list[int] = []
        self.counts = {"duplicate": 0, "skipped": 0}

    def fired(self, tick: int) -> None:
        self.fired_ticks.append(tick)

    def add(self, result: str) -> None:
        self.counts[result] += 1

    def report(self) -> None:
        for tick in self.fired_ticks:  # the scheduler's own INFO line already tells each fire
            log_event("schedule.fire", level=logging.DEBUG, schedule=self.schedule, result="fired", tick=_iso(tick))
        if self.counts["duplicate"]:
            log_event(
                "schedule.fire",
                level=logging.DEBUG,
                schedule=self.schedule,
                result="duplicate",
                ticks=self.counts["duplicate"],
            )
        if self.counts["skipped"]:
            # Ticks dropped after downtime are worth a line; ticks passing while paused are expected.
            log_event(
                "schedule.fire",
                level=logging.DEBUG if self.paused else logging.INFO,
                schedule=self.schedule,
                result="skipped",
                ticks=self.counts["skipped"],
            )


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"
