from __future__ import annotations

from .conftest import login


def test_smoke(client, alice):  # type: ignore[no-untyped-def]
    assert client.get("/api/health/live").status_code == 200
    r = client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "hi"}}, headers=alice.bearer)
    assert r.status_code == 201, r.json
    r = client.get("/api/v1/jobs", headers=alice.bearer)
    assert r.status_code == 200, r.json
    r = client.get("/api/openapi.json", headers=alice.bearer)
    assert r.status_code == 200
    print(sorted(r.json["paths"]))


def test_ui_smoke(client, alice, root, driver):  # type: ignore[no-untyped-def]
    r = client.get("/jobs")
    assert r.status_code == 302 and "/login" in r.headers["Location"]
    token = login(client, alice)
    job = driver.submit(alice.user.owner_id, payload={"text": "x"})
    for path in [
        "/jobs",
        f"/jobs/{job.id}",
        f"/jobs/{job.id}/panel",
        f"/jobs/{job.id}/row",
        "/submit",
        "/submit/echo",
        "/tokens",
    ]:
        r = client.get(path)
        assert r.status_code == 200, (path, r.data[:500])
    assert client.get("/ops").status_code == 403
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302
    assert client.get("/jobs").status_code == 302
    login(client, root)
    for path in ["/ops", "/ops/queues", "/ops/dead", "/ops/workers", "/ops/schedules"]:
        r = client.get(path)
        assert r.status_code == 200, (path, r.data[:500])
