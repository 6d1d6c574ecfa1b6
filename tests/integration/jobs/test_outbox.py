"""The outbox relay: messages of jobs whose broker is not SQLite on the same file."""

from __future__ import annotations

from pathlib import Path

import jobs
from broker import SQLiteBroker
from jobs import schema
from jobs.db import make_engine
from jobs.middleware import JobMiddleware, run_job
from jobs.outbox import relay_once
from jobs.publish import JOB_ID_OPTION
from jobs.registry import Registry
from jobs.settings import Settings

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
        ctx = mw._claim(broker, job.id)
        assert ctx is not None
        run_job(mw, ctx)
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
