"""submit: one transaction for job + idempotency key + message (or outbox row); idempotency rules."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

import jobs
from jobs import IdempotencyConflict, UnknownKind

from .support import JobEnv, observed


def noop(ctx: jobs.JobContext, **payload: object) -> None:
    return None


def _messages(env: JobEnv) -> int:
    if env.backend == "sqlite":
        return env.sql("SELECT count(*) FROM broker_messages")[0][0]
    return env.sql("SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0]


def test_submit_writes_job_event_and_message_together(env: JobEnv) -> None:
    env.declare("noop", noop)
    job = env.submit("noop", payload={"x": 1}, resource=("recording", "r1"))
    assert job.created and job.status == "queued" and job.attempt == 0
    assert job.resource_type == "recording" and job.resource_id == "r1"
    assert _messages(env) == 1
    events = jobs.job_events(env.engine, job.id, owner_id="u1")
    assert [(e.sequence, e.type, e.data["status"]) for e in events] == [(1, "status", "queued")]
    assert not hasattr(job, "payload")


def test_idempotency_rules(env: JobEnv) -> None:
    env.declare("noop", noop)
    first = env.submit("noop", payload={"x": 1}, idempotency_key="k")
    again = env.submit("noop", payload={"x": 1}, idempotency_key="k")
    assert again.id == first.id and first.created and not again.created
    with pytest.raises(IdempotencyConflict):
        env.submit("noop", payload={"x": 2}, idempotency_key="k")
    other_owner = env.submit("noop", owner_id="u2", payload={"x": 1}, idempotency_key="k")
    assert other_owner.id != first.id and other_owner.created
    assert _messages(env) == 2


def test_unknown_kind_is_rejected_and_nothing_written(env: JobEnv) -> None:
    with pytest.raises(UnknownKind, match="nope"):
        env.submit("nope")
    assert env.sql("SELECT count(*) FROM jobs")[0][0] == 0


def test_bad_arguments(env: JobEnv) -> None:
    env.declare("noop", noop)
    with pytest.raises(ValueError, match="JSON"):
        env.submit("noop", payload={"x": object()})
    with pytest.raises(ValueError, match="negative"):
        env.submit("noop", delay=-1)
    with pytest.raises(ValueError, match="owner_id"):
        env.submit("noop", owner_id="")


def test_delay_sets_run_after(env: JobEnv) -> None:
    env.declare("noop", noop)
    job = env.submit("noop", delay=60)
    row = env.row(job.id)
    assert row.run_after >= row.created_at + 60_000
    if env.backend == "sqlite":
        eta = env.sql("SELECT eta FROM broker_messages")[0][0]
    else:
        eta = env.sql("SELECT eta FROM outbox")[0][0]
    assert eta >= row.created_at + 60_000


def test_session_submit_commits_and_tells_observers_after_commit(env: JobEnv) -> None:
    env.declare("noop", noop)
    with observed() as seen:
        with Session(env.engine) as session:
            session.begin()
            job = jobs.submit(session, owner_id="u1", kind="noop", registry=env.registry, settings=env.settings)
            assert seen == []  # not before the commit
            session.commit()
        assert [(f["job_id"], f["event"]) for f in seen] == [(job.id, "job.queued")]
        assert _messages(env) == 1


def test_session_rollback_drops_job_message_and_lifecycle_events(env: JobEnv) -> None:
    env.declare("noop", noop)
    with observed() as seen:
        with Session(env.engine) as session:
            session.begin()
            jobs.submit(session, owner_id="u1", kind="noop", registry=env.registry, settings=env.settings)
            session.rollback()
        assert seen == []
        assert env.sql("SELECT count(*) FROM jobs")[0][0] == 0
        assert _messages(env) == 0


def test_rolled_back_savepoint_drops_its_lifecycle_events(env: JobEnv) -> None:
    env.declare("noop", noop)
    with observed() as seen:
        with Session(env.engine) as session:
            session.begin()
            kept = jobs.submit(session, owner_id="u1", kind="noop", registry=env.registry, settings=env.settings)
            nested = session.begin_nested()
            jobs.submit(session, owner_id="u1", kind="noop", registry=env.registry, settings=env.settings)
            nested.rollback()
            session.commit()
        assert [f["job_id"] for f in seen] == [kept.id]
        assert env.sql("SELECT count(*) FROM jobs")[0][0] == 1


def test_engine_submit_tells_observers_once_committed(env: JobEnv) -> None:
    env.declare("noop", noop)
    with observed() as seen:
        job = env.submit("noop")
    assert [(f["job_id"], f["event"], f["kind"]) for f in seen] == [(job.id, "job.queued", "noop")]


def test_session_submit_with_key_joins_the_callers_transaction(env: JobEnv) -> None:
    env.declare("noop", noop)
    with Session(env.engine) as session:
        session.begin()
        first = jobs.submit(
            session, owner_id="u1", kind="noop", idempotency_key="k", registry=env.registry, settings=env.settings
        )
        again = jobs.submit(
            session, owner_id="u1", kind="noop", idempotency_key="k", registry=env.registry, settings=env.settings
        )
        assert first.created and not again.created and again.id == first.id
        with pytest.raises(IdempotencyConflict):
            jobs.submit(
                session,
                owner_id="u1",
                kind="noop",
                payload={"other": True},
                idempotency_key="k",
                registry=env.registry,
                settings=env.settings,
            )
        session.commit()
    assert env.sql("SELECT count(*) FROM jobs")[0][0] == 1
    assert _messages(env) == 1
