"""A job is retried once: a second retry (API, UI, bulk) answers the first retry instead of starting
another copy of the work. Against the real job layer on a migrated SQLite file."""

from __future__ import annotations

from typing import Any

from flask.testing import FlaskClient
from sqlalchemy import text

from .conftest import Person, _person
from .test_authorization_job_layer import layer, real_app, real_client  # noqa: F401  (fixtures)


def _cancelled_job(client: FlaskClient, person: Person, note: str) -> str:
    r = client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": note}}, headers=person.bearer)
    assert r.status_code == 201
    job_id = str(r.json["id"])
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=person.bearer).json["outcome"] == "cancelled"
    return job_id


def _retries_of(env: dict[str, Any], job_id: str) -> int:
    with env["engine"].connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM jobs WHERE retry_of_job_id = :j"), {"j": job_id}).scalar())


def test_api_retry_twice_answers_the_first_retry(
    real_client: FlaskClient,  # noqa: F811
    layer: dict[str, Any],  # noqa: F811
) -> None:
    alice = _person(layer["engine"], "alice", "user")
    job = _cancelled_job(real_client, alice, "once")
    first = real_client.post(f"/api/v1/jobs/{job}/retry", headers=alice.bearer)
    assert first.status_code == 201 and first.json["retry_of_job_id"] == job
    again = real_client.post(f"/api/v1/jobs/{job}/retry", headers=alice.bearer)
    assert again.status_code == 200 and again.json["id"] == first.json["id"]
    assert again.headers["Location"] == f"/api/v1/jobs/{first.json['id']}"
    assert _retries_of(layer, job) == 1


def test_bulk_retry_skips_jobs_retried_before(
    real_client: FlaskClient,  # noqa: F811
    layer: dict[str, Any],  # noqa: F811
) -> None:
    alice = _person(layer["engine"], "alice", "user")
    jobs = [_cancelled_job(real_client, alice, f"bulk {i}") for i in range(3)]
    assert real_client.post(f"/api/v1/jobs/{jobs[0]}/retry", headers=alice.bearer).status_code == 201
    body = {"filter": {"status": ["cancelled"]}}
    first = real_client.post("/api/v1/jobs/bulk/retry", json=body, headers=alice.bearer).json
    assert first["affected"] == 2 and first["skipped"] == 1
    second = real_client.post("/api/v1/jobs/bulk/retry", json=body, headers=alice.bearer).json
    assert second["affected"] == 0 and second["skipped"] == 3 and second["job_ids"] == []
    assert [_retries_of(layer, j) for j in jobs] == [1, 1, 1]


def test_a_retry_key_taken_by_the_owner_is_a_409_not_a_500(
    real_client: FlaskClient,  # noqa: F811
    layer: dict[str, Any],  # noqa: F811
) -> None:
    alice = _person(layer["engine"], "alice", "user")
    job = _cancelled_job(real_client, alice, "original")
    other = {"kind": "echo", "payload": {"text": "something else"}}
    headers = {**alice.bearer, "Idempotency-Key": f"tenure:retry-of:{job}"}
    assert real_client.post("/api/v1/jobs", json=other, headers=headers).status_code == 201
    r = real_client.post(f"/api/v1/jobs/{job}/retry", headers=alice.bearer)
    assert r.status_code == 409 and "retry key" in r.json["error"]["message"], r.json
    assert _retries_of(layer, job) == 0
