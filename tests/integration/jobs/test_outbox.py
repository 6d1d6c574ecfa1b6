"""The outbox relay: messages of jobs whose broker is not SQLite on the same file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import event

import jobs
from broker import SQLiteBroker
from jobs import schema
from jobs.db import make_engine
from jobs.execution.binding import JobMiddleware
from jobs.outbox import relay_once
from jobs.publish import JOB_ID_OPTION
from jobs.registry import Registry
from settings.environment import Settings

from .support import JobEnv


def test_relay_publishes_to_another_sqlite_file_exactly_once(tmp_path: Path) -> None:
    # Given: job records in one file, messages in another (so: outbox + relay)
    db_url, broker_url = f"sqlite:///{tmp_path / 'jobs.db'}", f"sqlite:///{tmp_path / 'broker.db'}"
    schema.upgrade(db_url)
    engine = make_engine(db_url)
    broker = SQLiteBroker(broker_url, middleware=[])
    registry = Registry()
    registry.kind("echo", broker=broker)(lambda ctx, **p: p)
    settings = Settings(database_url=db_url, broker_url=broker_url, output_root=str(tmp_path / "out"))
    try:
        job = jobs.submit(engine, owner_id="u1", kind="echo", payload={"a": 1}, registry=registry, settings=settings)
        with engine.connect() as conn:
            (message_id,) = conn.exec_driver_sql("SELECT message_id FROM outbox").fetchone()
        assert broker.stats() == [] or all(s.ready == 0 for s in broker.stats())
        # When: the relay runs (twice: the second run has nothing to do)
        assert relay_once(engine, broker) == 1
        assert relay_once(engine, broker) == 0
        # Then: one message, with the outbox row's id, naming the job
        consumer = broker.consume("default", prefetch=1, timeout=1000)
        message = next(consumer)
        assert message is not None and message.message_id == message_id
        assert message.options[JOB_ID_OPTION] == job.id
        mw = JobMiddleware(settings, engine=engine, registry=registry, check_schema=False)
        ctx = mw.claimer.claim(broker, job.id)
        assert ctx is not None
        mw.runner(ctx)
        assert jobs.get_job(engine, job.id, owner_id="u1").result == {"a": 1}
        consumer.ack(message)
        consumer.close()
    finally:
        broker.close()
        engine.dispose()


def test_relay_to_redis(env: JobEnv) -> None:
    if env.backend == "sqlite":
        return  # the same-file broker writes messages in the submit transaction: no outbox
    env.declare("echo", lambda ctx, **p: p)
    job = env.submit("echo", payload={"b": 2})
    assert relay_once(env.engine, env.broker) == 1
    consumer = env.broker.consume("default", prefetch=1, timeout=2000)
    message = next(consumer)
    assert message is not None and message.options[JOB_ID_OPTION] == job.id
    consumer.ack(message)
    consumer.close()
    assert env.sql("SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0] == 0


def test_tenure_relay_says_it_started(tmp_path: Path) -> None:
    # Given a migrated database and `tenure relay` (Procfile.fleet's relay process)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    schema.upgrade(url)
    env = {**os.environ, "TENURE_DATABASE_URL": url}
    log = tmp_path / "relay.log"
    with log.open("w") as stderr:
        relay = subprocess.Popen(
            [sys.executable, "-m", "tenure_cli", "relay"],
            env=env,
            cwd=Path(__file__).resolve().parents[3],
            stderr=stderr,
        )
    try:
        # When it starts, then its start line is on stderr (an operator sees it is alive)
        deadline = time.monotonic() + 30
        while "Outbox relay started." not in log.read_text() and time.monotonic() < deadline:
            assert relay.poll() is None, f"the relay exited: {log.read_text()}"
            time.sleep(0.1)
        assert "Outbox relay started." in log.read_text()
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(timeout=20)


def test_an_idle_relay_on_postgresql_publishes_when_the_submit_commits(env: JobEnv) -> None:
    import dataclasses
    import threading

    from jobs.outbox import relay_forever

    if env.backend == "sqlite":
        return  # one file: the message is written in the job's own transaction, there is no relay
    env.declare("echo", lambda ctx, **p: p)
    # A poll interval far longer than the test: only the commit's NOTIFY can wake the relay in time.
    settings = dataclasses.replace(env.settings, relay_interval_s=60.0)
    stop = threading.Event()
    relay = threading.Thread(target=relay_forever, args=(settings, env.broker), kwargs={"stop": stop})
    relay.start()
    try:
        time.sleep(0.5)  # let it start listening (a submit before that is published by its first pass anyway)
        job = env.submit("echo", payload={"n": 1})
        deadline = time.monotonic() + 20
        while env.sql("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")[0][0] == 0:
            assert time.monotonic() < deadline, "the relay slept through the commit"
            time.sleep(0.02)
        assert env.sql("SELECT job_id FROM outbox WHERE published_at IS NOT NULL") == [(job.id,)]
    finally:
        stop.set()
        relay.join(10)
    assert not relay.is_alive()


def test_many_outbox_rows_are_written_in_order_one_statement_per_chunk(env: JobEnv) -> None:
    count = 2 * jobs.store.INSERT_CHUNK + 5
    entries = [
        jobs.store.OutboxEntry(f"m{n:05d}", None, "default", "noop", f"body {n}".encode(), 1_000 + n)
        for n in range(count)
    ]
    statements: list[str] = []
    with env.engine.begin() as conn:
        event.listen(conn, "before_cursor_execute", lambda *args: statements.append(args[2]))
        jobs.store.outbox_insert_many(conn, entries, now=5)
    assert len([s for s in statements if s.startswith("INSERT INTO outbox")]) == 3
    rows = env.sql("SELECT message_id, body, eta, created_at, attempts FROM outbox ORDER BY id")
    assert [(r[0], bytes(r[1]), r[2], r[3], r[4]) for r in rows] == [
        (e.message_id, e.body, e.eta, 5, 0) for e in entries
    ]
