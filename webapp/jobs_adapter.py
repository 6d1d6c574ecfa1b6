"""The :class:`~webapp.gateway.JobsGateway` over Tenure's job layer (``jobs``) and schedules.

Everything here calls ``jobs`` services; no SQL. Where the job layer has no query for what a page
needs yet, the adapter composes the existing ones and says so:

- list filters beyond owner/status/kind (several statuses, queue, created range, text search) are
  applied to pages of ``jobs.list_jobs`` (newest first), scanning at most :data:`MAX_SCAN_ROWS` rows
  per request; a page may come back short with a ``next_cursor`` to continue the scan;
- counts (bulk dry-run) scan the same way, up to :data:`MAX_COUNT_ROWS`;
- the live feed's notices come from the job layer's global, commit-ordered change feed
  (``jobs.queries.changes_after``: one id per job event, the same in every process), so a cursor
  minted by one web process resumes in any other. Progress updates write no event: they come from
  :class:`ChangeDetector`, a per-process poller over the running jobs, as best-effort notices that
  carry the current cursor (never replayed; the job's state is re-read anyway). On a database
  without the change feed (PostgreSQL) the detector provides every notice, with per-process cursors.
"""

from __future__ import annotations

import inspect
import itertools
import random
import threading
import types
import typing
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePath
from statistics import median, quantiles
from types import SimpleNamespace
from typing import Any

import jobs as joblayer
from jobs.queries import changes_after, finished_since
from jobs.registry import Registry
from jobs.registry import registry as default_registry

from .errors import Conflict, Invalid, JobNotFoundError, NotFound
from .gateway import (
    TERMINAL,
    ActivityBucket,
    CursorExpired,
    EventView,
    FieldSpec,
    JobQuery,
    JobView,
    KindInfo,
    Notice,
    Page,
    ScheduleView,
)

#: Rows one list request may scan when filters are applied outside SQL.
MAX_SCAN_ROWS = 5_000
#: Rows a count (bulk dry-run) may scan.
MAX_COUNT_ROWS = 20_000
_BATCH = 200
_MAX_MS = 253_402_300_799_000


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def _encode_cursor(record: Any) -> str:
    return f"{_ms(record.created_at)}.{record.id}"


def _decode_cursor(cursor: str | None) -> Any:
    if not cursor:
        return None
    ms, sep, job_id = cursor.partition(".")
    if not sep or not ms.isdigit() or len(ms) > 15 or len(job_id) > 100:
        raise Invalid("Malformed cursor.", details={"cursor": ["not a cursor this API returned"]})
    # A cursor beyond the representable range lies after every job: clamp it (9999-12-31).
    return SimpleNamespace(created_at=datetime.fromtimestamp(min(int(ms), _MAX_MS) / 1000, UTC), id=job_id)


class JobLayerGateway:
    """The web layer's view of ``jobs`` (see :mod:`webapp.gateway` for the contract)."""

    def __init__(self, *, engine: Any, broker: Any, settings: Any, registry: Registry | None = None) -> None:
        self.engine = engine
        self.broker = broker
        self.settings = settings
        self.registry = registry or default_registry
        #: The job layer's global change feed is available (SQLite); otherwise the detector does it all.
        self.global_feed = getattr(getattr(engine, "dialect", None), "name", "") == "sqlite"
        self.detector = ChangeDetector(self, progress_only=self.global_feed)

    # -- kinds ---------------------------------------------------------------------------------
    def kinds(self) -> list[KindInfo]:
        return [self._kind_info(self.registry.get(name)) for name in self.registry.names()]

    @staticmethod
    def _kind_info(kind: Any) -> KindInfo:
        doc = inspect.getdoc(kind.fn) or ""
        title, _, rest = doc.partition("\n")
        hints = _type_hints(kind.fn)
        fields = []
        for param in _payload_params(kind.fn):
            field_type = _field_type(hints.get(param.name, param.annotation))
            default = None if param.default is inspect.Parameter.empty else param.default
            nullable = param.default is None
            if isinstance(default, tuple | list):
                default = "\n".join(str(v) for v in default) if field_type == "list" else None
            fields.append(
                FieldSpec(
                    name=param.name,
                    type=field_type,
                    required=param.default is inspect.Parameter.empty,
                    default=default if isinstance(default, str | int | float | bool) else None,
                    help={"list": "one per line", "object": "a JSON object"}.get(field_type, ""),
                    nullable=nullable,
                )
            )
        return KindInfo(
            name=kind.name,
            title=title.rstrip(".") or kind.name.replace("_", " ").capitalize(),
            description=rest.strip().split("\n\n")[0],
            queue=kind.queue,
            fields=tuple(fields),
        )

    def _queue_of(self, kind: str) -> str:
        found = self.registry.find(kind)
        return found.queue if found else "default"

    # -- records -------------------------------------------------------------------------------
    def _view(self, r: Any) -> JobView:
        return JobView(
            id=r.id,
            owner_id=r.owner_id,
            kind=r.kind,
            status=str(r.status),
            queue=self._queue_of(r.kind),
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
            files=tuple(self._files(r.id)) if str(r.status) in TERMINAL else (),
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
    def submit(self, *, owner_id, kind, payload, idempotency_key, priority, delay_s):  # type: ignore[no-untyped-def]
        found = self.registry.find(kind)
        if found is None:
            raise Invalid(f"Unknown job kind {kind!r}.", details={"kind": [f"unknown kind {kind!r}"]})
        problems = _check_payload(found.fn, payload)
        if problems:
            raise Invalid("The payload does not fit this kind.", details=problems)
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
        except joblayer.UnknownKind as exc:
            raise Invalid(str(exc), details={"kind": [str(exc)]}) from None
        except joblayer.IdempotencyConflict as exc:
            raise Conflict(str(exc)) from None
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        self.detector.nudge()
        return self._view(record), bool(record.created)

    def get(self, scope, job_id):  # type: ignore[no-untyped-def]
        try:
            return self._view(joblayer.get_job(self.engine, job_id, owner_id=scope or "", is_admin=scope is None))
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None

    def events(self, scope, job_id, *, after, limit):  # type: ignore[no-untyped-def]
        try:
            records = joblayer.job_events(
                self.engine, job_id, owner_id=scope or "", is_admin=scope is None, after=after, limit=limit
            )
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None
        return [EventView(e.sequence, e.type, e.data, e.created_at) for e in records]

    def cancel(self, scope, job_id, *, by=None):  # type: ignore[no-untyped-def]
        try:
            result = joblayer.cancel(self.engine, job_id, by=by or scope or "admin", is_admin=scope is None)
        except joblayer.JobNotFound:
            raise JobNotFoundError() from None
        if result.outcome == joblayer.CancelOutcome.ALREADY_FINISHED:
            raise Conflict(result.message)
        self.detector.nudge()
        outcome = "cancelled" if result.outcome == joblayer.CancelOutcome.CANCELLED else "cancel_requested"
        return self._view(result.job), outcome

    def retry(self, scope, job_id, *, by=None):  # type: ignore[no-untyped-def]
        try:
            record = joblayer.retry(
                self.engine,
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
        self.detector.nudge()
        return self._view(record), bool(record.created)

    # -- lists ---------------------------------------------------------------------------------
    def _scan(self, scope: str | None, q: JobQuery, cursor: str | None, max_rows: int) -> Iterator[tuple[Any, bool]]:
        """Records newest first from *cursor*, as ``(record, matches)``; stops after *max_rows* rows."""
        owner = scope if scope is not None else q.owner_id
        before = _decode_cursor(cursor)
        if q.created_before and (before is None or q.created_before < before.created_at):
            before = SimpleNamespace(created_at=q.created_before, id="")
        status = q.statuses[0] if len(q.statuses) == 1 else None
        scanned = 0
        while scanned < max_rows:
            batch = joblayer.list_jobs(
                self.engine,
                owner_id=owner or "",
                is_admin=owner is None,
                status=status,
                kind=q.kind,
                before=before,
                limit=_BATCH,
            )
            for record in batch:
                scanned += 1
                if q.created_after and record.created_at < q.created_after:
                    return  # newest first: nothing older can match
                yield record, self._matches(record, q)
                if scanned >= max_rows:
                    return
            if len(batch) < _BATCH:
                return
            before = batch[-1]

    def _matches(self, r: Any, q: JobQuery) -> bool:
        if q.statuses and str(r.status) not in q.statuses:
            return False
        if q.queue and self._queue_of(r.kind) != q.queue:
            return False
        if q.search:
            haystack = " ".join(
                str(v or "") for v in (r.id, r.kind, r.error, r.progress_message, r.resource_type, r.resource_id)
            )
            if q.search.lower() not in haystack.lower():
                return False
        return True

    def list_jobs(self, scope, query, *, cursor, limit):  # type: ignore[no-untyped-def]
        items: list[Any] = []
        last = None
        for record, ok in self._scan(scope, query, cursor, MAX_SCAN_ROWS):
            last = record
            if ok:
                items.append(record)
                if len(items) > limit:
                    break
        if len(items) > limit:
            items = items[:limit]
            next_cursor = _encode_cursor(items[-1])
        elif last is not None and (not items or last is not items[-1]) and self._maybe_more(scope, query, last):
            next_cursor = _encode_cursor(last)  # the scan budget ran out: continue from there
        else:
            next_cursor = None
        return Page([self._view(r) for r in items], next_cursor)

    def _maybe_more(self, scope: str | None, q: JobQuery, last: Any) -> bool:
        return any(True for _ in self._scan(scope, q, _encode_cursor(last), 1))

    def count_jobs(self, scope, query):  # type: ignore[no-untyped-def]
        return sum(1 for _, ok in self._scan(scope, query, None, MAX_COUNT_ROWS) if ok)

    # -- live feed -----------------------------------------------------------------------------
    def notices(self, scope, *, after, limit):  # type: ignore[no-untyped-def]
        if not self.global_feed:
            return self.detector.notices(scope, after=after, limit=limit)
        items, oldest, head = changes_after(self.engine, after, owner_id=scope, is_admin=scope is None, limit=limit)
        if oldest and after < oldest - 1:
            raise CursorExpired(head)
        notices = [
            Notice(
                c.id,
                c.job_id,
                c.owner_id,
                "status" if c.type == "status" else "event",
                c.status,
                c.progress,
                c.progress_message,
                c.created_at,
            )
            for c in items
        ]
        scanned = items[-1].id if len(items) >= limit else max(after, head)
        return notices, scanned

    def head(self) -> int:
        if not self.global_feed:
            return self.detector.head()
        return changes_after(self.engine, 2**62, is_admin=True, limit=1).head_id

    def progress_notices(self, scope: str | None, *, after: int | None) -> tuple[list[Notice], int]:
        """Best-effort progress notices of running jobs after a per-process position.

        *after* ``None`` starts at the current position. Returns (notices, new position). Empty when the
        detector already provides every notice (no global change feed).
        """
        if not self.global_feed:
            return [], 0
        return self.detector.local_notices(scope, after=after)

    # -- activity ------------------------------------------------------------------------------
    def activity(self, scope, *, since, bucket_s):  # type: ignore[no-untyped-def]
        # One indexed query for the window (it used to page through every finished job's record).
        finished = finished_since(self.engine, since, owner_id=scope, is_admin=scope is None)
        start = since.replace(second=0, microsecond=0)
        buckets: list[dict[str, Any]] = []
        t = start
        now = datetime.now(UTC)
        while t <= now:
            buckets.append({"start": t, "succeeded": 0, "failed": 0, "cancelled": 0, "wait": [], "run": []})
            t += timedelta(seconds=bucket_s)
        for r in finished:
            index = int((r.completed_at - start).total_seconds() // bucket_s)
            if not 0 <= index < len(buckets):
                continue
            b = buckets[index]
            status = "failed" if str(r.status) == "interrupted" else str(r.status)
            b[status] += 1
            if r.started_at:
                b["wait"].append((r.started_at - r.created_at).total_seconds())
                b["run"].append((r.completed_at - r.started_at).total_seconds())
        return [
            ActivityBucket(
                start=b["start"],
                succeeded=b["succeeded"],
                failed=b["failed"],
                cancelled=b["cancelled"],
                wait_p50_s=median(b["wait"]) if b["wait"] else None,
                run_p50_s=median(b["run"]) if b["run"] else None,
                run_p95_s=(quantiles(b["run"], n=20)[-1] if len(b["run"]) >= 2 else b["run"][0]) if b["run"] else None,
            )
            for b in buckets
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
        except Exception:  # no scheduler configured in this process
            return []
        return [_schedule_view(v) for v in views]

    def run_schedule_now(self, name, *, owner_id):  # type: ignore[no-untyped-def]
        scheduling = _scheduling()
        try:
            fire = scheduling.run_now(name, by=owner_id, broker=self.broker)
        except scheduling.ScheduleNotFound:
            raise NotFound(f"No schedule named {name!r}.") from None
        self.detector.nudge()
        return {
            "schedule": fire.schedule,
            "job_id": fire.job_id,
            "message_id": fire.message_id,
            "fired_at": datetime.fromtimestamp(fire.fired_at / 1000, UTC),
        }

    def set_schedule_paused(self, name, paused, *, by):  # type: ignore[no-untyped-def]
        scheduling = _scheduling()
        try:
            if paused:
                scheduling.pause(name, by=by, broker=self.broker)
            else:
                scheduling.resume(name, broker=self.broker)
        except scheduling.ScheduleNotFound:
            raise NotFound(f"No schedule named {name!r}.") from None
        return {"name": name, "paused": paused}


def _scheduling():  # type: ignore[no-untyped-def]
    try:
        from tasks import scheduling
    except ImportError:
        raise NotFound("Schedules are not available in this deployment.") from None
    return scheduling


def _schedule_view(v: Any) -> ScheduleView:
    def dt(value: Any) -> datetime | None:
        if value is None or isinstance(value, datetime):
            return value
        return datetime.fromtimestamp(value / 1000, UTC)

    return ScheduleView(
        name=str(getattr(v, "name", "?")),
        cron=str(getattr(v, "describe", None) or getattr(v, "spec", None) or getattr(v, "cron", "")),
        kind=getattr(v, "actor_name", None),
        next_fire_at=dt(getattr(v, "next_fire_ms", None) or getattr(v, "next_fire_at", None)),
        last_fire_at=dt(getattr(v, "last_fire_ms", None) or getattr(v, "last_fire_at", None)),
        paused=bool(getattr(v, "paused", False)),
    )


def _payload_params(fn: Any) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())[1:]  # the first is the JobContext
    return [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _type_hints(fn: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation that cannot be resolved here: fall back to the raw ones
        return {}


def _field_type(annotation: Any) -> str:
    """The form/JSON type of a payload parameter's annotation (``X | None`` counts as ``X``)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return "string"
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    origin = typing.get_origin(annotation) or annotation
    if origin is bool:
        return "boolean"
    if origin is int:
        return "integer"
    if origin is float:
        return "number"
    if isinstance(origin, type):
        if issubclass(origin, str | PurePath):
            return "string"
        if issubclass(origin, Mapping):
            return "object"
        if issubclass(origin, Sequence):
            return "list"
    return "string"


_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
    "object": lambda v: isinstance(v, dict),
}
_NAMES = {"list": "list of strings", "object": "JSON object"}


def _check_payload(fn: Any, payload: dict[str, Any]) -> dict[str, list[str]]:
    """Per-field problems of *payload* for ``fn(ctx, **payload)``: missing, unknown, wrong type."""
    params = _payload_params(fn)
    hints = _type_hints(fn)
    takes_any = any(p.kind == p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    names = {p.name: p for p in params}
    problems: dict[str, list[str]] = {}
    for p in params:
        if p.default is inspect.Parameter.empty and p.name not in payload:
            problems[p.name] = ["Missing data for required field."]
    for key, value in payload.items():
        param = names.get(key)
        if param is None:
            if not takes_any:
                problems[key] = ["Unknown field."]
            continue
        if value is None:
            if param.default is not None:
                problems[key] = ["Field may not be null."]
            continue
        expected = _field_type(hints.get(key, param.annotation))
        if not _CHECKS[expected](value):
            problems[key] = [f"Not a valid {_NAMES.get(expected, expected)}."]
    return problems


class ChangeDetector:
    """A per-process stream of job notices, found by polling the job layer.

    Every ``poll_s`` it reads the queued and running jobs plus the newest ones, compares them with
    what it saw last time, and appends a :class:`~webapp.gateway.Notice` for every new job, status
    change or progress/event change. A job it was tracking that left the active set is re-read, so
    its final status is never missed. Notice ids are ``prefix * 10**9 + n`` with a random
    per-process prefix: a cursor minted by another process (another gunicorn worker, a restart) is
    recognised as foreign and answered with a resync instead of a wrong resume.

    With ``progress_only`` (the job layer's change feed carries every status and event notice) it
    tracks the running jobs only and raises just their progress changes. Otherwise (no change feed:
    PostgreSQL) only the newest :data:`ACTIVE_LIMIT` queued and running jobs are tracked; changes are
    seen with up to one poll interval of delay; the history kept is the last :data:`RETAIN` notices
    of this process.
    """

    ACTIVE_LIMIT = 500
    RECENT_LIMIT = 100
    RETAIN = 5_000

    def __init__(self, gateway: JobLayerGateway, poll_s: float = 0.5, *, progress_only: bool = False) -> None:
        self.gateway = gateway
        self.poll_s = poll_s
        #: Track only running jobs and raise only progress notices (status changes come from the
        #: job layer's change feed).
        self.progress_only = progress_only
        self.prefix = random.randrange(1, 9_000_000)
        self._counter = itertools.count(1)
        self._ring: deque[Notice] = deque(maxlen=self.RETAIN)
        self._seen: dict[str, tuple] = {}
        self._lock = threading.Lock()
        #: One poll at a time (the background thread, or a caller of poll_once): a change is noticed once.
        self._poll_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._primed = threading.Event()

    def _base(self) -> int:
        return self.prefix * 10**9

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="tenure-change-detector", daemon=True)
            self._thread.start()
        self._primed.wait(timeout=5)

    def nudge(self) -> None:
        """Poll now (the web process itself changed a job)."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            try:
                self.poll_once()
            except Exception:  # a busy or restarting database must not kill the feed
                import logging

                logging.getLogger(__name__).warning("Live feed poll failed; retrying.", exc_info=True)
            self._primed.set()
            self._wake.wait(self.poll_s)
            self._wake.clear()

    @staticmethod
    def _state(r: Any) -> tuple:
        return (str(r.status), r.progress, r.progress_message, r.last_event_sequence, r.cancel_requested)

    def poll_once(self) -> None:
        """Compare the job layer's current state with the last poll and append notices for changes."""
        with self._poll_lock:
            self._poll()

    def _poll(self) -> None:
        g = self.gateway
        current: dict[str, Any] = {}
        if self.progress_only:
            self._poll_progress()
            return
        for status in ("queued", "running"):
            for r in joblayer.list_jobs(g.engine, owner_id="", is_admin=True, status=status, limit=self.ACTIVE_LIMIT):
                current[r.id] = r
        for r in joblayer.list_jobs(g.engine, owner_id="", is_admin=True, limit=self.RECENT_LIMIT):
            current.setdefault(r.id, r)
        for job_id in set(self._seen) - set(current):
            state = self._seen[job_id]
            if state[0] in TERMINAL:
                continue
            try:
                current[job_id] = joblayer.get_job(g.engine, job_id, owner_id="", is_admin=True)
            except joblayer.JobNotFound:
                continue
        first = not self._primed.is_set()
        new_seen: dict[str, tuple] = {}
        for job_id, r in current.items():
            state = self._state(r)
            new_seen[job_id] = state
            before = self._seen.get(job_id)
            if first or before == state:
                continue
            kind = "status" if before is None or before[0] != state[0] else "progress"
            with self._lock:
                self._ring.append(
                    Notice(
                        self._base() + next(self._counter),
                        r.id,
                        r.owner_id,
                        kind,
                        state[0],
                        r.progress,
                        r.progress_message,
                        datetime.now(UTC),
                    )
                )
        self._seen = new_seen

    def _poll_progress(self) -> None:
        g = self.gateway
        running = joblayer.list_jobs(g.engine, owner_id="", is_admin=True, status="running", limit=self.ACTIVE_LIMIT)
        first = not self._primed.is_set()
        new_seen: dict[str, tuple] = {}
        for r in running:
            state = (r.attempt, r.progress, r.progress_message)
            new_seen[r.id] = state
            before = self._seen.get(r.id)
            if first or before is None or before == state or before[0] != state[0]:
                continue  # a new attempt starts with a status event, which the change feed carries
            with self._lock:
                self._ring.append(
                    Notice(
                        self._base() + next(self._counter),
                        r.id,
                        r.owner_id,
                        "progress",
                        "running",
                        r.progress,
                        r.progress_message,
                        datetime.now(UTC),
                    )
                )
        self._seen = new_seen

    def local_notices(self, scope: str | None, *, after: int | None) -> tuple[list[Notice], int]:
        """Notices after a position of this process (``None``: from now), skipping lost ones silently."""
        self._start()
        with self._lock:
            head = self._ring[-1].id if self._ring else self._base()
            if after is None or after // 10**9 != self.prefix:
                return [], head
            newer = [n for n in self._ring if n.id > after]
        return [n for n in newer if scope is None or n.owner_id == scope], head

    def head(self) -> int:
        self._start()
        with self._lock:
            return self._ring[-1].id if self._ring else self._base()

    def notices(self, scope: str | None, *, after: int, limit: int) -> tuple[list[Notice], int]:
        self._start()
        with self._lock:
            head = self._ring[-1].id if self._ring else self._base()
            oldest = self._ring[0].id if self._ring else head + 1
            if after // 10**9 != self.prefix or after < oldest - 1:
                raise CursorExpired(head)
            newer = [n for n in self._ring if n.id > after]
        visible: list[Notice] = []
        scanned = after
        for n in newer:
            if len(visible) >= limit:
                break
            scanned = n.id
            if scope is None or n.owner_id == scope:
                visible.append(n)
        return visible, scanned
