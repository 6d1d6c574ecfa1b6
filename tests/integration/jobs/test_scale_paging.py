"""Paging and counting at scale on SQLite and PostgreSQL (issue 14's acceptance): 100,000 jobs, of which
exactly 30,000 match a combined filter (three statuses, a kind, a queue, an owner, a created range).

Every one of the other 70,000 misses the filter on exactly one of those (a status, kind, queue or owner
next to the wanted one, a creation time just outside the range: the first millisecond after it
included, the range's end being exclusive), and four jobs share each millisecond, so a cursor that
loses the id tie-break or a predicate applied after the LIMIT shows up as a short page, a duplicate or
a miss. The pages are walked with :func:`jobs.queries.page_jobs`, and on PostgreSQL also through the
HTTP API of a real gunicorn on the same database; :func:`jobs.queries.count_jobs` and that API's bulk
retry dry run count them on both engines.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import accounts
from jobs.queries import JobFilter, count_jobs, page_jobs
from jobs.status import JobStatus
from tests.acceptance.operations.support import ROOT, Procs, processes, wait_for

from .rows import insert_jobs, job_row
from .support import JobEnv

pytestmark = pytest.mark.slow

TOTAL, MATCHING = 100_000, 30_000
#: Jobs sharing each creation millisecond (ties broken by id).
PER_MS = 4
STATUSES = (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED)
OTHER_STATUSES = (JobStatus.SUCCEEDED, JobStatus.QUEUED, JobStatus.RUNNING)
KIND, OTHER_KIND = "render_clip", "render_clip_preview"
QUEUE, OTHER_QUEUE = "media", "media-slow"
#: Where the created range starts; it ends (exclusive) after the last millisecond its jobs fill, four a millisecond.
START = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
MISSES = ("status", "kind", "queue", "owner", "range")


@dataclass(frozen=True)
class Population:
    rows: list[dict[str, Any]]
    #: The matching ids newest first, as every list orders them: (created_at, id) descending.
    expected: list[str]
    created_after: datetime
    created_before: datetime


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def _population(owner: str, other_owner: str) -> Population:
    rng = random.Random(14)
    per_miss = (TOTAL - MATCHING) // len(MISSES)
    labels = ["match"] * MATCHING + [m for m in MISSES for _ in range(per_miss)]
    assert len(labels) == TOTAL
    rng.shuffle(labels)
    range_ms = -(-(TOTAL - labels.count("range")) // PER_MS)
    start = _ms(START)
    end = start + range_ms  # exclusive
    slots = {"in": 0, "before": 0, "after": 0}
    rows, matching = [], []
    for i, label in enumerate(labels):
        # half the range's misses just before it, half from its (exclusive) end on
        where = "in" if label != "range" else ("before", "after")[i % 2]
        n = slots[where]
        slots[where] += 1
        created_at = {"in": start + n // PER_MS, "before": start - 1 - n // PER_MS, "after": end + n // PER_MS}[where]
        row = job_row(
            f"{rng.getrandbits(128):032x}",
            rng.choice(OTHER_STATUSES if label == "status" else STATUSES),
            created_at=created_at,
            owner_id=other_owner if label == "owner" else owner,
            kind=OTHER_KIND if label == "kind" else KIND,
            queue=OTHER_QUEUE if label == "queue" else QUEUE,
            summary=f"clip {i}",
        )
        rows.append(row)
        if label == "match":
            matching.append((created_at, row["id"]))
    expected = [job_id for _, job_id in sorted(matching, reverse=True)]
    return Population(rows, expected, START, START + timedelta(milliseconds=range_ms))


@dataclass
class People:
    alice: str
    bob: str
    tokens: dict[str, str]


def _people(env: JobEnv) -> People:
    tokens, owners = {}, {}
    for name, role in (("alice", "user"), ("bob", "user"), ("root", "admin")):
        user, _ = accounts.create_user(env.engine, name, role=role)
        owners[name] = user.owner_id
        tokens[name] = accounts.create_token(env.engine, user.id, "scale")[1]
    return People(owners["alice"], owners["bob"], tokens)


def _walk(fetch: Any, limit: int) -> list[str]:
    """Every page from the first to the last; each but the last is full, the last is not empty."""
    seen: list[str] = []
    cursor = None
    while True:
        items, cursor = fetch(cursor, limit)
        assert items, f"an empty page after {len(seen)} jobs"
        seen.extend(items)
        if cursor is None:
            return seen
        assert len(items) == limit, f"a short page ({len(items)} of {limit}) after {len(seen) - len(items)} jobs"


@pytest.fixture()
def web(env: JobEnv, tmp_path: Path) -> Iterator[httpx.Client]:
    """A real gunicorn (one worker) serving the web app on *env*'s database."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = {
        **os.environ,
        "TENURE_DATABASE_URL": env.url,
        "TENURE_BROKER_URL": env.broker_url,
        "TENURE_OUTPUT_ROOT": str(tmp_path / "outputs"),
        "TENURE_SECRET_KEY": "scale-secret",
        "TENURE_WEB_TASKS_APP": "",
        "PORT": str(port),
        "TENURE_WEB_WORKERS": "1",
        "TENURE_WEB_THREADS": "4",
    }
    environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    with processes(tmp_path) as procs, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        procs.start("web", [gunicorn, "-c", str(ROOT / "gunicorn.conf.py"), "webapp:create_app()"], environ)
        wait_for("gunicorn to answer", lambda: _answers(http, procs), 60, procs, poll_s=0.1)
        yield http


def _answers(http: httpx.Client, procs: Procs) -> bool:
    assert procs.started[0].popen.poll() is None, procs.logs()
    try:
        return http.get("/api/health/live").is_success
    except httpx.TransportError:
        return False


def test_every_page_is_full_and_the_pages_are_exactly_the_matches(env: JobEnv, web: httpx.Client) -> None:
    # Given 100,000 jobs, 30,000 of them matching the filter
    people = _people(env)
    population = _population(people.alice, people.bob)
    with env.engine.begin() as conn:
        insert_jobs(conn, population.rows)
    where = JobFilter(
        statuses=tuple(map(str, STATUSES)),
        kind=KIND,
        queue=QUEUE,
        owner_id=people.alice,
        created_after=population.created_after,
        created_before=population.created_before,
    )
    api_filter = {
        "status": [str(s) for s in STATUSES],
        "kind": KIND,
        "queue": QUEUE,
        "created_after": population.created_after.isoformat(),
        "created_before": population.created_before.isoformat(),
    }
    alice, root = ({"Authorization": f"Bearer {people.tokens[name]}"} for name in ("alice", "root"))

    # When an admin pages through them with the job layer's cursor (500 a page: the last page is full too),
    # and on PostgreSQL the owner meanwhile through the HTTP API (199 a page: the last page is short).
    # The web layer lists with the same page_jobs on both engines; its 151 requests (~20 s on a loaded
    # machine) run once, beside the direct walk (gunicorn's process works while this one does).
    def layer_page(cursor: str | None, limit: int) -> tuple[list[str], str | None]:
        page = page_jobs(env.engine, where, owner_id="", is_admin=True, cursor=cursor, limit=limit)
        return [r.id for r in page.items], page.next_cursor

    def api_page(cursor: str | None, limit: int) -> tuple[list[str], str | None]:
        r = web.get("/api/v1/jobs", params={**api_filter, "limit": limit, "cursor": cursor or []}, headers=alice)
        assert r.status_code == 200, r.text[:300]
        return [j["id"] for j in r.json()["items"]], r.json()["next_cursor"]

    with ThreadPoolExecutor(1) as pool:
        api_walk = pool.submit(_walk, api_page, 199) if env.backend == "postgres" else None
        # Then the pages are exactly the matches, newest first, and the count says so
        assert _walk(layer_page, 500) == population.expected
        assert count_jobs(env.engine, where, owner_id="", is_admin=True) == MATCHING
        assert count_jobs(env.engine, replace(where, owner_id=None), owner_id=people.alice) == MATCHING  # her view
        assert count_jobs(env.engine, JobFilter(), owner_id="", is_admin=True) == TOTAL
        assert api_walk is None or api_walk.result() == population.expected

    # And the API's bulk retry dry run counts all 30,000, for the owner and for an admin naming her, and
    # would act on the newest of them
    for headers, scope in ((alice, {}), (root, {"owner": "alice"})):  # the API names owners by user name
        body = {"filter": {**api_filter, **scope}, "dry_run": True}
        r = web.post("/api/v1/jobs/bulk/retry", json=body, headers=headers)
        assert r.status_code == 200, r.text[:300]
        assert (r.json()["matched"], r.json()["affected"]) == (MATCHING, 500), r.json()
        assert r.json()["job_ids"] == population.expected[:500]
