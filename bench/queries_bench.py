"""Read-side benchmark: job lists, searches, counts and the activity chart at 1M jobs / 5M events, over HTTP.

Run from the repository root::

    .venv/bin/python -m bench.queries_bench --jobs 1000000 --events 5000000      # both engines
    .venv/bin/python -m bench.queries_bench --backends sqlite --reps 100         # one engine, fewer samples
    .venv/bin/python -m bench.queries_bench --explain                            # + each query's plan

Per engine (SQLite file, PostgreSQL database): the data set of :mod:`bench.queries_data` (generated and
bulk-loaded once, then cached: ``var/bench-queries/*.db`` and the PostgreSQL database
``tenure_bench_queries_<version>_<jobs>_<events>``; ``--rebuild`` regenerates it), upgraded to the head revision
(``jobs.schema.upgrade``, what ``tenure db upgrade`` does to a deployment: a new revision's indexes are built
on the cached rows). An admin and a user, each with a fresh API token; then gunicorn exactly as the Procfile's
``web`` process (2 workers × 32 threads), PostgreSQL with Redis as its broker (nothing is enqueued).

Each query (:data:`QUERIES`: every list filter, deep cursor pages, text searches, bulk dry-run counts, the
activity chart) is sent by one client (keep-alive ``httpx``, ``Authorization: Bearer``), one request at a
time, after 3 warm-up requests; ``--reps`` samples (or as many as fit in ``--budget-s`` seconds, at least
``--min-reps``), cycling over the query's variants (other id prefixes, other cursor depths, …). A sample is
send → full response read; a non-200 answer fails the run. Printed per query and engine: p50, p99, max, the
rows it returned or counted, and PASS/MISS against the goal (p99 ≤ 50 ms for lists and searches, ≤ 250 ms for
exact counts and charts). Results go to ``bench/results/queries/<timestamp>.json``.

``--explain`` also makes every query's job-layer calls once in-process (``jobs.queries``, as the API makes
them), captures the SQL they execute and prints its plan (``EXPLAIN QUERY PLAN`` / ``EXPLAIN (ANALYZE,
BUFFERS)``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from . import queries_data as data
from . import report
from .api_bench import Gunicorn, free_port, wait_live
from .broker_bench import _git, _pct, loadavg, log
from .procs import REPO

PG_ADMIN_URL = os.environ.get("TENURE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TENURE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
CACHE_DIR = REPO / "var" / "bench-queries"
ADMIN, USER = "bench-admin", "bench-user"
GOAL_LIST_MS, GOAL_COUNT_MS = 50.0, 250.0
#: A cached data set older than this is regenerated: the activity chart looks back from now.
MAX_AGE_H = 20.0
#: Owner ids of the data set (:mod:`bench.queries_data`) that the admin's lists filter by: one big, two middling,
#: one small (a few hundred jobs).
FILTERED_OWNERS = ("3", "17", "60", "250")


# -- the cached databases ----------------------------------------------------------------------------
def _owner_user(owner_id: str) -> str:
    """The user name of one of :data:`FILTERED_OWNERS` (the API's ``owner`` filter takes user names)."""
    return f"bench-owner-{owner_id}"


def _users(url: str) -> None:
    """The admin and the user, and users for :data:`FILTERED_OWNERS` (disabled, with no password: only names
    for their owner ids), unless the cached database has them."""
    from sqlalchemy import text  # noqa: PLC0415

    import accounts  # noqa: PLC0415
    from jobs.db import make_engine  # noqa: PLC0415

    engine = make_engine(url)
    try:
        for name, role in ((ADMIN, "admin"), (USER, "user")):
            if accounts.get_user_by_name(engine, name) is None:
                accounts.create_user(engine, name, secrets.token_urlsafe(18), role=role)
        with engine.begin() as conn:
            for owner_id in FILTERED_OWNERS:
                conn.execute(
                    text(
                        "INSERT INTO users (id, username, password_hash, role, disabled, created_at) "
                        "SELECT :id, :name, '!', 'user', :disabled, :now "
                        "WHERE NOT EXISTS (SELECT 1 FROM users WHERE id = :id)"
                    ),
                    {
                        "id": int(owner_id),
                        "name": _owner_user(owner_id),
                        "disabled": True,
                        "now": int(time.time() * 1000),
                    },
                )
            if conn.dialect.name == "postgresql":  # explicit ids: the sequence must not hand them out again
                conn.execute(text("SELECT setval(pg_get_serial_sequence('users', 'id'), (SELECT max(id) FROM users))"))
    finally:
        engine.dispose()


def _fresh(found: data.DataSet | None, jobs: int, events: int) -> bool:
    return (
        found is not None
        and (found.jobs, found.events) == (jobs, events)
        and time.time() * 1000 - found.t0_ms < MAX_AGE_H * 3600_000
    )


def sqlite_database(jobs: int, events: int, rebuild: bool) -> tuple[str, data.DataSet]:
    from jobs import schema  # noqa: PLC0415

    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    ds = data.DataSet(jobs, events, int(time.time() * 1000))
    path = CACHE_DIR / f"{ds.key}.db"
    found = None if rebuild else data.read_meta_sqlite(str(path))
    if not _fresh(found, jobs, events):
        log(f"sqlite: generating {jobs:,} jobs / {events:,} events into {path}")
        building = path.with_suffix(".building")
        for p in (building, Path(f"{building}-wal"), Path(f"{building}-shm")):
            p.unlink(missing_ok=True)
        schema.upgrade(f"sqlite:///{building}")
        _users(f"sqlite:///{building}")
        data.load_sqlite(str(building), ds, log)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        building.rename(path)
        found = ds
    url = f"sqlite:///{path}"
    log(
        f"sqlite: {path} generated {datetime.fromtimestamp(found.t0_ms / 1000, UTC):%Y-%m-%d %H:%M} UTC; "
        f"revision {schema.upgrade(url)}"
    )
    _users(url)
    return url, found


def postgres_database(jobs: int, events: int, rebuild: bool) -> tuple[str, data.DataSet]:
    from sqlalchemy import create_engine, text  # noqa: PLC0415

    from jobs import schema  # noqa: PLC0415

    ds = data.DataSet(jobs, events, int(time.time() * 1000))
    name = f"tenure_bench_queries_{ds.key}"
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
        found = data.read_meta_postgres(libpq) if exists and not rebuild else None
        if not _fresh(found, jobs, events):
            log(f"postgres: generating {jobs:,} jobs / {events:,} events into database {name}")
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            schema.upgrade(url)
            _users(url)
            data.load_postgres(libpq, ds, log)
            found = ds
    finally:
        admin.dispose()
    log(
        f"postgres: {name} generated {datetime.fromtimestamp(found.t0_ms / 1000, UTC):%Y-%m-%d %H:%M} UTC; "
        f"revision {schema.upgrade(url)}"
    )
    _users(url)
    return url, found


def tokens(url: str) -> dict[str, str]:
    """A fresh API token for the admin and for the user."""
    import accounts  # noqa: PLC0415
    from jobs.db import make_engine  # noqa: PLC0415

    engine = make_engine(url)
    try:
        out = {}
        for name in (ADMIN, USER):
            user = accounts.get_user_by_name(engine, name)
            assert user is not None
            out[name] = accounts.create_token(engine, user.id, f"queries-bench-{int(time.time())}")[1]
            out[name + ":id"] = user.owner_id
        return out
    finally:
        engine.dispose()


# -- the queries -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    name: str
    #: "list" (goal p99 ≤ 50 ms) or "count" (≤ 250 ms: exact counts, the chart)
    goal: str
    #: who asks: the admin or the user
    who: str
    #: variant k → (method, path, query params or JSON body)
    request: Callable[[int], tuple[str, str, Any]]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _cursor_at(url: str, where: str, depth: int) -> str:
    """The cursor the API hands out after the first *depth* jobs matching *where*, newest first:
    ``created_at.id`` of the job at that position (what :func:`jobs.queries.encode_page_cursor` writes)."""
    from sqlalchemy import text  # noqa: PLC0415

    from jobs.db import make_engine  # noqa: PLC0415

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    f"SELECT created_at, id FROM jobs WHERE {where} ORDER BY created_at DESC, id DESC LIMIT 1 OFFSET :k"
                ),
                {"k": depth - 1},
            ).one()
    finally:
        engine.dispose()
    return f"{row[0]}.{row[1]}"


def queries(url: str, ds: data.DataSet) -> list[Query]:
    """Every read the API offers that issue #14 names, with a few variants each."""
    t0 = ds.t0_ms
    day = data.DAY_MS

    def get(
        params: dict[str, Any] | Callable[[int], dict[str, Any]], path: str = "/api/v1/jobs"
    ) -> Callable[[int], tuple[str, str, Any]]:
        return lambda k: ("GET", path, params(k) if callable(params) else params)

    def bulk(flt: dict[str, Any]) -> Callable[[int], tuple[str, str, Any]]:
        return lambda k: ("POST", "/api/v1/jobs/bulk/retry", {"filter": flt, "dry_run": True})

    prefixes = [data.job_id(ds.jobs * (k + 1) // 11)[: 4 + k % 5] for k in range(10)]
    short_prefixes = [f"{k:02x}" for k in range(16, 256, 23)]
    deep_all = [_cursor_at(url, "1 = 1", int(ds.jobs * f)) for f in (0.01, 0.1, 0.5, 0.9)]
    deep_failed = [_cursor_at(url, "status = 'failed'", int(ds.jobs * f)) for f in (0.001, 0.02, 0.06)]
    week = [(t0 - (k + 2) * 7 * day, t0 - (k + 1) * 7 * day) for k in range(4)]
    owners = [_owner_user(o) for o in FILTERED_OWNERS]
    return [
        Query("list: all jobs (admin)", "list", "admin", get({"limit": 50})),
        Query("list: status=failed", "list", "admin", get({"status": "failed"})),
        Query("list: status=queued (backlog)", "list", "admin", get({"status": "queued"})),
        Query("list: status=running", "list", "admin", get({"status": "running"})),
        Query(
            "list: status=failed,interrupted,cancelled",
            "list",
            "admin",
            get({"status": ["failed", "interrupted", "cancelled"]}),
        ),
        Query("list: status=queued,running", "list", "admin", get({"status": ["queued", "running"]})),
        Query("list: kind=transcribe", "list", "admin", get({"kind": "transcribe"})),
        Query("list: kind=notify_email", "list", "admin", get({"kind": "notify_email"})),
        Query("list: queue=render", "list", "admin", get({"queue": "render"})),
        Query("list: owner=<one of 4> (admin)", "list", "admin", get(lambda k: {"owner": owners[k % 4]})),
        Query("list: own jobs (user)", "list", "user", get({})),
        Query("list: own failed jobs (user)", "list", "user", get({"status": "failed"})),
        Query(
            "list: created in one week",
            "list",
            "admin",
            get(lambda k: {"created_after": _iso(week[k % 4][0]), "created_before": _iso(week[k % 4][1])}),
        ),
        Query(
            "list: failed render_clip on render, last 30 d",
            "list",
            "admin",
            get({"status": "failed", "kind": "render_clip", "queue": "render", "created_after": _iso(t0 - 30 * day)}),
        ),
        Query(
            "list: interrupted notify_email of owner 2",
            "list",
            "admin",
            get({"status": "interrupted", "kind": "notify_email", "owner": USER}),
        ),
        Query(
            "list: user's failed transcribe in one week",
            "list",
            "user",
            get(
                lambda k: {
                    "status": "failed",
                    "kind": "transcribe",
                    "created_after": _iso(week[k % 4][0]),
                    "created_before": _iso(week[k % 4][1]),
                }
            ),
        ),
        Query("page: all jobs, 1 %-90 % deep", "list", "admin", get(lambda k: {"cursor": deep_all[k % 4]})),
        Query(
            "page: status=failed, 0.1 %-6 % of N deep",
            "list",
            "admin",
            get(lambda k: {"status": "failed", "cursor": deep_failed[k % 3]}),
        ),
        Query("search: id prefix (4-8 hex)", "list", "admin", get(lambda k: {"q": prefixes[k % 10]})),
        Query("search: id prefix (2 hex)", "list", "admin", get(lambda k: {"q": short_prefixes[k % 10]})),
        Query("search: kind 'transcribe'", "list", "admin", get({"q": "transcribe"})),
        Query("search: error 'ffmpeg'", "list", "admin", get({"q": "ffmpeg"})),
        Query("search: error 'Connection refused'", "list", "admin", get({"q": "Connection refused"})),
        Query("search: summary 'ops-alerts'", "list", "admin", get({"q": "ops-alerts"})),
        Query("search: summary 'room-<n>'", "list", "admin", get(lambda k: {"q": f"room-{(k * 397) % 4999 + 1}/"})),
        Query("search: no match", "list", "admin", get({"q": "no-such-thing"})),
        Query("search: 'ffmpeg' + status=failed (user)", "list", "user", get({"q": "ffmpeg", "status": "failed"})),
        Query(
            "search: 'ffmpeg' + failed,cancelled,interrupted",
            "list",
            "admin",
            get({"q": "ffmpeg", "status": ["failed", "cancelled", "interrupted"]}),
        ),
        Query("search: 2 CJK chars (no match)", "list", "admin", get({"q": "東京"})),
        Query("search: 1 char '→' (notify summaries)", "list", "admin", get({"q": "→"})),
        Query("search: 2 chars '0–' + status=failed (user)", "list", "user", get({"q": "0–", "status": "failed"})),
        Query(
            "count: bulk retry dry run, failed render_clip",
            "count",
            "admin",
            bulk({"status": ["failed"], "kind": "render_clip"}),
        ),
        Query("count: bulk retry dry run, every job", "count", "admin", bulk({})),
        Query("count: bulk retry dry run, 'ffmpeg'", "count", "admin", bulk({"q": "ffmpeg"})),
        Query("count: bulk retry dry run, user's failed", "count", "user", bulk({"status": ["failed"]})),
        Query(
            "chart: activity, last 60 min",
            "count",
            "admin",
            get({"minutes": _chart_minutes(ds, 60)}, "/api/v1/activity"),
        ),
        Query(
            "chart: activity, last 24 h",
            "count",
            "admin",
            get({"minutes": _chart_minutes(ds, 24 * 60)}, "/api/v1/activity"),
        ),
    ]


def _chart_minutes(ds: data.DataSet, minutes: int) -> int:
    """*minutes* back from the data set's generation time (the chart's window ends now: a cached data set
    has no jobs after it was generated), within the API's 24 h limit."""
    since_t0 = int((time.time() * 1000 - ds.t0_ms) // 60_000) + 1
    return min(24 * 60, minutes + since_t0)


def _rows(answer: Any) -> int:
    if isinstance(answer, list):  # the activity chart: finished jobs it counted
        return sum(b["succeeded"] + b["failed"] + b["cancelled"] for b in answer)
    if "matched" in answer:
        return int(answer["matched"])
    return len(answer["items"])


def measure(client: httpx.Client, q: Query, reps: int, min_reps: int, budget_s: float) -> dict[str, Any]:
    def once(k: int) -> tuple[float, Any]:
        method, path, args = q.request(k)
        t = time.perf_counter()
        r = client.get(path, params=args) if method == "GET" else client.post(path, json=args)
        elapsed = time.perf_counter() - t
        if r.status_code != 200:
            raise RuntimeError(f"{q.name}: {method} {path} {args!r} → {r.status_code} {r.text[:300]}")
        return elapsed, r.json()

    for k in range(3):
        once(k)
    samples: list[float] = []
    rows: list[int] = []
    start = time.monotonic()
    for k in range(reps):
        elapsed, answer = once(k)
        samples.append(elapsed)
        rows.append(_rows(answer))
        if k + 1 >= min_reps and time.monotonic() - start > budget_s:
            break
    v = sorted(samples)
    p99 = 1000 * _pct(v, 99)
    goal = GOAL_LIST_MS if q.goal == "list" else GOAL_COUNT_MS
    return {
        "name": q.name,
        "goal_ms": goal,
        "n": len(v),
        "p50_ms": 1000 * _pct(v, 50),
        "p99_ms": p99,
        "max_ms": 1000 * v[-1],
        "rows_min": min(rows),
        "rows_max": max(rows),
        "verdict": "PASS" if p99 <= goal else "MISS",
    }


# -- the server --------------------------------------------------------------------------------------
def server_env(url: str, workdir: Path) -> dict[str, str]:
    multiproc = workdir / "prometheus"
    multiproc.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "TENURE_DATABASE_URL": url,
        "TENURE_BROKER_URL": "" if url.startswith("sqlite") else REDIS_URL,
        "TENURE_OUTPUT_ROOT": str(workdir / "outputs"),
        "TENURE_SECRET_KEY": secrets.token_hex(32),
    }
    env.pop("TENURE_WEB_BIND", None)
    return env


@contextmanager
def gunicorn(url: str, workdir: Path) -> Iterator[str]:
    port = free_port()
    env = {**server_env(url, workdir), "PORT": str(port)}
    base_url = f"http://127.0.0.1:{port}"
    server = Gunicorn(env, workdir)
    try:
        wait_live(base_url, server, timeout_s=120)
        log(f"gunicorn {server.proc.pid} on {base_url}, workers {server.workers()}")
        yield base_url
        server.check()
    finally:
        server.stop()


# -- plans -------------------------------------------------------------------------------------------
#: The statuses a bulk retry applies to (``webapp.bulk.ACTION_STATUSES``): its dry run lists those candidates.
RETRYABLE = ("cancelled", "failed", "interrupted")


def _filter(args: dict[str, Any], user_id: str) -> Any:
    """The job layer's filter of the API's *args* (whose ``owner`` is a user name; *user_id*: the user's id)."""
    from jobs.queries import JobFilter  # noqa: PLC0415

    owner_ids = {USER: user_id, **{_owner_user(o): o for o in FILTERED_OWNERS}}

    status = args.get("status") or ()
    return JobFilter(
        statuses=(status,) if isinstance(status, str) else tuple(status),
        kind=args.get("kind"),
        queue=args.get("queue"),
        owner_id=owner_ids[args["owner"]] if "owner" in args else None,
        created_after=datetime.fromisoformat(args["created_after"]) if "created_after" in args else None,
        created_before=datetime.fromisoformat(args["created_before"]) if "created_before" in args else None,
        search=tuple(args.get("q", "").split()),  # the search box's words, as webapp.job_search parses them
    )


def _replay(engine: Any, q: Query, user_id: str) -> None:
    """The job-layer calls the API makes for *q*'s first variant (webapp/api/jobs.py, webapp/bulk.py,
    webapp/api/ops.py): the benchmark may not import the web layer, so they are repeated here."""
    from jobs import queries as jq  # noqa: PLC0415

    method, path, args = q.request(0)
    scope: dict[str, Any] = {"owner_id": "", "is_admin": True} if q.who == "admin" else {"owner_id": user_id}
    if path == "/api/v1/activity":
        since = datetime.now(UTC) - timedelta(minutes=args["minutes"])
        jq.activity(engine, since=since, bucket_s=60, owner_id=None, is_admin=True)
    elif method == "POST":  # a bulk retry's dry run: its candidates, then the exact count
        f = _filter(args["filter"], user_id)
        statuses = tuple(s for s in RETRYABLE if not f.statuses or s in f.statuses)
        jq.page_jobs(engine, replace(f, statuses=statuses), limit=500, **scope)
        jq.count_jobs(engine, f, **scope)
    else:
        jq.page_jobs(engine, _filter(args, user_id), cursor=args.get("cursor"), limit=args.get("limit", 50), **scope)


def explain_all(url: str, qs: list[Query], user_id: str) -> dict[str, list[str]]:
    """The plan of every statement on ``jobs`` each query's job-layer calls execute (first variant)."""
    from sqlalchemy import event  # noqa: PLC0415

    from jobs.db import make_engine  # noqa: PLC0415

    captured: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and " jobs" in statement:
            captured.append((statement, parameters))

    engine = make_engine(url)
    event.listen(engine, "before_cursor_execute", capture)
    try:
        plans: dict[str, list[str]] = {}
        for q in qs:
            captured.clear()
            _replay(engine, q, user_id)
            plans[q.name] = [_plan(url, s, p) for s, p in captured]
        return plans
    finally:
        event.remove(engine, "before_cursor_execute", capture)
        engine.dispose()


def _plan(url: str, statement: str, parameters: Any) -> str:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///") :])
        try:
            rows = conn.execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
        finally:
            conn.close()
        return statement + "\n" + "\n".join(f"  {'  ' * 0}{r[3]}" for r in rows)
    import psycopg  # noqa: PLC0415

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters).fetchall()
    return statement + "\n" + "\n".join("  " + r[0] for r in rows)


# -- main --------------------------------------------------------------------------------------------
def run_backend(backend: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    build = sqlite_database if backend == "sqlite" else postgres_database
    url, ds = build(args.jobs, args.events, args.rebuild)
    if args.prepare:
        return {"dataset": ds.__dict__, "results": []}
    secrets_ = tokens(url)
    qs = [q for q in queries(url, ds) if not args.only or args.only in q.name]
    out: dict[str, Any] = {"dataset": ds.__dict__, "load_before": loadavg(), "results": []}
    with gunicorn(url, workdir / backend) as base_url:
        clients = {
            who: httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {secrets_[name]}"}, timeout=60)
            for who, name in (("admin", ADMIN), ("user", USER))
        }
        try:
            for q in qs:
                res = measure(clients[q.who], q, args.reps, args.min_reps, args.budget_s)
                out["results"].append(res)
                log(
                    f"{backend}: {q.name}: p50 {res['p50_ms']:.1f} p99 {res['p99_ms']:.1f} ms "
                    f"(n={res['n']}, rows {res['rows_min']}–{res['rows_max']}) {res['verdict']}"
                )
        finally:
            for c in clients.values():
                c.close()
    out["load_after"] = loadavg()
    if args.explain:
        out["plans"] = explain_all(url, qs, secrets_[USER + ":id"])
        for name, plans in out["plans"].items():
            print(f"\n== {backend}: {name}")
            for p in plans:
                print(p)
    return out


def render(doc: dict[str, Any], markdown: bool = False) -> str:
    backends = list(doc["backends"])
    by_name: dict[str, dict[str, dict[str, Any]]] = {}
    for b in backends:
        for r in doc["backends"][b]["results"]:
            by_name.setdefault(r["name"], {})[b] = r
    header = ["query", "goal p99"]
    for b in backends:
        header += [f"{b} p50", f"{b} p99", f"{b} rows"]
    header.append("verdict")
    rows = [header]
    for name, per in by_name.items():
        goal = next(iter(per.values()))["goal_ms"]
        row = [name, f"{goal:.0f} ms"]
        for b in backends:
            r = per.get(b)
            rows_cell = (
                "—"
                if r is None
                else (
                    f"{r['rows_min']:,}" if r["rows_min"] == r["rows_max"] else f"{r['rows_min']:,}–{r['rows_max']:,}"
                )
            )
            row += ["—", "—", "—"] if r is None else [f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", rows_cell]
        misses = [b for b, r in per.items() if r["verdict"] == "MISS"]
        row.append("PASS" if not misses else "MISS " + "+".join(misses))
        rows.append(row)
    return report._table(rows, markdown)  # noqa: SLF001 - the broker benchmark's table formatter


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.queries_bench", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=1_000_000, help="jobs in the data set (default 1,000,000)")
    p.add_argument("--events", type=int, default=5_000_000, help="events in the data set (default 5,000,000)")
    p.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    p.add_argument("--reps", type=int, default=200, help="samples per query (default 200)")
    p.add_argument("--min-reps", type=int, default=30, help="samples per query at least, whatever the budget")
    p.add_argument("--budget-s", type=float, default=8.0, help="stop sampling a query after this (default 8 s)")
    p.add_argument("--only", default="", help="only the queries whose name contains this")
    p.add_argument("--rebuild", action="store_true", help="regenerate the cached data sets")
    p.add_argument("--prepare", action="store_true", help="only generate (or find) the cached data sets")
    p.add_argument("--explain", action="store_true", help="print the plan of every query's SQL")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/queries/<timestamp>.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so gunicorn is stopped by the ``finally`` that started it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = datetime.now(UTC)
    doc: dict[str, Any] = {
        "command": " ".join([".venv/bin/python -m bench.queries_bench", *(argv if argv is not None else sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "config": {k: getattr(args, k) for k in ("jobs", "events", "reps", "min_reps", "budget_s", "only")},
        "machine": {
            "cores": os.cpu_count(),
            "sqlite": sqlite3.sqlite_version,
            "git_head": _git("rev-parse", "HEAD"),
            "git_dirty": _git("status", "--porcelain", "jobs", "webapp", "migrations"),
        },
        "backends": {},
    }
    workdir = Path(tempfile.mkdtemp(prefix="tenure-queries-bench-"))
    try:
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            (workdir / backend).mkdir()
            doc["backends"][backend] = run_backend(backend, args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.prepare:
        return 0
    doc["seconds"] = (datetime.now(UTC) - started).total_seconds()
    print()
    print(render(doc, args.markdown))
    loads = {b: (d["load_before"], d["load_after"]) for b, d in doc["backends"].items()}
    print(f"\nload average before/after per engine: {loads}; took {doc['seconds']:.0f} s")
    if not args.no_save:
        out = REPO / "bench" / "results" / "queries" / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))
        print(f"results: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
