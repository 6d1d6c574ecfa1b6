"""The web layer's view of Tenure's job layer (``jobs``) and schedules: :class:`JobLayerGateway`.

Everything here calls ``jobs`` services and turns their records and errors into the web layer's
(:mod:`webapp.gateway`, :mod:`webapp.errors`); no SQL. Every filter, search, count and chart is the
job layer's SQL (:mod:`jobs.queries`), exact at any table size. The live feed's notices come from the
job layer's feeds (:mod:`jobs.feeds`): one per subscriber over the commit-ordered change feed, whose
cursor (``<feed>.<n>``) resumes in any web process on any host, on SQLite and PostgreSQL. Progress
writes no event: it comes from :class:`ProgressWatcher`, a per-process poller over the running jobs,
as best-effort notices that carry the current cursor (never replayed; the job's state is re-read anyway).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import shutil
import threading
import time
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

import jobs as joblayer
from jobs import feeds
from jobs.db import session_tx
from jobs.publish import prepare_broker
from jobs.queries import (
    CursorUnknown,
    JobFilter,
    activity,
    admission_usage,
    count_jobs,
    page_jobs,
    steps_of,
)
from jobs.registry import Registry
from jobs.registry import registry as default_registry
from tasks.domain.media.subtitles import parse_srt

from .errors import Conflict, Invalid, JobNotFoundError, NotFound
from .gateway import (
    TERMINAL,
    ActivityBucket,
    AttemptView,
    Cue,
    EventView,
    FeedLost,
    FieldSpec,
    FireView,
    JobQuery,
    JobView,
    KindInfo,
    Notice,
    Page,
    ScheduleView,
    StepView,
    WorkflowView,
)

logger = logging.getLogger(__name__)


def _filter(scope: str | None, q: JobQuery) -> JobFilter:
    return JobFilter(
        statuses=q.statuses,
        kind=q.kind,
        queue=q.queue,
        owner_id=q.owner_id if scope is None else None,
        created_after=q.created_after,
        created_before=q.created_before,
        search=q.search,
        parent_job_id=q.parent_job_id,
        top_level=q.top_level,
    )


class JobLayerGateway:
    """The job layer as the web layer uses it. ``scope`` is an owner id, or ``None`` for admins (all jobs)."""

    def __init__(self, *, engine: Any, broker: Any, settings: Any, registry: Registry | None = None) -> None:
        self.engine = engine
        self.broker = broker
        self.settings = settings
        self.registry = registry or default_registry
        self.progress = ProgressWatcher(self)

    # -- kinds ---------------------------------------------------------------------------------
    def kinds(self) -> list[KindInfo]:
        return [_kind_info(self.registry.get(name)) for name in self.registry.names()]

    # -- records -------------------------------------------------------------------------------
    def _view(self, r: joblayer.JobRecord) -> JobView:
        return JobView(
            id=r.id,
            owner_id=r.owner_id,
            kind=r.kind,
            status=str(r.status),
            queue=r.queue,
            priority=r.priority,
            attempt=r.attempt,
            max_attempts=r.max_attempts,
            created_at=r.created_at,
            started_at=r.started_at,
            completed_at=r.completed_at,
            progress=r.progress,
            progress_message=r.progress_message,
            cancel_requested=r.cancel_requested,
            error=r.error,
            result=r.result,
            retry_of_job_id=r.retry_of_job_id,
            parent_job_id=r.parent_job_id,
            summary=r.summary,
            files=tuple(self._files(r.id)) if str(r.status) in TERMINAL else (),
            still_exiting=r.still_exiting,
            waiting=r.waiting,
        )

    def _output_dir(self, job_id: str) -> Path:
        return Path(getattr(self.settings, "output_root", "var/outputs")) / job_id

    def _files(self, job_id: str) -> list[str]:
        directory = self._output_dir(job_id)
        try:
            return sorted(p.name for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
        except OSError:
            return []

    # -- commands ------------------------------------------------------------------------------
    def submit(
        self,
        *,
        owner_id: str,
        kind: str,
        payload: dict[str, Any],
        idempotency_key: str | None,
        priority: int,
        delay_s: float,
    ) -> tuple[JobView, bool]:
        """Returns (job, created). Raises Invalid (unknown kind, bad payload), Conflict (key reused)."""
        if self.registry.find(kind) is None:
            raise Invalid(f"Unknown job kind {kind!r}.", details={"kind": [f"unknown kind {kind!r}"]})
        try:
            record = joblayer.submit(
                self.engine,
                owner_id=owner_id,
                kind=kind,
                payload=payload,
                idempotency_key=idempotency_key,
                priority=priority,
                delay=delay_s or None,
                registry=self.registry,
                settings=self.settings,
            )
        except joblayer.PayloadInvalid as exc:
            raise Invalid("The payload does not fit this kind.", details=exc.problems) from None
        except joblayer.UnknownKind as exc:
            raise Invalid(str(exc), details={"kind": [str(exc)]}) from None
        except joblayer.IdempotencyConflict as exc:
            raise Conflict(str(exc)) from None
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        return self._view(record), bool(record.created)

    def get(self, scope: str | None, job_id: str) -> JobView:
        try:
            return self._view(joblayer.get_job(self.engine, job_id, owner_id=scope or "", is_admin=scope is None))
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None

    def events(self, scope: str | None, job_id: str, *, after: int, limit: int) -> list[EventView]:
        try:
            records = joblayer.job_events(
                self.engine, job_id, owner_id=scope or "", is_admin=scope is None, after=after, limit=limit
            )
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None
        return [EventView(e.sequence, e.type, e.data, e.created_at) for e in records]

    def attempts(self, scope: str | None, job_id: str) -> list[AttemptView]:
        """The job's attempts, oldest first (404 when missing or not the caller's)."""
        try:
            records = joblayer.job_attempts(self.engine, job_id, owner_id=scope or "", is_admin=scope is None)
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None
        return [AttemptView(a.attempt, a.started_at, a.ended_at, a.outcome, a.next, a.error, a.host) for a in records]

    def prepare_brokers(self) -> None:
        """Get every kind's broker ready before a Session's write transaction opens (``prepare_broker``)."""
        prepare_broker(self.broker)
        for name in self.registry.names():
            kind = self.registry.get(name)
            try:
                prepare_broker(self.registry.broker_for(name), kind.queue)
            except joblayer.UnknownKind:
                continue  # a kind no broker runs: submitting it is refused anyway

    # The commands below take ``session``: a transaction (``jobs.db.write_session``) they join instead
    # of committing on their own, so the caller's audit record commits with them.

    def cancel(
        self, scope: str | None, job_id: str, *, by: str | None = None, session: Session | None = None
    ) -> tuple[JobView, str]:
        """Returns (job, outcome) with outcome ``cancelled`` or ``cancel_requested``; Conflict when finished.
        *by* is the acting user's owner id (recorded in the job's events)."""
        try:
            result = joblayer.cancel(session or self.engine, job_id, by=by or scope or "admin", is_admin=scope is None)
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None
        if result.outcome == joblayer.CancelOutcome.ALREADY_FINISHED:
            raise Conflict(result.message)
        outcome = "cancelled" if result.outcome == joblayer.CancelOutcome.CANCELLED else "cancel_requested"
        return self._view(result.job), outcome

    def retry(
        self, scope: str | None, job_id: str, *, by: str | None = None, session: Session | None = None
    ) -> tuple[JobView, bool]:
        """(the NEW job, created). A job is retried once: asking again returns that retry with created
        False. Conflict when the job's status does not allow a retry."""
        try:
            record = joblayer.retry(
                session or self.engine,
                job_id,
                by=by or scope or "admin",
                is_admin=scope is None,
                registry=self.registry,
                settings=self.settings,
            )
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None
        except joblayer.JobNotRetryable as exc:
            raise Conflict(str(exc)) from None
        except joblayer.UnknownKind as exc:
            raise Conflict(f"This job's kind is no longer registered: {exc}") from None
        except joblayer.IdempotencyConflict:
            # The owner submitted a different request under the key a retry of this job uses.
            raise Conflict("This job's retry key was used by another request of yours; submit it anew.") from None
        return self._view(record), bool(record.created)

    def run_now(self, scope: str | None, job_id: str, *, by: str, session: Session | None = None) -> None:
        """Start a queued job now instead of after its delay or retry backoff; Conflict when it is not waiting."""
        self.get(scope, job_id)  # 404 for missing/foreign jobs first
        target = session or self.engine
        if not joblayer.run_now(target, [job_id], by=by, registry=self.registry, broker=self.broker):
            raise Conflict("The job is not waiting: only a queued job with a delay or a retry backoff can run now.")

    def delete(self, scope: str | None, job_id: str, *, by: str, session: Session | None = None) -> list[str]:
        """Delete a finished job (a workflow with its steps) and, once that commits, its output files;
        returns the ids deleted. Conflict (with the reason) when it may not go yet."""
        target = session or self.engine
        try:
            deleted = joblayer.delete_job(target, job_id, by=scope or by, is_admin=scope is None)
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None
        except joblayer.JobNotDeletable as exc:
            raise Conflict(str(exc)) from None

        def remove_files() -> None:
            # The files are reachable only through their job: with it gone, nothing could read them.
            for deleted_id in deleted.job_ids:
                shutil.rmtree(self._output_dir(deleted_id), ignore_errors=True)

        if session is None:
            remove_files()
        else:
            session_tx(session).after_commit(remove_files)
        return list(deleted.job_ids)

    # -- lists ---------------------------------------------------------------------------------
    def list_jobs(self, scope: str | None, query: JobQuery, *, cursor: str | None, limit: int) -> Page:
        """A full page of matching jobs (short only when it is the last), newest first."""
        try:
            page = page_jobs(
                self.engine,
                _filter(scope, query),
                owner_id=scope or "",
                is_admin=scope is None,
                cursor=cursor,
                limit=limit,
            )
        except ValueError as exc:
            raise Invalid(str(exc).capitalize() + ".", details={"cursor": [str(exc)]}) from None
        return Page([self._view(r) for r in page.items], page.next_cursor)

    def steps_of(self, scope: str | None, parent_ids: list[str]) -> dict[str, list[JobView]]:
        """The steps of each workflow among *parent_ids* (parent id → steps, oldest first)."""
        found = steps_of(self.engine, parent_ids, owner_id=scope or "", is_admin=scope is None)
        return {parent: [self._view(r) for r in records] for parent, records in found.items()}

    def workflow(self, scope: str | None, job_id: str) -> WorkflowView | None:
        """The DAG of the workflow *job_id* (None when the job has no steps)."""
        try:
            graph = joblayer.workflow_graph(self.engine, job_id, owner_id=scope or "", is_admin=scope is None)
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None
        if not graph:
            return None
        steps = sorted(graph.values(), key=lambda s: (s.job.created_at, s.job.id))
        return WorkflowView(tuple(StepView(s.name, self._view(s.job), s.depends_on, s.reused) for s in steps))

    def transcript(self, scope: str | None, job_id: str, name: str) -> list[Cue]:
        """The cues of one of the job's SRT files (lenient: blocks without a time line are skipped)."""
        path = self.output_file(scope, job_id, name)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [Cue(c.start_s, c.end_s, c.text) for c in parse_srt(text)]

    def count_jobs(self, scope: str | None, query: JobQuery) -> int:
        """How many jobs match, exactly."""
        return count_jobs(self.engine, _filter(scope, query), owner_id=scope or "", is_admin=scope is None)

    # -- live feed -----------------------------------------------------------------------------
    def open_feed(self, subscriber: str, scope: str | None) -> feeds.Feed:
        """A new live feed for *subscriber* of *scope*'s jobs (``None``: all), starting now."""
        return feeds.open_feed(self.engine, subscriber, scope)

    def resume_feed(self, cursor: str, subscriber: str, scope: str | None) -> feeds.Feed:
        """*subscriber*'s feed that *cursor* names, just after it. Raises :class:`FeedLost` when it cannot
        continue exactly, ValueError for a malformed cursor."""
        try:
            return feeds.resume_feed(self.engine, cursor, subscriber, scope)
        except CursorUnknown:
            raise FeedLost("cursor_unknown") from None
        except joblayer.CursorExpired:
            raise FeedLost("cursor_expired") from None
        except feeds.FeedBehind:
            raise FeedLost("behind") from None

    def feed_notices(self, feed: feeds.Feed, *, limit: int) -> list[Notice]:
        """The feed's next notices (at most *limit*), oldest first; advances *feed*. Raises :class:`FeedLost`."""
        try:
            changes = feeds.next_changes(self.engine, feed, limit)
        except CursorUnknown:
            raise FeedLost("cursor_unknown") from None
        except joblayer.CursorExpired:
            raise FeedLost("cursor_expired") from None
        return [
            Notice(
                f.cursor,
                f.change.job_id,
                f.change.owner_id,
                "status" if f.change.type == "status" else "event",
                f.change.status,
                f.change.progress,
                f.change.progress_message,
                f.change.created_at,
                f.change.sequence,
            )
            for f in changes
        ]

    def mark_feed(self, feed: feeds.Feed, *, now_ms: int | None = None) -> None:
        """Record where *feed* stands when due (``now_ms`` given) or now (``None``: the connection ends)."""
        if now_ms is None or feeds.mark_due(feed, now_ms):
            feeds.mark_feed(self.engine, feed)

    def progress_notices(self, scope: str | None, *, after: int | None) -> tuple[list[Notice], int]:
        """Best-effort progress notices of running jobs after a per-process position (``None``: from now)."""
        return self.progress.notices(scope, after=after)

    # -- admission -----------------------------------------------------------------------------
    def admission(self) -> dict[str, Any]:
        """What waits for admission per queue and reason, fair share's settings and every limit's use."""
        found = admission_usage(self.engine)
        return {
            "fair_share": {"enabled": found.fair_share, "window": found.window},
            "waiting": [{"queue": q, "reason": r, "jobs": n} for q, r, n in found.waiting],
            "limits": [dataclasses.asdict(limit) for limit in found.limits],
        }

    # -- activity ------------------------------------------------------------------------------
    def activity(
        self, scope: str | None, *, since: datetime, bucket_s: int, group_by: str | None = None
    ) -> list[ActivityBucket]:
        """Finished jobs per bucket; an interrupted job counts as failed (it did not finish its work)."""
        return [
            ActivityBucket(
                start=a.start,
                group=a.group,
                succeeded=a.succeeded,
                failed=a.failed + a.interrupted,
                cancelled=a.cancelled,
                wait_p50_s=a.wait_p50_s,
                run_p50_s=a.run_p50_s,
                run_p95_s=a.run_p95_s,
                run_max_s=a.run_max_s,
            )
            for a in activity(
                self.engine, since=since, bucket_s=bucket_s, owner_id=scope, is_admin=scope is None, group_by=group_by
            )
        ]

    # -- files ---------------------------------------------------------------------------------
    def output_file(self, scope, job_id, name):  # type: ignore[no-untyped-def]
        self.get(scope, job_id)  # 404 for missing/foreign jobs first
        if name not in self._files(job_id):
            raise NotFound("No such file.")
        return self._output_dir(job_id).resolve() / name

    # -- schedules -----------------------------------------------------------------------------
    def schedules(self) -> list[ScheduleView]:
        try:
            from tasks import scheduling
        except ImportError:
            return []
        try:
            views = scheduling.schedules(self.broker)
            history = scheduling.history(broker=self.broker)
        except Exception:  # no scheduler configured in this process
            return []
        return [_schedule_view(v, history.get(v.name, ())) for v in views]

    def run_schedule_now(self, name, *, owner_id, session=None):  # type: ignore[no-untyped-def]
        scheduling = _scheduling()
        try:
            fire = scheduling.run_now(name, by=owner_id, broker=self.broker, session=session)
        except scheduling.ScheduleNotFound:
            raise NotFound(f"No schedule named {name!r}.") from None
        return {
            "schedule": fire.schedule,
            "job_id": fire.job_id,
            "message_id": fire.message_id,
            "fired_at": datetime.fromtimestamp(fire.fired_at / 1000, UTC),
        }

    def set_schedule_paused(self, name, paused, *, by, session=None):  # type: ignore[no-untyped-def]
        scheduling = _scheduling()
        try:
            if paused:
                scheduling.pause(name, by=by, broker=self.broker, session=session)
            else:
                scheduling.resume(name, broker=self.broker, session=session)
        except scheduling.ScheduleNotFound:
            raise NotFound(f"No schedule named {name!r}.") from None
        return {"name": name, "paused": paused}


def _scheduling():  # type: ignore[no-untyped-def]
    try:
        from tasks import scheduling
    except ImportError:
        raise NotFound("Schedules are not available in this deployment.") from None
    return scheduling


def _schedule_view(v: Any, fires: Sequence[Any] = ()) -> ScheduleView:
    """A ``tasks.scheduling.ScheduleView`` and its newest fire rows as the web layer's view."""

    def at(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, UTC)

    def dt(ms: int | None) -> datetime | None:
        return None if ms is None else at(ms)

    return ScheduleView(
        name=v.name,
        cron=v.spec,
        kind=v.actor_name,
        job_kind=v.job_kind,
        next_fire_at=dt(v.next_fire_ms),
        last_fire_at=dt(v.last_fire_ms),
        paused=v.paused,
        paused_by=v.paused_by,
        paused_at=dt(v.paused_at),
        queue=v.queue_name,
        declared=v.declared,
        catchup=v.catchup,
        grace_s=v.grace_s,
        jitter_s=v.jitter_s,
        jitter_offset_s=v.jitter_offset_ms / 1000,
        max_staleness_s=v.max_staleness_s,
        fires=tuple(
            FireView(
                tick=at(f.fire_time),
                cause=f.cause,
                fired_at=at(f.fired_at),
                due_at=at(f.due_at),
                fired_by=f.fired_by,
                job_id=f.job_id,
                message_id=f.message_id,
                duplicates=f.duplicates,
                skipped=f.skipped - f.skipped_more,
                skipped_more=f.skipped_more,
                skipped_from=dt(f.skipped_from),
            )
            for f in fires
        ),
    )


def _kind_info(kind: Any) -> KindInfo:
    """What the API and the UI say about a kind: all of it from the kind's payload schema."""
    schema = kind.schema
    return KindInfo(
        name=kind.name,
        title=schema.title,
        description=schema.description,
        queue=kind.queue,
        fields=tuple(
            FieldSpec(
                name=f.name,
                type=f.type,
                required=f.required,
                default=f.default,
                help=f.help or {"list": "One per line.", "object": "A JSON object."}.get(f.type, ""),
                choices=f.choices,
                nullable=f.nullable,
                label=f.label,
                unit=f.unit,
                minimum=f.minimum,
                maximum=f.maximum,
                exclusive_minimum=f.exclusive_minimum,
                after=f.after,
            )
            for f in schema.fields()
        ),
        payload_schema=schema.json_schema(),
    )


class ProgressWatcher:
    """Best-effort progress notices of one web process, found by polling the running jobs.

    Progress writes no event (the change feed carries every status and event notice). Every
    ``poll_s`` this reads the running jobs and raises a notice for each one whose progress or status
    line changed since the last poll — or that started running since then and already reported
    progress (a claim clears it). The first poll, the baseline, runs when the first subscriber
    arrives, before it takes its position, so a change made after that is never mistaken for the
    baseline. Positions are ``prefix * 10**9 + n`` with a random per-process prefix, never sent to
    clients: a position from another process is recognised and restarts from now.
    """

    ACTIVE_LIMIT = 500
    RETAIN = 5_000

    def __init__(self, gateway: JobLayerGateway, poll_s: float = 0.5) -> None:
        self.gateway = gateway
        self.poll_s = poll_s
        self.prefix = random.randrange(1, 9_000_000)
        self._counter = itertools.count(1)
        self._ring: deque[tuple[int, Notice]] = deque(maxlen=self.RETAIN)
        self._seen: dict[str, tuple[Any, ...]] | None = None
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            self._poll_guarded()  # the baseline, before the first subscriber takes its position
            self._thread = threading.Thread(target=self._run, name="tenure-progress-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.poll_s)
            self._poll_guarded()

    def _poll_guarded(self) -> None:
        try:
            self.poll_once()
        except Exception:  # a busy or restarting database must not kill the feed
            logger.warning("Progress poll failed; retrying.", exc_info=True)

    def poll_once(self) -> None:
        """Compare the running jobs with the last poll and record a notice for each progress change."""
        with self._poll_lock:
            running = joblayer.list_jobs(
                self.gateway.engine,
                owner_id="",
                is_admin=True,
                where=JobFilter(statuses=("running",)),
                limit=self.ACTIVE_LIMIT,
            )
            baseline = self._seen is None
            previous = self._seen or {}
            seen: dict[str, tuple[Any, ...]] = {}
            for r in running:
                state = (r.attempt, r.progress, r.progress_message)
                seen[r.id] = state
                before = previous.get(r.id)
                if baseline or before == state:
                    continue
                if (before is None or before[0] != state[0]) and state[1:] == (None, None):
                    continue  # an attempt that has reported nothing yet: its status event says it started
                notice = Notice(
                    "", r.id, r.owner_id, "progress", "running", r.progress, r.progress_message, datetime.now(UTC)
                )
                with self._lock:
                    self._ring.append((self.prefix * 10**9 + next(self._counter), notice))
            self._seen = seen

    def notices(self, scope: str | None, *, after: int | None) -> tuple[list[Notice], int]:
        """Notices after a position of this process (``None`` or a foreign one: from now) and the new position."""
        self._start()
        with self._lock:
            head = self._ring[-1][0] if self._ring else self.prefix * 10**9
            if after is None or after // 10**9 != self.prefix:
                return [], head
            newer = [n for position, n in self._ring if position > after]
        return [n for n in newer if scope is None or n.owner_id == scope], head
