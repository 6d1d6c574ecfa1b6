"""What waits for admission, where people look: a job's `waiting` (API and page), the admission API
and the Queues page — on the real app and job layer, with a kind limited per owner."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.limits import ConcurrencyLimit
from jobs.registry import Registry

from .conftest import Person, login


@pytest.fixture()
def kinds(kinds: Registry, web_broker: Any) -> Registry:
    """The web tests' kinds, and one whose jobs run one at a time per owner."""
    kinds.kind("one_at_a_time", concurrency=ConcurrencyLimit("one_at_a_time.owner", limit=1), broker=web_broker)(
        lambda ctx: None
    )
    return kinds


def _submit(client: Any, person: Person) -> dict[str, Any]:
    r = client.post("/api/v1/jobs", json={"kind": "one_at_a_time", "payload": {}}, headers=person.bearer)
    assert r.status_code == 201, r.json
    return r.json


def test_a_waiting_job_says_what_it_waits_for_by_owner_name(client, driver, alice, root) -> None:  # type: ignore[no-untyped-def]
    first = _submit(client, alice)
    waiting = _submit(client, alice)
    assert first["waiting"] is None
    # In the answer to the submit (the job's row alone), then on its own page with what is in use.
    assert waiting["waiting"] == {
        "reason": "concurrency", "limit_name": "one_at_a_time.owner", "key": "alice",
    }  # fmt: skip
    driver.start(first["id"])
    detail = client.get(f"/api/v1/jobs/{waiting['id']}", headers=alice.bearer).json["waiting"]
    assert detail == {
        "reason": "concurrency",
        "limit_name": "one_at_a_time.owner",
        "key": "alice",
        "running": 1,
        "limit": 1,
        "text": "waiting: concurrency key one_at_a_time.owner=alice, 1/1 running",
    }
    login(client, alice)
    page = client.get(f"/jobs/{waiting['id']}").get_data(as_text=True)
    assert 'id="job-waiting">waiting: concurrency key one_at_a_time.owner=alice, 1/1 running<' in page
    # Once the running one finishes, the waiting one is admitted: nothing waits any more.
    driver.succeed(first["id"])
    assert client.get(f"/api/v1/jobs/{waiting['id']}", headers=alice.bearer).json["waiting"] is None


def test_the_admission_api_and_the_queues_page_count_what_waits_and_what_runs(  # type: ignore[no-untyped-def]
    client, driver, alice: Person, bob: Person, root: Person
) -> None:
    running = _submit(client, alice)
    for _ in range(3):
        _submit(client, alice)
    _submit(client, bob)
    driver.start(running["id"])
    answer = client.get("/api/v1/admission", headers=root.bearer).json
    assert answer["fair_share"] == {"enabled": True, "window": 64}
    assert answer["waiting"] == [{"queue": "default", "reason": "concurrency", "jobs": 3}]
    (limit,) = [u for u in answer["limits"] if u["name"] == "one_at_a_time.owner"]
    assert limit == {
        "name": "one_at_a_time.owner", "type": "concurrency", "limit": 1, "period_s": None,
        "in_use": 1, "waiting": 3, "keys_at_limit": 1,
    }  # fmt: skip
    assert client.get("/api/v1/admission", headers=alice.bearer).status_code == 403
    login(client, root)
    page = client.get("/ops/queues").get_data(as_text=True)
    assert 'id="limit-one_at_a_time.owner"' in page
    assert '<td data-label="In use" class="in-use">1</td><td data-label="Waiting" class="waiting">3</td>' in page
