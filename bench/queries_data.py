"""The read-side benchmark's data set: N jobs and E events, generated and bulk-loaded on SQLite and PostgreSQL.

The rows are the ones the job layer writes (:func:`jobs.store.job_insert`, the status events of
:mod:`jobs.transitions`), made up by a seeded generator so both engines hold the same jobs:

* created times over the last :data:`HISTORY_DAYS` days, :data:`RECENT_SHARE` of them in the last day,
  one insert order (rowid order is creation order, as in production);
* owners ``"1"``..``"300"``, log-uniform (a few owners hold most jobs; owner ``"2"``, the benchmark's
  user, about 7 %), the kinds of :mod:`tasks` on their queues, with their summaries and resources;
* the newest :data:`QUEUED_SHARE` of jobs queued (the backlog), the :data:`RUNNING` before them running
  (with a worker and a lease), every older one finished: succeeded, failed (with one of a few real-looking
  error texts), cancelled or interrupted, with its wait and run times;
* events: ``queued`` (and ``running``, and the final status), plus ``log`` lines on started jobs, so the
  total is exactly E; ``jobs.event_seq`` is each job's event count.

Loading goes around the per-row costs and then rebuilds what they would have produced, from the schema's
own definitions (read from the migrated database, so a later revision's index is rebuilt too):

* SQLite: the ``jobs``/``job_events`` indexes and the FTS insert trigger are dropped, the rows inserted in
  one transaction, the indexes recreated from ``sqlite_master``, ``jobs_search`` rebuilt (FTS5 ``rebuild``),
  the trigger recreated. No ``ANALYZE``: the product never runs it, so the planner works without statistics
  as it does in a deployment.
* PostgreSQL: the secondary indexes and the events' foreign key are dropped, rows go in with ``COPY``
  (the ``job_search`` trigger stays on, so ``job_search`` is exactly what the trigger writes), indexes and the
  constraint are recreated from ``pg_indexes``/``pg_get_constraintdef``, then ``VACUUM ANALYZE`` (what
  autovacuum would have done to a table of that age).

A loaded database is cached (SQLite: a file under ``var/bench-queries/``; PostgreSQL: a database named after
the data set) with a meta row giving its generator version, sizes and generation time; a rerun with the same
sizes reuses it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Bump when the generated rows change: a cached database of another version is rebuilt.
VERSION = 1
SEED = 20261204
HISTORY_DAYS = 90
RECENT_SHARE = 0.15
QUEUED_SHARE = 0.002
RUNNING = 200
OWNERS = 300
DAY_MS = 86_400_000

#: (kind, queue, actor, weight, run time median s, max attempts)
KINDS = [
    ("render_clip", "render", "render_clip", 35, 90.0, 3),
    ("transcribe", "asr", "transcribe", 30, 240.0, 3),
    ("notify_webhook", "notify", "notify_webhook", 15, 0.4, 6),
    ("import_recording", "default", "import_recording", 10, 20.0, 3),
    ("notify_email", "notify", "notify_email", 7, 0.8, 3),
    ("recording_pipeline", "workflow", "", 3, 600.0, 1),
]
FINISHED = [("succeeded", 85), ("failed", 9), ("cancelled", 5), ("interrupted", 1)]
ERRORS = [
    "ffmpeg exited with code 1: Invalid data found when processing input ({seg}.flv)",
    "TimeoutError: the job exceeded its timeout of 600 s",
    "HTTPStatusError: 503 Service Unavailable from https://hooks.example.com/tenure/{n}",
    "ConnectionRefusedError: [Errno 111] Connection refused (smtp.example.com:587)",
    "SegmentNotFound: session s{sid} has no segment {n}",
    "whisper: CUDA out of memory while transcribing s{sid} segment {n}",
    "PermissionError: [Errno 13] Permission denied: '/data/recordings/room-{room}/{day}'",
    "ValueError: clip window {n}–{m} s lies outside the recording",
]
WEBHOOK_EVENTS = ["clip.rendered", "import.finished", "transcript.ready", "job.failed"]
CHANNELS = ["ops-alerts", "team-video", "room-news", "archive-bot"]
SUBJECTS = ["Weekly digest", "Import finished", "Clip ready", "Transcript ready"]


@dataclass(frozen=True)
class DataSet:
    jobs: int
    events: int
    #: The generation time (ms epoch): every created/finished time lies before it.
    t0_ms: int

    @property
    def key(self) -> str:
        return f"v{VERSION}_{self.jobs}_{self.events}"

    @property
    def queued(self) -> int:
        return int(self.jobs * QUEUED_SHARE)

    @property
    def running(self) -> int:
        return min(RUNNING, self.jobs - self.queued)


def job_id(i: int) -> str:
    """Job *i*'s id: 32 hex digits, unique (the first 8 are a bijection of *i*), looking random."""
    head = (i * 2654435761 + 0x9E3779B9) % 2**32
    tail = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=12).hexdigest()
    return f"{head:08x}{tail}"


def created_ms(ds: DataSet, i: int) -> int:
    """Job *i*'s creation time: increasing with *i*, RECENT_SHARE of the jobs in the last day."""
    newer = (ds.jobs - i) / ds.jobs  # the share of jobs newer than this one
    if newer <= RECENT_SHARE:
        age = newer / RECENT_SHARE * DAY_MS
    else:
        age = DAY_MS + (newer - RECENT_SHARE) / (1 - RECENT_SHARE) * (HISTORY_DAYS - 1) * DAY_MS
    return ds.t0_ms - int(age) - 1


def _pick(rng: random.Random, table: list[tuple[Any, ...]], weight_at: int) -> tuple[Any, ...]:
    total = sum(t[weight_at] for t in table)
    x = rng.random() * total
    for t in table:
        x -= t[weight_at]
        if x < 0:
            return t
    return table[-1]


def _shape(rng: random.Random, kind: str) -> tuple[dict[str, Any], str, tuple[str, str] | None]:
    """(payload, summary, resource) of one job of *kind*, as its kind in :mod:`tasks` makes them."""
    sid = f"s{rng.randrange(1, 40_000):05d}"
    if kind == "render_clip":
        start = rng.randrange(0, 7200)
        end = start + rng.randrange(15, 300)
        return {"session_id": sid, "start_s": start, "end_s": end}, f"{sid} {start:g}–{end:g} s", ("session", sid)
    if kind == "transcribe":
        seg = rng.randrange(0, 40)
        return {"session_id": sid, "segment": seg}, f"{sid} segment {seg}", ("session", sid)
    if kind == "notify_webhook":
        ev, ch = rng.choice(WEBHOOK_EVENTS), rng.choice(CHANNELS)
        return {"channel": ch, "event_type": ev, "data": {"session": sid}}, f"{ev} → {ch}", None
    if kind == "notify_email":
        sub, ch = rng.choice(SUBJECTS), rng.choice(CHANNELS)
        return {"channel": ch, "subject": sub, "body": "…"}, f"{sub} → {ch}", None
    folder = (
        f"/data/recordings/room-{rng.randrange(1, 5000)}/2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    )
    return {"folder": folder}, folder, ("folder", folder)


def _error(rng: random.Random) -> str:
    return rng.choice(ERRORS).format(
        seg=rng.randrange(100),
        n=rng.randrange(1, 900),
        m=rng.randrange(900, 2000),
        sid=rng.randrange(1, 40_000),
        room=rng.randrange(1, 5000),
        day=f"2026-11-{rng.randrange(1, 29):02d}",
    )


JOB_COLUMNS = (
    "id, owner_id, kind, actor_name, queue_name, resource_type, resource_id, idempotency_key, request_digest, "
    "payload, config, priority, status, attempt, max_attempts, timeout_s, safe_to_rerun, worker_id, "
    "lease_expires_at, run_after, progress, progress_message, result, error, cancel_requested_at, event_seq, "
    "created_at, updated_at, started_at, completed_at, retry_of_job_id, parent_job_id, summary"
)
EVENT_COLUMNS = "job_id, sequence, type, data, created_at, owner_id"


def generate(ds: DataSet) -> Iterator[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]:
    """Every job's row (in :data:`JOB_COLUMNS` order) and its events, oldest job first."""
    rng = random.Random(SEED)
    first_queued = ds.jobs - ds.queued
    first_running = first_queued - ds.running
    started = first_queued  # jobs with a running event: all but the queued ones
    base = ds.queued + 2 * ds.running + 3 * first_running
    logs_total = max(0, ds.events - base)
    for i in range(ds.jobs):
        kind, queue, actor, _, run_median, max_attempts = _pick(rng, KINDS, 3)
        payload, summary, resource = _shape(rng, kind)
        owner = str(min(OWNERS, int(OWNERS ** rng.random())))
        jid = job_id(i)
        created = created_ms(ds, i)
        wait = int(rng.expovariate(1 / 2000)) + 5
        run = int(run_median * 1000 * math.exp(rng.gauss(0, 0.8))) + 1
        status, attempt, worker, lease, progress, message, result, error, cancel_at = (
            "queued",
            0,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )
        started_at = completed_at = None
        if i >= first_queued:
            updated = created
        elif i >= first_running:
            status, attempt = "running", 1
            started_at = min(created + wait, ds.t0_ms - 2)
            worker, lease = f"web-{rng.randrange(1, 9)}:{rng.randrange(1000, 9999)}", ds.t0_ms + 60_000
            progress, message = round(rng.random(), 2), "working"
            updated = started_at
        else:
            status = _pick(rng, FINISHED, 1)[0]
            attempt = 1 if status != "failed" else rng.randrange(1, max_attempts + 1)
            started_at = created + wait
            completed_at = min(started_at + run, ds.t0_ms - 1)
            updated = completed_at
            if status == "succeeded":
                progress, message, result = 1.0, "done", json.dumps({"ok": True, "items": rng.randrange(1, 50)})
            elif status in ("failed", "interrupted"):
                error = _error(rng) if status == "failed" else "interrupted: the worker stopped before the job ended"
            else:
                cancel_at = completed_at
        n_logs = 0
        if started_at is not None and started:
            k = i - (first_queued - started)  # index among started jobs
            n_logs = (k + 1) * logs_total // started - k * logs_total // started
        row = (
            jid,
            owner,
            kind,
            actor,
            queue,
            resource[0] if resource else None,
            resource[1] if resource else None,
            None,
            hashlib.sha256(jid.encode()).hexdigest(),
            json.dumps(payload),
            "{}",
            0,
            status,
            attempt,
            max_attempts,
            3600,
            kind != "notify_email",
            worker,
            lease,
            created,
            progress,
            message,
            result,
            error,
            cancel_at,
            0,
            created,
            updated,
            started_at,
            completed_at,
            None,
            None,
            summary,
        )
        events = [(jid, 1, "status", '{"status": "queued"}', created)]
        if started_at is not None:
            events.append((jid, 2, "status", json.dumps({"status": "running", "attempt": attempt}), started_at))
            end = completed_at or started_at + 1
            for n in range(n_logs):
                at = started_at + (end - started_at) * (n + 1) // (n_logs + 1)
                events.append((jid, 3 + n, "log", json.dumps({"message": f"step {n + 1} of {n_logs}"}), at))
            if completed_at is not None:
                data: dict[str, Any] = {"status": status, "attempt": attempt}
                if error:
                    data["error"] = error
                events.append((jid, len(events) + 1, "status", json.dumps(data), completed_at))
        yield row[:25] + (len(events),) + row[26:], [(*event, owner) for event in events]


# -- SQLite ------------------------------------------------------------------------------------------
def load_sqlite(path: str, ds: DataSet, log: Any) -> None:
    """Bulk-load *ds* into the migrated SQLite file *path* (see the module docstring)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA cache_size = -400000")
        indexes = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name IN ('jobs', 'job_events') "
            "AND sql IS NOT NULL"
        ).fetchall()
        (trigger,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs_search_insert'").fetchone()
        conn.execute("BEGIN")
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        conn.execute("DROP TRIGGER jobs_search_insert")
        marks = ", ".join("?" * 33)
        jobs_sql = f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({marks})"
        events_sql = f"INSERT INTO job_events ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
        t = time.monotonic()
        batch_jobs: list[tuple[Any, ...]] = []
        batch_events: list[tuple[Any, ...]] = []
        for n, (row, events) in enumerate(generate(ds), 1):
            batch_jobs.append(row)
            batch_events.extend(events)
            if len(batch_jobs) >= 20_000:
                conn.executemany(jobs_sql, batch_jobs)
                conn.executemany(events_sql, batch_events)
                batch_jobs.clear()
                batch_events.clear()
                if n % 200_000 == 0:
                    log(f"sqlite: {n:,} jobs inserted ({time.monotonic() - t:.0f} s)")
        conn.executemany(jobs_sql, batch_jobs)
        conn.executemany(events_sql, batch_events)
        log(f"sqlite: rows in ({time.monotonic() - t:.0f} s); recreating {len(indexes)} indexes, FTS rebuild")
        for _, sql in indexes:
            conn.execute(sql)
        conn.execute("INSERT INTO jobs_search(jobs_search) VALUES ('rebuild')")
        conn.execute(trigger)
        write_meta_sqlite(conn, ds)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        log(f"sqlite: loaded in {time.monotonic() - t:.0f} s")
    finally:
        conn.close()


def write_meta_sqlite(conn: sqlite3.Connection, ds: DataSet) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS bench_queries_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT OR REPLACE INTO bench_queries_meta VALUES ('dataset', ?)", (json.dumps(ds.__dict__),))


def read_meta_sqlite(path: str) -> DataSet | None:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("SELECT value FROM bench_queries_meta WHERE key = 'dataset'").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return DataSet(**json.loads(row[0])) if row else None


# -- PostgreSQL --------------------------------------------------------------------------------------
def _copy_text(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    s = str(value)
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _copy(cur: Any, table: str, columns: str, rows: Iterator[tuple[Any, ...]]) -> None:
    with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        buf = io.StringIO()
        for n, row in enumerate(rows, 1):
            buf.write("\t".join(map(_copy_text, row)))
            buf.write("\n")
            if n % 20_000 == 0:
                copy.write(buf.getvalue())
                buf = io.StringIO()
        copy.write(buf.getvalue())


def load_postgres(dsn: str, ds: DataSet, log: Any) -> None:
    """Bulk-load *ds* into the migrated PostgreSQL database *dsn* (a libpq URL; see the module docstring)."""
    import psycopg  # noqa: PLC0415 - only the PostgreSQL half needs it

    with psycopg.connect(dsn, autocommit=False) as conn, conn.cursor() as cur:
        cur.execute("SET maintenance_work_mem = '512MB'")
        cur.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('jobs', 'job_events', 'job_search') "
            "AND indexname NOT IN ('pk_jobs', 'pk_job_events', 'pk_job_search')"
        )
        indexes = cur.fetchall()
        cur.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'job_events'::regclass AND contype = 'f'"
        )
        fks = cur.fetchall()
        for name, _ in indexes:
            cur.execute(f'DROP INDEX "{name}"')
        for name, _ in fks:
            cur.execute(f'ALTER TABLE job_events DROP CONSTRAINT "{name}"')
        t = time.monotonic()
        _copy(cur, "jobs", JOB_COLUMNS, (row for row, _ in generate(ds)))
        log(f"postgres: jobs copied ({time.monotonic() - t:.0f} s)")
        _copy(cur, "job_events", EVENT_COLUMNS, (e for _, events in generate(ds) for e in events))
        log(f"postgres: events copied ({time.monotonic() - t:.0f} s); recreating {len(indexes)} indexes")
        for _, sql in indexes:
            cur.execute(sql)
        for name, sql in fks:
            cur.execute(f'ALTER TABLE job_events ADD CONSTRAINT "{name}" {sql}')
        cur.execute("CREATE TABLE IF NOT EXISTS bench_queries_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        cur.execute(
            "INSERT INTO bench_queries_meta VALUES ('dataset', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (json.dumps(ds.__dict__),),
        )
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    log(f"postgres: loaded in {time.monotonic() - t:.0f} s")


def read_meta_postgres(dsn: str) -> DataSet | None:
    import psycopg  # noqa: PLC0415

    try:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT value FROM bench_queries_meta WHERE key = 'dataset'").fetchone()
    except psycopg.Error:
        return None
    return DataSet(**json.loads(row[0])) if row else None
