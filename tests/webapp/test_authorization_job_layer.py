"""The authorization probe of test_authorization.py with jobs driven into the states it needs (failed,
retried): owner scoping is checked in the queries that enforce it, on a migrated SQLite file (jobs,
accounts and broker in one file)."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from jobs.execution.runner import failure
from settings.environment import Settings

from .conftest import Person, _person, login, without_csrf_token
from .jobdriver import JobDriver
from .test_authorization import JOB_API, JOB_UI


@pytest.fixture()
def layer(app: Flask, driver: JobDriver, web_settings: Settings) -> dict[str, Any]:
    """The parts of the real job layer under the app (the conftest's migrated file per test)."""
    services = app.extensions["tenure"]
    return {
        "engine": services.engine,
        "broker": services.broker,
        "settings": web_settings,
        "gateway": services.jobs,
        "worker": driver.worker,
    }


@pytest.fixture()
def real_app(app: Flask) -> Flask:
    return app


@pytest.fixture()
def real_client(client: FlaskClient) -> FlaskClient:
    return client


@pytest.fixture()
def people(layer: dict[str, Any]) -> tuple[Person, Person]:
    engine: Engine = layer["engine"]
    return _person(engine, "alice", "user"), _person(engine, "bob", "user")


def _failed_job_of(client: FlaskClient, owner: Person, layer: dict[str, Any]) -> str:
    job_id = client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "a"}}, headers=owner.bearer).json[
        "id"
    ]
    ctx = layer["worker"].claimer.claim(layer["broker"], job_id)
    assert ctx is not None
    ctx._kind = layer["worker"].registry.find("echo")
    layer["worker"].runner.record(ctx, failure(ctx, ctx._kind, RuntimeError("boom")))  # retries left: back to queued
    with layer["engine"].begin() as conn:  # end it failed, as a last attempt would
        conn.execute(
            text("UPDATE jobs SET status = 'failed', completed_at = updated_at, run_after = 0 WHERE id = :id"),
            {"id": job_id},
        )
    return job_id


def _counts(layer: dict[str, Any]) -> tuple[int, str]:
    with layer["engine"].connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM jobs")).scalar_one()
        statuses = ",".join(r[0] for r in conn.execute(text("SELECT status FROM jobs ORDER BY created_at")))
    return n, statuses


@pytest.mark.parametrize("method,template", JOB_API)
def test_api_foreign_job_is_indistinguishable_from_missing(
    real_client: FlaskClient, people: tuple[Person, Person], layer: dict[str, Any], method: str, template: str
) -> None:
    alice, bob = people
    job_id = _failed_job_of(real_client, alice, layer)
    before = _counts(layer)
    foreign = real_client.open(template.format(id=job_id), method=method, headers=bob.bearer)
    missing = real_client.open(template.format(id="f" * 32), method=method, headers=bob.bearer)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.get_data() == missing.get_data()
    assert _counts(layer) == before  # nothing cancelled, no retry created
    own = real_client.open(template.format(id=job_id), method=method, headers=alice.bearer)
    assert own.status_code in (200, 201, 409) or "/files/" in template


@pytest.mark.parametrize("method,template", JOB_UI)
def test_ui_foreign_job_is_indistinguishable_from_missing(
    real_client: FlaskClient, people: tuple[Person, Person], layer: dict[str, Any], method: str, template: str
) -> None:
    alice, bob = people
    job_id = real_client.post(
        "/api/v1/jobs", json={"kind": "echo", "payload": {"text": "a"}}, headers=alice.bearer
    ).json["id"]
    token = login(real_client, bob)
    data = {"csrf_token": token} if method == "POST" else None
    before = _counts(layer)
    foreign = real_client.open(template.format(id=job_id), method=method, data=data)
    missing = real_client.open(template.format(id="f" * 32), method=method, data=data)
    assert foreign.status_code == missing.status_code == 404
    assert without_csrf_token(foreign.get_data()) == without_csrf_token(missing.get_data())
    assert _counts(layer) == before


def test_lists_search_bulk_and_activity_never_reach_foreign_jobs(
    real_client: FlaskClient, people: tuple[Person, Person], layer: dict[str, Any]
) -> None:
    alice, bob = people
    queued = real_client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "a"}}, headers=alice.bearer)
    done = real_client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "b"}}, headers=alice.bearer)
    ctx = layer["worker"].claimer.claim(layer["broker"], done.json["id"])
    assert ctx is not None
    layer["worker"].runner(ctx)
    assert real_client.get("/api/v1/jobs", headers=bob.bearer).json["items"] == []
    assert real_client.get(f"/api/v1/jobs?q={queued.json['id']}", headers=bob.bearer).json["items"] == []
    assert len(real_client.get("/api/v1/jobs", headers=alice.bearer).json["items"]) == 2
    r = real_client.post("/api/v1/jobs/bulk/cancel", json={"filter": {}}, headers=bob.bearer).json
    assert r["matched"] == 0
    assert _counts(layer)[1] == "queued,succeeded"
    # Bob's view of activity (the gateway's per-owner scope) holds none of Alice's finished job.
    bob_buckets = layer["gateway"].activity(bob.user.owner_id, since=_hour_ago(), bucket_s=60)
    alice_buckets = layer["gateway"].activity(alice.user.owner_id, since=_hour_ago(), bucket_s=60)
    assert sum(b.succeeded for b in bob_buckets) == 0
    assert sum(b.succeeded for b in alice_buckets) == 1


def _hour_ago() -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) - timedelta(hours=1)
