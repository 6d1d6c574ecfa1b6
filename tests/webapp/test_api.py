"""The JSON API: submit/list/get/cancel/retry/events/bulk, operators' endpoints, errors, health."""

from __future__ import annotations

import pytest

from .conftest import login, newest_first


def _submit(client, person, payload=None, key=None, kind="echo", **extra):  # type: ignore[no-untyped-def]
    headers = dict(person.bearer)
    if key:
        headers["Idempotency-Key"] = key
    body = {"kind": kind, "payload": payload if payload is not None else {"text": "hi"}, **extra}
    return client.post("/api/v1/jobs", json=body, headers=headers)


def _wait_for(fetch, timeout_s: float = 5.0):  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = fetch()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def test_submit_idempotency_201_200_409(client, alice, bob):  # type: ignore[no-untyped-def]
    first = _submit(client, alice, key="k1")
    assert first.status_code == 201 and first.headers["Location"].endswith(first.json["id"])
    again = _submit(client, alice, key="k1")
    assert again.status_code == 200 and again.json["id"] == first.json["id"]
    conflict = _submit(client, alice, payload={"text": "other"}, key="k1")
    assert conflict.status_code == 409 and conflict.json["error"]["code"] == "conflict"
    other_owner = _submit(client, bob, key="k1")
    assert other_owner.status_code == 201 and other_owner.json["id"] != first.json["id"]


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "nope", "payload": {}},
        {"kind": "echo", "payload": {}},
        {"kind": "echo", "payload": {"text": "x"}, "priority": 1.5},
        {"kind": "echo", "payload": {"text": "x"}, "priority": "1"},
        {"kind": "echo", "payload": {"text": "x"}, "delay_s": -1},
        {"kind": "echo", "payload": [1, 2]},
        {"kind": "", "payload": {}},
        {"payload": {}},
        {"kind": "echo", "surprise": 1},
        [],
        "text",
    ],
)
def test_submit_rejects_bad_input_with_422(client, alice, body):  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/jobs", json=body, headers=alice.bearer)
    assert r.status_code == 422, r.json
    assert set(r.json["error"]) >= {"code", "message"}


def test_malformed_json_is_4xx_json(client, alice):  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/jobs", data="{not json", headers={**alice.bearer, "Content-Type": "application/json"})
    assert 400 <= r.status_code < 500 and "error" in r.json


def test_get_list_filters_and_cursor(client, alice, driver):  # type: ignore[no-untyped-def]
    ids = newest_first(driver, [_submit(client, alice, payload={"text": str(i)}).json["id"] for i in range(5)])
    driver.fail(ids[-1], "boom: disk full")
    ids = ids[::-1]  # oldest first, as submitted
    page1 = client.get("/api/v1/jobs?limit=2", headers=alice.bearer).json
    assert [j["id"] for j in page1["items"]] == ids[::-1][:2] and page1["next_cursor"]
    page2 = client.get(f"/api/v1/jobs?limit=2&cursor={page1['next_cursor']}", headers=alice.bearer).json
    assert [j["id"] for j in page2["items"]] == ids[::-1][2:4]
    failed = client.get("/api/v1/jobs?status=failed", headers=alice.bearer).json["items"]
    assert [j["id"] for j in failed] == [ids[0]] and failed[0]["can_retry"] and not failed[0]["can_cancel"]
    both = client.get("/api/v1/jobs?status=failed&status=queued", headers=alice.bearer).json["items"]
    assert len(both) == 5
    assert [j["id"] for j in client.get("/api/v1/jobs?q=disk", headers=alice.bearer).json["items"]] == [ids[0]]
    assert client.get("/api/v1/jobs?status=bogus", headers=alice.bearer).status_code == 422
    assert client.get("/api/v1/jobs?owner=1", headers=alice.bearer).status_code == 403
    one = client.get(f"/api/v1/jobs/{ids[1]}", headers=alice.bearer)
    assert one.status_code == 200 and one.json["status"] == "queued" and "payload" not in one.json


def test_admin_sees_all_and_filters_by_owner(client, alice, bob, root):  # type: ignore[no-untyped-def]
    a = _submit(client, alice).json["id"]
    b = _submit(client, bob).json["id"]
    everything = {j["id"] for j in client.get("/api/v1/jobs", headers=root.bearer).json["items"]}
    assert {a, b} <= everything
    only_bob = client.get(f"/api/v1/jobs?owner={bob.user.username}", headers=root.bearer).json["items"]
    assert [j["id"] for j in only_bob] == [b]
    assert client.get(f"/api/v1/jobs/{a}", headers=root.bearer).status_code == 200


def test_cancel_and_retry_answers(client, alice, driver):  # type: ignore[no-untyped-def]
    queued = _submit(client, alice).json["id"]
    r = client.post(f"/api/v1/jobs/{queued}/cancel", headers=alice.bearer)
    assert r.status_code == 200 and r.json["outcome"] == "cancelled" and r.json["job"]["status"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{queued}/cancel", headers=alice.bearer)
    assert again.status_code == 409
    running = _submit(client, alice).json["id"]
    driver.start(running)
    r = client.post(f"/api/v1/jobs/{running}/cancel", headers=alice.bearer)
    assert r.json["outcome"] == "cancel_requested" and not r.json["job"]["can_cancel"]
    assert client.post(f"/api/v1/jobs/{running}/retry", headers=alice.bearer).status_code == 409
    r = client.post(f"/api/v1/jobs/{queued}/retry", headers=alice.bearer)
    assert r.status_code == 201 and r.json["retry_of_job_id"] == queued and r.json["status"] == "queued"


def test_events_after_cursor(client, alice, driver):  # type: ignore[no-untyped-def]
    job = _submit(client, alice).json["id"]
    driver.start(job)
    driver.event(job, "half_way", fraction=0.5)
    page = client.get(f"/api/v1/jobs/{job}/events", headers=alice.bearer).json
    assert [e["sequence"] for e in page["items"]] == [1, 2, 3] and page["next_after"] == 3
    rest = client.get(f"/api/v1/jobs/{job}/events?after=2", headers=alice.bearer).json
    assert [e["sequence"] for e in rest["items"]] == [3]


def test_bulk_dry_run_then_cancel(client, alice, bob, driver):  # type: ignore[no-untyped-def]
    mine = [_submit(client, alice).json["id"] for _ in range(3)]
    theirs = _submit(client, bob).json["id"]
    driver.succeed(mine[0])
    body = {"filter": {"status": ["queued", "succeeded"]}, "dry_run": True}
    dry = client.post("/api/v1/jobs/bulk/cancel", json=body, headers=alice.bearer).json
    assert dry == {"dry_run": True, "matched": 3, "affected": 2, "skipped": 1, "job_ids": dry["job_ids"]}
    assert driver.status(mine[1]) == "queued"
    done = client.post("/api/v1/jobs/bulk/cancel", json={**body, "dry_run": False}, headers=alice.bearer).json
    assert done["affected"] == 2 and set(done["job_ids"]) == set(mine[1:])
    assert driver.status(theirs) == "queued"
    retried = client.post("/api/v1/jobs/bulk/retry", json={"filter": {"status": ["cancelled"]}}, headers=alice.bearer)
    assert retried.json["affected"] == 2


@pytest.mark.parametrize("action", ["cancel", "retry"])
@pytest.mark.parametrize(
    "request_kwargs", [{}, {"json": {}}, {"json": {"dry_run": False}}], ids=["no body", "{}", "no filter"]
)
def test_bulk_without_a_filter_is_refused_and_changes_nothing(client, alice, driver, action, request_kwargs):  # type: ignore[no-untyped-def]
    job = _submit(client, alice).json["id"]
    driver.fail(job)
    queued = _submit(client, alice).json["id"]
    r = client.post(f"/api/v1/jobs/bulk/{action}", headers=alice.bearer, **request_kwargs)
    assert r.status_code == 422, r.get_data(as_text=True)
    assert "filter" in r.get_data(as_text=True)
    assert driver.status(job) == "failed" and driver.status(queued) == "queued"
    assert driver.count() == 2  # no retry created


@pytest.mark.parametrize("dry_run", [0, 1, "no", "true", None])
def test_bulk_dry_run_must_be_a_json_boolean(client, alice, driver, dry_run):  # type: ignore[no-untyped-def]
    queued = _submit(client, alice).json["id"]
    body = {"filter": {}, "dry_run": dry_run}
    r = client.post("/api/v1/jobs/bulk/cancel", json=body, headers=alice.bearer)
    assert r.status_code == 422 and "dry_run" in r.get_data(as_text=True)
    assert driver.status(queued) == "queued"


def test_operator_endpoints(client, root, web_broker):  # type: ignore[no-untyped-def]
    import dramatiq

    web_broker.enqueue(dramatiq.Message(queue_name="default", actor_name="a", args=(), kwargs={}, options={}))
    queues = client.get("/api/v1/queues", headers=root.bearer)
    assert queues.status_code == 200 and any(q["queue"] == "default" for q in queues.json)
    assert client.post("/api/v1/queues/default/pause", headers=root.bearer).json == {"queue": "default", "paused": True}
    assert next(q for q in client.get("/api/v1/queues", headers=root.bearer).json if q["queue"] == "default")["paused"]
    assert client.post("/api/v1/queues/default/resume", headers=root.bearer).json["paused"] is False
    assert client.post("/api/v1/queues/nope/pause", headers=root.bearer).status_code == 404
    # a dead letter: deliver the message and nack it
    consumer = web_broker.consume("default", prefetch=1, timeout=1000)
    message = next(iter(consumer))
    consumer.nack(message)
    consumer.close()
    dead = _wait_for(lambda: client.get("/api/v1/dead", headers=root.bearer).json)  # nacks are group-committed
    assert len(dead) == 1 and dead[0]["queue"] == "default"
    replay = client.post("/api/v1/dead/replay", json={"queue": "default", "ids": [dead[0]["id"]]}, headers=root.bearer)
    assert replay.json == {"replayed": 1} and client.get("/api/v1/dead", headers=root.bearer).json == []
    assert client.get("/api/v1/workers", headers=root.bearer).status_code == 200
    assert client.get("/api/v1/schedules", headers=root.bearer).json == []
    assert client.get("/api/v1/activity", headers=root.bearer).status_code == 200


def test_health(client, app, alice, root, tmp_path):  # type: ignore[no-untyped-def]
    assert client.get("/api/health/live").json["status"] == "ok"
    assert client.get("/api/health/ready").status_code == 401
    ready = client.get("/api/health/ready", headers=root.bearer)
    assert ready.status_code == 200, ready.json
    assert set(ready.json["components"]) == {"database", "broker", "output_dir", "output_roots", "unclean_exits"}
    assert "detail" not in client.get("/api/health/ready", headers=alice.bearer).json["components"]["broker"]
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    app.extensions["tenure"].output_root = blocked / "sub"
    failing = client.get("/api/health/ready", headers=root.bearer)
    assert failing.status_code == 503 and failing.json["components"]["output_dir"]["status"] == "fail"


def test_auth_schemes_and_errors(client, alice):  # type: ignore[no-untyped-def]
    assert client.get("/api/v1/jobs", headers=alice.basic).status_code == 200
    for header in ("Bearer tnr_wrong", "Bearer ", "Basic !!!", "Basic " + "YWxpY2U6d3Jvbmc=", "Token abc"):
        r = client.get("/api/v1/jobs", headers={"Authorization": header})
        assert r.status_code == 401 and r.json["error"]["code"] == "unauthorized", header
        assert "tnr_wrong" not in r.get_data(as_text=True)
    assert client.get("/api/v1/jobs?access_token=" + alice.token).status_code == 401  # never from the URL


def test_session_api_calls_need_csrf(client, alice):  # type: ignore[no-untyped-def]
    token = login(client, alice)
    assert client.get("/api/v1/jobs").status_code == 200
    body = {"kind": "echo", "payload": {"text": "x"}}
    assert client.post("/api/v1/jobs", json=body).status_code == 403
    assert client.post("/api/v1/jobs", json=body, headers={"X-CSRFToken": token}).status_code == 201


def test_405_has_allow_header_and_json(client, alice):  # type: ignore[no-untyped-def]
    r = client.delete("/api/v1/jobs", headers=alice.bearer)
    assert r.status_code == 405 and "POST" in r.headers["Allow"] and r.json["error"]["code"] == "method_not_allowed"


def test_openapi_document(client, alice):  # type: ignore[no-untyped-def]
    assert client.get("/api/openapi.json").status_code == 401
    doc = client.get("/api/openapi.json", headers=alice.bearer).json
    assert doc["openapi"].startswith("3.1")
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}/cancel", "/api/v1/queues", "/api/health/ready"} <= set(doc["paths"])


def test_metrics_needs_auth_unless_public(app, client, root, alice):  # type: ignore[no-untyped-def]
    assert client.get("/metrics").status_code == 401
    r = client.get("/metrics", headers=root.bearer)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    assert b"tenure_collector_source_up" in r.data
    # Counts across every owner: a plain user gets 403 with the reason, by token, password or session
    for headers in (alice.bearer, alice.basic):
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 403 and refused.json["error"] == {
            "code": "forbidden",
            "message": "This needs the metrics.read permission.",
        }
    assert client.get("/metrics", headers=root.basic).status_code == 200
    login(client, alice)
    assert client.get("/metrics").status_code == 403
    app.config["METRICS_PUBLIC"] = True
    assert client.get("/metrics").status_code == 200


def test_download_a_produced_file(client, alice, driver, tmp_path):  # type: ignore[no-untyped-def]
    job = _submit(client, alice).json["id"]
    driver.write_file(job, "1-report.txt", b"done")
    r = client.get(f"/api/v1/jobs/{job}/files/1-report.txt", headers=alice.bearer)
    assert r.status_code == 200 and r.data == b"done" and "attachment" in r.headers["Content-Disposition"]
    assert client.get(f"/api/v1/jobs/{job}/files/nope", headers=alice.bearer).status_code == 404
