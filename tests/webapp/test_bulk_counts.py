"""Bulk actions on a history longer than the count's scan budget: ``matched`` is never less than what the
action found (``skipped`` never negative). Found while fuzzing a live deployment whose bulk retries had
grown the history past 20 000 jobs (``MAX_COUNT_ROWS``); here the budget is lowered instead of
submitting 20 000 jobs. Against the real job layer on a migrated SQLite file."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from webapp import jobs_adapter

from .conftest import Person, _person
from .test_authorization_job_layer import layer, real_app, real_client  # noqa: F401  (fixtures)


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_match_older_than_the_count_budget_is_counted(
    real_client: FlaskClient,  # noqa: F811
    layer: dict[str, Any],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
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
    monkeypatch.setattr(jobs_adapter, "MAX_COUNT_ROWS", 5)  # the 20 000 newest jobs, scaled down
    body = {"filter": {"q": old}, "dry_run": dry_run}
    r = real_client.post("/api/v1/jobs/bulk/cancel", json=body, headers=alice.bearer)
    assert r.status_code == 200, r.json
    assert r.json["job_ids"] == [old] and r.json["affected"] == 1
    assert r.json["matched"] == 1 and r.json["skipped"] == 0  # was matched 0, skipped -1
