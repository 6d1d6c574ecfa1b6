"""Bulk actions count exactly what they act on: an old match among newer jobs is counted (``skipped`` never
negative: fuzzing a live deployment once found a count that stopped at a scan budget), and a cancel looks
only at the jobs it can cancel. Against the real job layer on a migrated SQLite file."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import event, text

from .conftest import Person, _person
from .test_authorization_job_layer import layer, real_app, real_client  # noqa: F401  (fixtures)


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_match_older_than_the_count_budget_is_counted(
    real_client: FlaskClient,  # noqa: F811
    layer: dict[str, Any],  # noqa: F811
    dry_run: bool,
) -> None:
    alice: Person = _person(layer["engine"], "alice", "user")

    def submit(text: str) -> str:
        r = real_client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": text}}, headers=alice.bearer)
        assert r.status_code == 201
        return str(r.json["id"])

    old = submit("the oldest")
    for i in range(12):
        submit(f"newer {i}")
    body = {"filter": {"q": old}, "dry_run": dry_run}
    r = real_client.post("/api/v1/jobs/bulk/cancel", json=body, headers=alice.bearer)
    assert r.status_code == 200, r.json
    assert r.json["job_ids"] == [old] and r.json["affected"] == 1
    assert r.json["matched"] == 1 and r.json["skipped"] == 0  # was matched 0, skipped -1


def test_a_cancel_walks_only_the_jobs_it_can_cancel(
    real_client: FlaskClient,  # noqa: F811
    layer: dict[str, Any],  # noqa: F811
) -> None:
    # A fuzzing run's bulk cancel with nothing to cancel took 20-65 s on a history of 10 000-27 000
    # failed jobs: the candidate walk read every matching job, 200 at a time, after the count had.
    alice: Person = _person(layer["engine"], "alice", "user")
    history = 6_000
    first = real_client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "a"}}, headers=alice.bearer)
    queued = real_client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "b"}}, headers=alice.bearer)
    with layer["engine"].begin() as conn:
        conn.execute(
            text("UPDATE jobs SET status = 'failed', completed_at = updated_at, run_after = 0 WHERE id = :id"),
            {"id": first.json["id"]},
        )
        columns = [r[1] for r in conn.execute(text("PRAGMA table_info(jobs)"))]
        copied = ", ".join(
            {"id": "printf('%032d', n)", "created_at": "created_at - n", "idempotency_key": "NULL"}.get(c, c)
            for c in columns
        )
        conn.execute(
            text(
                f"WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < :n) "
                f"INSERT INTO jobs ({', '.join(columns)}) SELECT {copied} FROM jobs, seq WHERE jobs.id = :id"
            ),
            {"n": history - 1, "id": first.json["id"]},
        )
    reads: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and " jobs" in statement:
            reads.append(statement)

    event.listen(layer["engine"], "before_cursor_execute", count)
    try:
        r = real_client.post("/api/v1/jobs/bulk/cancel", json={"filter": {}, "dry_run": True}, headers=alice.bearer)
    finally:
        event.remove(layer["engine"], "before_cursor_execute", count)
    assert r.status_code == 200 and r.json["job_ids"] == [queued.json["id"]]
    assert r.json["matched"] == history + 1
    # One count statement and one page of cancellable jobs: the history is never walked (it was read
    # twice, 200 rows at a time, before the count and the walk were SQL).
    assert len(reads) <= 8, len(reads)
