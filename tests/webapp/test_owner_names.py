"""The API shows job owners by user name and filters by name; the internal owner ids never appear (issue 16).

Before: records said ``owner_id: "2"``, ``?owner=bob`` silently returned ``[]`` and the timeline said ``by=1``.
"""

from __future__ import annotations

from .conftest import login


def _submit(client, person):  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "x"}}, headers=person.bearer)
    assert r.status_code == 201, r.get_data(as_text=True)
    return r.json


def test_job_records_name_their_owner(client, alice, root):  # type: ignore[no-untyped-def]
    job = _submit(client, alice)
    assert job["owner"] == "alice" and "owner_id" not in job
    listed = client.get("/api/v1/jobs", headers=root.bearer).json["items"]
    assert [(j["owner"], "owner_id" in j) for j in listed] == [("alice", False)]
    shown = client.get(f"/api/v1/jobs/{job['id']}", headers=alice.bearer).json
    assert shown["owner"] == "alice"
    cancelled = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=root.bearer).json
    assert cancelled["job"]["owner"] == "alice"


def test_owner_filter_takes_a_user_name_and_never_an_id(client, alice, bob, root):  # type: ignore[no-untyped-def]
    a, b = _submit(client, alice)["id"], _submit(client, bob)["id"]

    def ids(query: str) -> list[str]:
        r = client.get(f"/api/v1/jobs?{query}", headers=root.bearer)
        assert r.status_code == 200, r.get_data(as_text=True)
        return [j["id"] for j in r.json["items"]]

    assert ids("owner=bob") == [b] and ids("owner=alice") == [a]
    # An unknown name, or an internal id (ids are not names), matches nothing — never a 500
    assert ids("owner=nobody") == [] and ids(f"owner={bob.user.owner_id}") == []
    assert ids("owner=" + "z" * 100) == []
    # A bulk action over an unknown owner acts on nothing (it never falls back to "every job")
    body = {"filter": {"owner": "nobody"}, "dry_run": False}
    done = client.post("/api/v1/jobs/bulk/cancel", json=body, headers=root.bearer).json
    assert (done["matched"], done["affected"]) == (0, 0)
    assert {j["status"] for j in client.get("/api/v1/jobs", headers=root.bearer).json["items"]} == {"queued"}
    counted = client.post(
        "/api/v1/jobs/bulk/cancel", json={"filter": {"owner": "bob"}, "dry_run": True}, headers=root.bearer
    )
    assert counted.json["matched"] == 1


def test_a_users_owner_filter_cannot_widen_their_scope(client, alice, bob):  # type: ignore[no-untyped-def]
    _submit(client, bob)
    for owner in ("bob", "alice", bob.user.owner_id):
        r = client.get(f"/api/v1/jobs?owner={owner}", headers=alice.bearer)
        assert r.status_code == 403
        assert r.json["error"]["message"] == "Filtering by owner needs the jobs.read_all permission."
        bulk = client.post("/api/v1/jobs/bulk/cancel", json={"filter": {"owner": owner}}, headers=alice.bearer)
        assert bulk.status_code == 403
    assert client.get("/api/v1/jobs", headers=alice.bearer).json["items"] == []


def test_the_timeline_names_who_acted(client, alice, root, driver):  # type: ignore[no-untyped-def]
    queued = _submit(client, alice)["id"]
    client.post(f"/api/v1/jobs/{queued}/cancel", headers=root.bearer)
    running = _submit(client, alice)["id"]
    driver.start(running)
    client.post(f"/api/v1/jobs/{running}/cancel", headers=alice.bearer)

    def by(job_id: str) -> list[tuple[str, str | None]]:
        items = client.get(f"/api/v1/jobs/{job_id}/events", headers=alice.bearer).json["items"]
        return [(e["type"], e["data"].get("by")) for e in items if "by" in e["data"]]

    assert by(queued) == [("status", "root")]  # cancelled by the admin, shown by name
    assert by(running) == [("cancel_requested", "alice")]
    body = {"kind": "echo", "payload": {"text": "later"}, "delay_s": 600}
    delayed = client.post("/api/v1/jobs", json=body, headers=alice.bearer).json["id"]
    assert client.post(f"/api/v1/jobs/{delayed}/run-now", headers=root.bearer).status_code == 200
    assert by(delayed) == [("run_now", "root")]


def test_an_owner_that_is_no_user_shows_and_filters_as_recorded(client, root, driver):  # type: ignore[no-untyped-def]
    job = driver.submit("scheduler").id  # what a schedule's jobs carry by default
    listed = client.get("/api/v1/jobs?owner=scheduler", headers=root.bearer).json["items"]
    assert [(j["id"], j["owner"]) for j in listed] == [(job, "scheduler")]


def test_the_openapi_document_has_owner_names(client, alice):  # type: ignore[no-untyped-def]
    doc = client.get("/api/openapi.json", headers=alice.bearer).json
    job = doc["components"]["schemas"]["Job"]
    assert "owner" in job["properties"] and "owner_id" not in job["properties"] and "owner" in job["required"]
    assert job["properties"]["owner"]["type"] == "string"
    assert "user name" in job["properties"]["owner"]["description"]


def test_the_ui_filter_takes_names_too(client, alice, bob, root):  # type: ignore[no-untyped-def]
    b = _submit(client, bob)["id"]
    a = _submit(client, alice)["id"]
    login(client, root)
    page = client.get("/jobs?owner=bob").get_data(as_text=True)
    assert b in page and a not in page
    nobody = client.get(f"/jobs?owner={bob.user.owner_id}").get_data(as_text=True)
    assert b not in nobody and a not in nobody


def test_schedules_name_who_paused_and_who_ran_them(app, alice, root):  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    from webapp.api.schemas import ScheduleSchema
    from webapp.gateway import FireView, ScheduleView

    now = datetime.now(UTC)
    fires = (
        FireView(tick=now, cause="manual", fired_at=now, due_at=now, fired_by=alice.user.owner_id),
        FireView(tick=now, cause="schedule", fired_at=now, due_at=now, fired_by="web-1:4242"),
    )
    view = ScheduleView(name="nightly", cron="0 3 * * *", paused=True, paused_by=root.user.owner_id, fires=fires)
    with app.test_request_context():
        dumped = ScheduleSchema().dump(view)
    assert dumped["paused_by"] == "root"
    assert [f["fired_by"] for f in dumped["fires"]] == ["alice", "web-1:4242"]  # a scheduler process as recorded


def test_the_ui_timeline_names_who_acted(client, alice, root):  # type: ignore[no-untyped-def]
    job = _submit(client, alice)["id"]
    client.post(f"/api/v1/jobs/{job}/cancel", headers=root.bearer)
    login(client, alice)
    page = client.get(f"/jobs/{job}").get_data(as_text=True)
    assert "by=root" in page and f"by={root.user.owner_id}" not in page


def test_a_page_of_jobs_looks_up_its_owners_names_in_one_query(client, alice, bob, root, web_engine):  # type: ignore[no-untyped-def]
    from sqlalchemy import event

    for person in (alice, bob, root, alice):
        _submit(client, person)
    lookups: list[str] = []

    def count(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if "users.id IN" in statement:
            lookups.append(statement)

    event.listen(web_engine, "before_cursor_execute", count)
    try:
        items = client.get("/api/v1/jobs", headers=root.bearer).json["items"]
    finally:
        event.remove(web_engine, "before_cursor_execute", count)
    assert sorted(j["owner"] for j in items) == ["alice", "alice", "bob", "root"]
    assert len(lookups) == 1
