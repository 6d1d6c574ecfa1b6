"""The search grammar (``q``) in the API, the summary field, the ``parent`` filter and deleting finished jobs."""

from __future__ import annotations

import pytest
from sqlalchemy import text

import jobs
from jobs.workflows import Step, submit_workflow
from webapp.job_search import Search, SearchInvalid, parse

from .conftest import newest_first


def _ids(client, person, query: str) -> list[str]:  # type: ignore[no-untyped-def]
    r = client.get("/api/v1/jobs", query_string={"q": query}, headers=person.bearer)
    assert r.status_code == 200, r.json
    return [j["id"] for j in r.json["items"]]


def test_the_grammar_splits_qualifiers_from_text() -> None:
    assert parse('kind:render status:failed status:cancelled owner:bob queue:x "session-2026" clip') == Search(
        statuses=("failed", "cancelled"), kind="render", queue="x", owner="bob", text=("session-2026", "clip")
    )
    assert parse('kind:"a b" parent:abc  "unterminated phrase') == Search(
        kind="a b", parent="abc", text=("unterminated phrase",)
    )
    assert parse('STATUS:Failed "Error: disk"') == Search(statuses=("failed",), text=("Error: disk",))
    assert parse("") == Search()
    # a word of one or two ASCII characters is the start of a job id: hex digits; in other scripts it is text
    assert parse("aB 7 東京 \x00") == Search(text=("aB", "7", "東京", "\x00"))


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("colour:red", "Unknown qualifier colour:"),
        ("Error: disk", "Unknown qualifier Error:"),
        ("status:sleeping", "Unknown status 'sleeping'"),
        ("kind:", "needs a value"),
        ("kind:a kind:b", "given twice"),
        ("x" * 501, "longer than 500"),
        ("ok", "'ok' is too short"),
        ('disk "z"', "'z' is too short"),
    ],
)
def test_the_grammar_refuses_what_it_cannot_understand(query: str, reason: str) -> None:
    with pytest.raises(SearchInvalid, match=reason):
        parse(query)


def test_api_search_with_qualifiers_finds_by_summary_and_status(client, alice, driver):  # type: ignore[no-untyped-def]
    # Given alice's echo jobs with their summaries (the kind-declared one: the text), one failed
    made = [driver.submit(alice.user.owner_id, payload={"text": t}).id for t in ("session-2026 a", "other b", "x")]
    session, other, plain = made
    driver.fail(other, "RuntimeError: disk full")
    # Then text, phrases and qualifiers combine (every term must match), summary shown to the owner
    assert _ids(client, alice, '"session-2026"') == [session]
    assert _ids(client, alice, "status:failed") == [other]
    assert _ids(client, alice, "status:failed disk") == [other]
    assert _ids(client, alice, "status:failed session-2026") == []
    assert set(_ids(client, alice, "kind:echo status:queued status:failed")) == set(made)
    assert _ids(client, alice, "kind:sleep") == []
    one = client.get(f"/api/v1/jobs/{session}", headers=alice.bearer).json
    assert one["summary"] == "session-2026 a" and "payload" not in one
    # An unknown qualifier or status is a 400 with its reason, never a 500
    bad = client.get("/api/v1/jobs", query_string={"q": "colour:red"}, headers=alice.bearer)
    assert bad.status_code == 400 and "Unknown qualifier colour:" in bad.json["error"]["message"]
    bad = client.post("/api/v1/jobs/bulk/cancel", json={"filter": {"q": "status:nap"}}, headers=alice.bearer)
    assert bad.status_code == 400 and "Unknown status" in bad.json["error"]["message"]
    assert plain in _ids(client, alice, "")


def test_owner_qualifier_is_a_user_name(client, alice, bob, root, driver):  # type: ignore[no-untyped-def]
    a = driver.submit(alice.user.owner_id).id
    b = driver.submit(bob.user.owner_id).id
    assert _ids(client, root, "owner:bob") == [b]
    assert _ids(client, root, "owner:nobody-by-that-name") == []
    assert _ids(client, alice, "owner:alice") == [a]
    refused = client.get("/api/v1/jobs", query_string={"q": "owner:bob"}, headers=alice.bearer)
    assert refused.status_code == 403


def _workflow(driver, owner_id: str) -> jobs.JobRecord:  # type: ignore[no-untyped-def]
    steps = [Step("one", "echo", {"text": "first"}), Step("two", "echo", {"text": "second"}, depends_on=["one"])]
    return submit_workflow(
        driver.engine, owner_id=owner_id, name="pair", steps=steps, registry=driver.registry, settings=driver.settings
    )


def test_parent_filter_lists_a_workflows_steps(client, alice, bob, driver):  # type: ignore[no-untyped-def]
    parent = _workflow(driver, alice.user.owner_id)
    driver.submit(alice.user.owner_id)  # not a step
    steps = jobs.workflow_steps(driver.engine, parent.id, owner_id=alice.user.owner_id)
    listed = client.get(f"/api/v1/jobs?parent={parent.id}", headers=alice.bearer).json["items"]
    assert {j["id"] for j in listed} == {s.id for s in steps} and all(j["parent_job_id"] == parent.id for j in listed)
    assert {j["summary"] for j in listed} == {"first", "second"}
    assert set(_ids(client, alice, f"parent:{parent.id}")) == {s.id for s in steps}
    # another owner's workflow has no steps they can see
    assert client.get(f"/api/v1/jobs?parent={parent.id}", headers=bob.bearer).json["items"] == []


def test_delete_finished_jobs_owner_scoped(client, alice, bob, root, driver):  # type: ignore[no-untyped-def]
    # Given alice's finished job (with events and a file) and a newer one that is queued
    done, queued = newest_first(driver, [driver.submit(alice.user.owner_id).id for _ in range(2)])[::-1]
    driver.succeed(done, {"ok": True})
    driver.write_file(done, "1-out.txt", b"x")
    driver.submit(bob.user.owner_id)  # the live feed's newest entry is someone else's
    # When bob deletes it: exactly the answer for a missing job
    foreign = client.delete(f"/api/v1/jobs/{done}", headers=bob.bearer)
    missing = client.delete("/api/v1/jobs/" + "0" * 32, headers=bob.bearer)
    assert foreign.status_code == missing.status_code == 404 and foreign.json == missing.json
    # A queued job cannot go
    refused = client.delete(f"/api/v1/jobs/{queued}", headers=alice.bearer)
    assert refused.status_code == 409 and "only finished jobs" in refused.json["error"]["message"]
    # When alice deletes her finished job, it is gone with its events and files
    r = client.delete(f"/api/v1/jobs/{done}", headers=alice.bearer)
    assert r.status_code == 200 and r.json == {"deleted": [done]}
    assert client.get(f"/api/v1/jobs/{done}", headers=alice.bearer).status_code == 404
    with driver.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_events WHERE job_id = :j"), {"j": done}).scalar() == 0
    assert not (driver.output_root / done).exists()
    assert client.delete(f"/api/v1/jobs/{done}", headers=alice.bearer).status_code == 404
    # an admin may delete anyone's finished job
    client.post(f"/api/v1/jobs/{queued}/cancel", headers=alice.bearer)
    driver.submit(bob.user.owner_id)
    assert client.delete(f"/api/v1/jobs/{queued}", headers=root.bearer).status_code == 200


def test_delete_a_workflow_with_its_steps_never_a_step_alone(client, alice, driver):  # type: ignore[no-untyped-def]
    parent = _workflow(driver, alice.user.owner_id)
    one, two = (s.id for s in jobs.workflow_steps(driver.engine, parent.id, owner_id=alice.user.owner_id))
    running = client.delete(f"/api/v1/jobs/{parent.id}", headers=alice.bearer)
    assert running.status_code == 409 and "running" in running.json["error"]["message"]
    driver.succeed(one)
    driver.succeed(two)
    assert driver.status(parent.id) == "succeeded"
    step = client.delete(f"/api/v1/jobs/{one}", headers=alice.bearer)
    assert step.status_code == 409 and "step of workflow" in step.json["error"]["message"]
    driver.submit(alice.user.owner_id)  # someone else holds the newest live-feed entry
    r = client.delete(f"/api/v1/jobs/{parent.id}", headers=alice.bearer)
    assert r.status_code == 200 and r.json["deleted"][0] == parent.id
    assert set(r.json["deleted"]) == {parent.id, one, two}
    assert all(client.get(f"/api/v1/jobs/{i}", headers=alice.bearer).status_code == 404 for i in (parent.id, one, two))


def test_a_retried_job_is_deleted_after_its_retry(client, alice, driver):  # type: ignore[no-untyped-def]
    first = driver.submit(alice.user.owner_id).id
    driver.fail(first)
    retry = client.post(f"/api/v1/jobs/{first}/retry", headers=alice.bearer).json["id"]
    client.post(f"/api/v1/jobs/{retry}/cancel", headers=alice.bearer)
    driver.submit(alice.user.owner_id)
    held = client.delete(f"/api/v1/jobs/{first}", headers=alice.bearer)
    assert held.status_code == 409 and retry in held.json["error"]["message"]
    assert client.delete(f"/api/v1/jobs/{retry}", headers=alice.bearer).status_code == 200
    assert client.delete(f"/api/v1/jobs/{first}", headers=alice.bearer).status_code == 200


def test_the_newest_live_feed_entry_waits(client, alice, driver):  # type: ignore[no-untyped-def]
    job = driver.submit(alice.user.owner_id).id
    driver.succeed(job)
    held = client.delete(f"/api/v1/jobs/{job}", headers=alice.bearer)
    assert held.status_code == 409 and "newest entry" in held.json["error"]["message"]
    driver.submit(alice.user.owner_id)
    assert client.delete(f"/api/v1/jobs/{job}", headers=alice.bearer).status_code == 200


def test_search_terms_with_a_nul_are_answered(client, alice, driver):  # type: ignore[no-untyped-def]
    parent = _workflow(driver, alice.user.owner_id)
    for body in ({"parent": parent.id, "q": "Y,\x95\x00\xb9Y"}, {"q": "\x00"}, {"q": "fir\x00st"}):
        r = client.post("/api/v1/jobs/bulk/cancel", json={"filter": body, "dry_run": True}, headers=alice.bearer)
        assert r.status_code == 200, (body, r.json)
    assert (
        client.get("/api/v1/jobs", query_string={"parent": parent.id, "q": "fir\x00st"}, headers=alice.bearer).json[
            "items"
        ][0]["summary"]
        == "first"
    )


def test_qualifiers_and_the_filters_beside_them_all_hold(client, alice, driver):  # type: ignore[no-untyped-def]
    queued = driver.submit(alice.user.owner_id, payload={"text": "a"}).id
    failed = driver.submit(alice.user.owner_id, payload={"text": "b"}).id
    driver.fail(failed)

    def ids(**params: object) -> list[str]:
        r = client.get("/api/v1/jobs", query_string=params, headers=alice.bearer)
        assert r.status_code == 200, r.json
        return [j["id"] for j in r.json["items"]]

    # status= and status: both given: the statuses in both lists
    assert ids(status=["failed", "queued"], q="status:failed") == [failed]
    assert ids(kind="echo", q="kind:echo status:queued") == [queued]
    for params in ({"status": "queued", "q": "status:failed"}, {"kind": "echo", "q": "kind:sleep"}):
        r = client.get("/api/v1/jobs", query_string=params, headers=alice.bearer)
        assert r.status_code == 400 and r.json["error"]["code"] == "invalid_search", params
