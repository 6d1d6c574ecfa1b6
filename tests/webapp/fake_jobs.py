"""An in-memory :class:`webapp.gateway.JobsGateway` for web tests that do not need the job layer.

It keeps the gateway's contract (scoping, 404 for foreign jobs, 409s, notices with a retention
window) so the API, authorization and live-feed tests exercise the web layer alone. Tests drive
job state with :meth:`FakeJobs.advance`.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from webapp.errors import Conflict, Invalid, JobNotFoundError, NotFound
from webapp.gateway import (
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

KINDS = [
    KindInfo(
        "echo",
        "Echo",
        "Returns its text.",
        "default",
        (FieldSpec("text", "string", True, help="what to echo"), FieldSpec("times", "integer", False, 1)),
    ),
    KindInfo("sleep", "Sleep", "Sleeps.", "slow", (FieldSpec("seconds", "number", True),)),
]


class FakeJobs:
    def __init__(self, retain_notices: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.jobs: dict[str, JobView] = {}
        self.payloads: dict[str, dict[str, Any]] = {}
        self.job_events: dict[str, list[EventView]] = {}
        self.keys: dict[tuple[str, str, str], tuple[str, str]] = {}
        self.feed: list[Notice] = []
        self.retain = retain_notices
        self._notice_ids = itertools.count(1)
        self.files: dict[tuple[str, str], Path] = {}
        self.schedule_list: list[ScheduleView] = []

    # -- helpers for tests ---------------------------------------------------------------------
    def _notify(self, job: JobView, type_: str = "status") -> None:
        self.feed.append(
            Notice(next(self._notice_ids), job.id, job.owner_id, type_, job.status, job.progress, job.progress_message)
        )
        if len(self.feed) > self.retain:
            del self.feed[: len(self.feed) - self.retain]

    def _event(self, job_id: str, type_: str, **data: Any) -> None:
        events = self.job_events.setdefault(job_id, [])
        events.append(EventView(len(events) + 1, type_, data, datetime.now(UTC)))

    def advance(self, job_id: str, **changes: Any) -> JobView:
        """Change a job like a worker would, and raise its notice."""
        with self._lock:
            job = replace(self.jobs[job_id], **changes)
            if job.status in ("succeeded", "failed", "cancelled", "interrupted") and job.completed_at is None:
                job = replace(job, completed_at=datetime.now(UTC))
            self.jobs[job_id] = job
            self._event(
                job_id, "status" if "status" in changes else "progress", **{k: str(v) for k, v in changes.items()}
            )
            self._notify(job, "status" if "status" in changes else "progress")
            return job

    # -- gateway -----------------------------------------------------------------------------
    def kinds(self) -> list[KindInfo]:
        return list(KINDS)

    def submit(self, *, owner_id, kind, payload, idempotency_key, priority, delay_s):  # type: ignore[no-untyped-def]
        info = {k.name: k for k in KINDS}.get(kind)
        if info is None:
            raise Invalid(f"Unknown job kind {kind!r}.", details={"kind": ["unknown kind"]})
        missing = [f.name for f in info.fields if f.required and f.name not in payload]
        if missing:
            raise Invalid("The payload is incomplete.", details={name: ["required"] for name in missing})
        digest = repr(sorted(payload.items()))
        with self._lock:
            if idempotency_key:
                found = self.keys.get((owner_id, kind, idempotency_key))
                if found:
                    if found[1] != digest:
                        raise Conflict("This idempotency key was already used for a different request.")
                    return self.jobs[found[0]], False
            job_id = f"j{next(self._ids):06d}"
            job = JobView(
                id=job_id,
                owner_id=owner_id,
                kind=kind,
                status="queued",
                queue=info.queue,
                priority=priority,
                attempt=0,
                max_attempts=3,
                created_at=datetime.now(UTC),
            )
            self.jobs[job_id] = job
            self.payloads[job_id] = payload
            if idempotency_key:
                self.keys[(owner_id, kind, idempotency_key)] = (job_id, digest)
            self._event(job_id, "status", status="queued")
            self._notify(job)
            return job, True

    def _visible(self, scope: str | None, job_id: str) -> JobView:
        job = self.jobs.get(job_id)
        if job is None or (scope is not None and job.owner_id != scope):
            raise JobNotFoundError()
        return job

    def get(self, scope, job_id):  # type: ignore[no-untyped-def]
        with self._lock:
            return self._visible(scope, job_id)

    def _matching(self, scope: str | None, q: JobQuery) -> list[JobView]:
        out = []
        for job in sorted(self.jobs.values(), key=lambda j: j.id, reverse=True):
            if scope is not None and job.owner_id != scope:
                continue
            if q.statuses and job.status not in q.statuses:
                continue
            if q.kind and job.kind != q.kind or q.queue and job.queue != q.queue:
                continue
            if q.owner_id and job.owner_id != q.owner_id:
                continue
            if q.created_after and job.created_at < q.created_after:
                continue
            if q.created_before and job.created_at >= q.created_before:
                continue
            if q.search and q.search.lower() not in f"{job.id} {job.kind} {job.error or ''}".lower():
                continue
            out.append(job)
        return out

    def list_jobs(self, scope, query, *, cursor, limit):  # type: ignore[no-untyped-def]
        with self._lock:
            jobs = self._matching(scope, query)
        if cursor:  # the real adapter's cursor shape: "<created ms>.<id>"
            jobs = [j for j in jobs if j.id < cursor.partition(".")[2]]
        page = jobs[:limit]
        return Page(page, f"0.{page[-1].id}" if len(jobs) > limit else None)

    def count_jobs(self, scope, query):  # type: ignore[no-untyped-def]
        with self._lock:
            return len(self._matching(scope, query))

    def events(self, scope, job_id, *, after, limit):  # type: ignore[no-untyped-def]
        with self._lock:
            self._visible(scope, job_id)
            return [e for e in self.job_events.get(job_id, []) if e.sequence > after][:limit]

    def cancel(self, scope, job_id, *, by=None):  # type: ignore[no-untyped-def]
        with self._lock:
            job = self._visible(scope, job_id)
        if job.status == "queued":
            return self.advance(job_id, status="cancelled"), "cancelled"
        if job.status == "running":
            return self.advance(job_id, cancel_requested=True), "cancel_requested"
        raise Conflict(f"The job already finished ({job.status}).")

    def retry(self, scope, job_id, *, by=None):  # type: ignore[no-untyped-def]
        with self._lock:
            job = self._visible(scope, job_id)
            payload = self.payloads[job_id]
        if not job.can_retry:
            raise Conflict("Only failed, cancelled or interrupted jobs can be retried.")
        with self._lock:
            earlier = next((j for j in self.jobs.values() if j.retry_of_job_id == job.id), None)
        if earlier is not None:  # retried once, as the job layer does
            return earlier, False
        new, _ = self.submit(
            owner_id=job.owner_id,
            kind=job.kind,
            payload=payload,
            idempotency_key=None,
            priority=job.priority,
            delay_s=0,
        )
        with self._lock:
            new = replace(new, retry_of_job_id=job.id)
            self.jobs[new.id] = new
        return new, True

    def head(self) -> int:
        with self._lock:
            return self.feed[-1].id if self.feed else 0

    def notices(self, scope, *, after, limit):  # type: ignore[no-untyped-def]
        with self._lock:
            if self.feed and after < self.feed[0].id - 1:
                raise CursorExpired(self.feed[-1].id)
            newer = [n for n in self.feed if n.id > after]
        visible, scanned = [], after
        for n in newer:
            if len(visible) >= limit:
                break
            scanned = n.id
            if scope is None or n.owner_id == scope:
                visible.append(n)
        return visible, scanned

    def activity(self, scope, *, since, bucket_s):  # type: ignore[no-untyped-def]
        buckets: dict[datetime, dict[str, int]] = {}
        with self._lock:
            for job in self.jobs.values():
                if job.completed_at and job.completed_at >= since:
                    start = job.completed_at.replace(second=0, microsecond=0)
                    b = buckets.setdefault(start, {"succeeded": 0, "failed": 0, "cancelled": 0})
                    if job.status in b:
                        b[job.status] += 1
        return [ActivityBucket(start, **counts, run_p50_s=1.0) for start, counts in sorted(buckets.items())]

    def output_file(self, scope, job_id, name):  # type: ignore[no-untyped-def]
        self.get(scope, job_id)
        path = self.files.get((job_id, name))
        if path is None:
            raise NotFound("No such file.")
        return path

    def schedules(self):  # type: ignore[no-untyped-def]
        return list(self.schedule_list)

    def run_schedule_now(self, name, *, owner_id):  # type: ignore[no-untyped-def]
        if name not in {s.name for s in self.schedule_list}:
            raise NotFound(f"No schedule named {name!r}.")
        job, _ = self.submit(
            owner_id=owner_id, kind="echo", payload={"text": name}, idempotency_key=None, priority=0, delay_s=0
        )
        return {"schedule": name, "job_id": job.id, "message_id": None, "fired_at": datetime.now(UTC)}

    def set_schedule_paused(self, name, paused, *, by):  # type: ignore[no-untyped-def]
        found = [s for s in self.schedule_list if s.name == name]
        if not found:
            raise NotFound(f"No schedule named {name!r}.")
        self.schedule_list = [replace(s, paused=paused) if s.name == name else s for s in self.schedule_list]
        return {"name": name, "paused": paused}
