"""The live feed's change cursor under concurrent commits, served by two real web processes.

Eight writer threads move jobs through the real job layer (``jobs.submit`` and the transitions of
:mod:`jobs.transitions` in :func:`jobs.db.write` transactions: claim, complete, fail, requeue for
retry, request cancel, cancel running/queued). Some transactions stay open a few milliseconds after
their writes, so transactions that started later commit first (late committers); a sweeper-shaped
transaction (like recovery's batches) moves two jobs, the second one picked while it was open.

Two gunicorn servers on two ports (one worker process each) serve the app on the same database. An
admin's SSE client reads ``/api/v1/live.sse`` from the first, drops the connection while the writers
are busy, resumes on the second with ``Last-Event-ID`` and reads until the feed has passed every
event. ``job_events`` is the record of what happened: the client must have seen each row exactly
once, each job's rows in their order (``sequence``), and no resync.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import accounts
from jobs import db, store, transitions
from jobs.transitions import Attempt
from tests.acceptance.operations.support import Procs, processes, wait_for
from tests.acceptance.operations.web import free_port, live
from tests.integration.jobs.support import JobEnv, job_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

WRITERS = 8
#: Operations per writer thread (each one transaction, some held open).
OPS_PER_WRITER = 150
#: How long a held transaction stays open after its writes (seconds, drawn uniformly).
HOLD_S = (0.005, 0.04)
KIND = "live_feed_echo"
WORKER = "livefeed-host:1:test"
LEASE_MS = 60_000


# -- the writers -------------------------------------------------------------------------------------
@dataclass
class Pools:
    """Jobs handed between writer threads: each job is in one writer's hands at a time."""

    queued: list[str] = field(default_factory=list)
    running: list[Attempt] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Held PostgreSQL transactions that saw a younger transaction's events committed before their own commit.
    late_commits: int = 0
    ops: int = 0

    def take_queued(self, newest: bool = False) -> str | None:
        with self.lock:
            if not self.queued:
                return None
            return self.queued.pop() if newest else self.queued.pop(0)

    def take_running(self) -> Attempt | None:
        with self.lock:
            return self.running.pop(random.randrange(len(self.running))) if self.running else None

    def put(self, queued: str | None = None, running: Attempt | None = None) -> None:
        with self.lock:
            if queued is not None:
                self.queued.append(queued)
            if running is not None:
                self.running.append(running)


class Writer:
    """One writer thread's operations; every state move is a transition inside a ``db.write`` transaction.
    Its jobs belong to one of *owners*, drawn at random."""

    def __init__(self, env: JobEnv, pools: Pools, seed: int, owners: tuple[str, ...]) -> None:
        self.env, self.pools, self.rng, self.owners = env, pools, random.Random(seed), owners

    def run(self) -> None:
        for _ in range(OPS_PER_WRITER):
            op = self.rng.choices((self.submit, self.claim, self.finish, self.sweep), weights=(4, 3, 3, 1))[0]
            op()
            with self.pools.lock:
                self.pools.ops += 1

    def submit(self) -> None:
        job = self.env.submit(KIND, owner_id=self.rng.choice(self.owners), payload={"n": self.rng.randrange(1000)})
        self.pools.put(queued=job.id)

    def claim(self) -> None:
        job_id = self.pools.take_queued()
        if job_id is None:
            return self.submit()
        with self._tx() as tx:
            row = transitions.claim(tx, job_id, worker=WORKER, lease_ms=LEASE_MS, now=store.now_ms())
        if row is not None:
            self.pools.put(running=Attempt.of(row))

    def finish(self) -> None:
        attempt = self.pools.take_running()
        if attempt is None:
            return self.claim()
        outcome = self.rng.choice(("complete", "fail", "retry"))
        requeued = False
        with self._tx() as tx:
            now = store.now_ms()
            if outcome == "complete":
                # A cancel request committed first: the execution honours it instead.
                if not transitions.complete(tx, attempt, json.dumps({"ok": True}), now=now):
                    assert transitions.cancel_running(tx, attempt, now=now)
            elif outcome == "retry" and transitions.requeue_for_retry(tx, attempt, "flaky", delay_s=0, now=now):
                requeued = True
            else:
                assert transitions.fail(tx, attempt, "boom", now=now)
        if requeued:
            self.pools.put(queued=attempt.job_id)

    def sweep(self) -> None:
        """One transaction over two jobs, like recovery's batches: a cancel request for a running job,
        then — after a pause in which other writers commit — a cancel of the newest queued job."""
        attempt = self.pools.take_running()
        if attempt is None:
            return self.submit()
        with self._tx(hold=False) as tx:
            job = store.job_get(tx.conn, attempt.job_id)
            assert job is not None  # a second request for one job changes nothing (the first one wins)
            transitions.request_cancel(tx, job, now=store.now_ms(), by="sweeper")
            own_xid = self._xid(tx)
            time.sleep(self.rng.uniform(*HOLD_S))
            newest = self.pools.take_queued(newest=True)
            queued = store.job_get(tx.conn, newest) if newest is not None else None
            if queued is not None:
                assert transitions.cancel_queued(tx, queued, now=store.now_ms(), by="sweeper")
            self._count_late(tx, own_xid)
        self.pools.put(running=attempt)

    @contextmanager
    def _tx(self, hold: bool | None = None) -> Iterator[db.Tx]:
        """A write transaction; when *hold* (by default one in three) it stays open after its writes."""
        held = self.rng.random() < 1 / 3 if hold is None else hold
        with db.write(self.env.engine) as tx:
            yield tx
            if held:
                own_xid = self._xid(tx)
                time.sleep(self.rng.uniform(*HOLD_S))
                self._count_late(tx, own_xid)

    def _xid(self, tx: db.Tx) -> int | None:
        if self.env.backend == "sqlite":
            return None
        return int(tx.conn.execute(text("SELECT pg_current_xact_id()::text::bigint")).scalar_one())

    def _count_late(self, tx: db.Tx, own_xid: int | None) -> None:
        # An event with a larger xid already visible: a transaction that started after this one committed
        # first, so this one commits late (behind a position a naive ``id > cursor`` reader may have passed).
        if own_xid is None:
            return
        younger = tx.conn.execute(text("SELECT count(*) FROM job_events WHERE change_xid > :x"), {"x": own_xid})
        if younger.scalar_one():
            with self.pools.lock:
                self.pools.late_commits += 1


# -- the web processes -------------------------------------------------------------------------------
def _start_web(procs: Procs, env: JobEnv, name: str) -> int:
    port = free_port()
    web_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PROMETHEUS_"))},
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        "TENURE_DATABASE_URL": env.url,
        "TENURE_BROKER_URL": env.broker_url,
        "TENURE_OUTPUT_ROOT": str(env.tmp_path / "outputs"),
        "TENURE_SECRET_KEY": "live-feed-secret",
        "TENURE_WEB_TASKS_APP": "",  # the feed needs no job kinds
        "TENURE_WEB_LIVE_POLL_S": "0.05",
        "TENURE_WEB_LIVE_HEARTBEAT_S": "0.2",
        "PORT": str(port),
        "TENURE_WEB_WORKERS": "1",
        "TENURE_WEB_THREADS": "12",  # live feeds per process: threads - 8 (gunicorn.conf.py)
    }
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    procs.start(name, [gunicorn, "-c", "gunicorn.conf.py", "webapp:create_app()"], web_env)
    return port


# -- the client --------------------------------------------------------------------------------------
@dataclass
class Client:
    """A subscriber: its token, the owner id of its jobs, and what it received."""

    token: str
    owner: str
    got: Received = field(default_factory=lambda: Received())


@dataclass
class Received:
    notices: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (server, data)
    other: list[dict[str, Any]] = field(default_factory=list)
    last_id: str | None = None


def _read_sse(port: int, token: str, last_id: str | None, got: Received, server: str, stop: Callable[[], bool]) -> None:
    """Read the feed from *port* (resuming after *last_id*) into *got* until *stop* says so."""
    headers = {"Authorization": f"Bearer {token}", **({"Last-Event-ID": last_id} if last_id else {})}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/api/v1/live.sse", headers=headers)
        response = conn.getresponse()
        assert response.status == 200, response.read()[:300]
        event = ident = None
        while not stop():
            line = response.fp.readline().decode()
            assert line, "the server closed the feed"
            line = line.rstrip("\n")
            if line.startswith("id: "):
                ident = line[4:]
            elif line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == event
                if event == "notice" and data["kind"] != "progress":  # progress notices are best-effort
                    got.notices.append((server, data))
                elif event != "notice":
                    got.other.append(data)
                got.last_id = ident
    finally:
        conn.close()  # drops the connection mid-stream: the server notices at its next write


def _event_rows(env: JobEnv, owner: str | None = None) -> list[tuple[tuple[int, int], str, int, str, str]]:
    """Every event (of *owner*'s jobs) as (position, job_id, sequence, type, data), in feed order (the
    table is the record)."""
    position = "e.rowid, 0" if env.backend == "sqlite" else "e.change_xid, e.change_id"
    mine = "" if owner is None else " WHERE j.owner_id = :owner"
    rows = env.sql(
        f"SELECT {position}, e.job_id, e.sequence, e.type, e.data FROM job_events e JOIN jobs j ON j.id = e.job_id"
        f"{mine} ORDER BY 1, 2",
        owner=owner,
    )
    return [((int(r[0]), int(r[1])), r[2], int(r[3]), r[4], r[5]) for r in rows]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def deployment(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[JobEnv, Procs, list[int], Client, Client]]:
    with job_env(request.param, tmp_path) as env, processes(tmp_path) as procs:
        env.declare(KIND, lambda n: n, max_attempts=3)
        admin, _ = accounts.create_user(env.engine, "admin", "live-feed-admin-pw", role="admin")
        user, _ = accounts.create_user(env.engine, "ursula", "live-feed-user-pw", role="user")
        clients = [Client(accounts.create_token(env.engine, who.id, "live")[1], who.owner_id) for who in (admin, user)]
        ports = [_start_web(procs, env, "web-a"), _start_web(procs, env, "web-b")]
        for port in ports:  # both start at once; each is its own gunicorn arbiter and worker process
            wait_for(f"the web server on port {port}", lambda port=port: live(port), 30, procs)
        yield env, procs, ports, clients[0], clients[1]


def test_resumed_feed_on_another_process_sees_every_change_once(deployment) -> None:  # type: ignore[no-untyped-def]
    env, procs, (port_a, port_b), admin, user = deployment
    pools = Pools()
    total_ops = WRITERS * OPS_PER_WRITER
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        return run

    # Process A: from the head until a third of the writers' operations are done. The admin sees every
    # job; the user only her own (half of them), through her own feed.
    def first_leg(client: Client) -> None:
        _read_sse(port_a, client.token, None, client.got, "a", lambda: pools.ops >= total_ops // 3 or bool(errors))

    readers_a = [threading.Thread(target=guarded(lambda c=c: first_leg(c))) for c in (admin, user)]
    for reader in readers_a:
        reader.start()
    wait_for("hello from process A", lambda: admin.got.other and user.got.other, 15, procs)
    owners = (user.owner, "someone-else")
    writers = [threading.Thread(target=guarded(Writer(env, pools, seed, owners).run)) for seed in range(WRITERS)]
    for w in writers:
        w.start()
    for reader in readers_a:
        reader.join(60)
    assert not errors, errors
    resumed_from = {}
    for client in (admin, user):
        resumed_from[client.token] = client.got.last_id
        assert client.got.last_id is not None and pools.ops < total_ops, "the first leg should end while writers write"
        assert [m["type"] for m in client.got.other if m["type"] != "heartbeat"] == ["hello"]  # no resync from A
    leg_a = {c.token: len(c.got.notices) for c in (admin, user)}

    # Process B, resumed with the last id each client saw; read until the feed has served the newest event
    # the client may see (it serves them in position order: everything before it was served by then, or
    # never will be).
    def drained(client: Client) -> Callable[[], bool]:
        newest: list[tuple[str, int]] = []

        def done() -> bool:
            if errors:
                return True
            if not newest:
                if any(w.is_alive() for w in writers):
                    return False
                newest.append(_event_rows(env, None if client is admin else client.owner)[-1][1:3])
            return any((n["job_id"], n["sequence"]) == newest[0] for _, n in client.got.notices[-50:])

        return done

    readers_b = []
    for client in (admin, user):
        client.got.other.clear()
        resume = resumed_from[client.token]
        read = lambda c=client, r=resume: _read_sse(port_b, c.token, r, c.got, "b", drained(c))  # noqa: E731
        readers_b.append(threading.Thread(target=guarded(read)))
    for reader in readers_b:
        reader.start()
    for w in writers:
        w.join(60)
    for reader in readers_b:
        reader.join(60)
    assert not errors, errors
    assert not any(r.is_alive() for r in readers_b), f"the feed never passed the last event\n{procs.logs()}"

    for client in (admin, user):
        got = client.got
        rows = _event_rows(env, None if client is admin else client.owner)
        by_event = {(job_id, sequence): (type_, data) for _, job_id, sequence, type_, data in rows}
        seen = [(n["job_id"], n["sequence"]) for _, n in got.notices]
        servers = {s for s, _ in got.notices}
        # Both processes served part of the stream, and the second one resumed where the first stopped.
        assert servers == {"a", "b"} and 0 < leg_a[client.token] < len(rows), (leg_a, len(rows))
        resume_from = resumed_from[client.token]
        assert got.other[0] == {"type": "hello", "cursor": resume_from, "heartbeat_s": 0.2}  # B resumed there
        assert not [m for m in got.other if m["type"] == "resync"]
        # Nothing twice, nothing missed: exactly the rows of job_events the client may see.
        assert len(seen) == len(set(seen)), [p for p in seen if seen.count(p) > 1][:10]
        assert set(seen) == set(by_event), (sorted(set(by_event) - set(seen))[:10], len(seen), len(rows))
        # Numbered one by one in the client's own feed, across both processes: the ids count its notices
        # (the user's never counted the other owner's events).
        feed = resume_from.split(".")[0]
        assert [n["id"] for _, n in got.notices] == [f"{feed}.{i}" for i in range(1, len(seen) + 1)]
        # Each notice is its row: the status a status event recorded.
        for _, notice in got.notices:
            type_, data = by_event[(notice["job_id"], notice["sequence"])]
            if type_ == "status":
                assert notice["kind"] == "status" and notice["status"] == json.loads(data)["status"]
        # Per job, the order in which the events happened (their sequence, reserved under the job's row lock).
        per_job: dict[str, list[int]] = defaultdict(list)
        for job_id, sequence in seen:
            per_job[job_id].append(sequence)
        disordered = {j: s for j, s in per_job.items() if s != sorted(s)}
        assert not disordered, list(disordered.items())[:5]
    all_rows = _event_rows(env)
    assert len(all_rows) > total_ops // 2 and 0 < len(_event_rows(env, user.owner)) < len(all_rows)
    if env.backend == "postgres":
        # Late commits did happen (and were not skipped, per the assertions above).
        assert pools.late_commits >= 5, pools.late_commits
    print(
        f"{env.backend}: {len(all_rows)} events, {len(user.got.notices)} of them the user's; "
        f"late commits {pools.late_commits}"
    )
