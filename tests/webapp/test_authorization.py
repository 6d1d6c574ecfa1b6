"""Authorization, probed systematically over the app's URL map.

- Without credentials nothing works except ``/api/health/live`` (and the login page itself).
- User B asking for user A's job gets exactly what a missing job gets: a 404 with the same body.
- Users get 403 from every operator endpoint, API and UI.
"""

from __future__ import annotations

import pytest

from .conftest import login, without_csrf_token

PUBLIC = {"health.live", "auth.login", "static"}
JOB_API = [
    ("GET", "/api/v1/jobs/{id}"),
    ("POST", "/api/v1/jobs/{id}/cancel"),
    ("POST", "/api/v1/jobs/{id}/retry"),
    ("GET", "/api/v1/jobs/{id}/events"),
    ("GET", "/api/v1/jobs/{id}/events?after=0"),
    ("GET", "/api/v1/jobs/{id}/files/out.txt"),
]
JOB_UI = [
    ("GET", "/jobs/{id}"),
    ("GET", "/jobs/{id}/panel"),
    ("GET", "/jobs/{id}/row"),
    ("POST", "/jobs/{id}/cancel"),
    ("POST", "/jobs/{id}/retry"),
    ("GET", "/jobs/{id}/files/out.txt"),
]


def _concrete(rule) -> str:  # type: ignore[no-untyped-def]
    path = rule.rule
    for arg in rule.arguments:
        path = path.replace(f"<{arg}>", "x1").replace(f"<int:{arg}>", "1").replace(f"<path:{arg}>", "x1")
    return path


def test_nothing_works_without_auth(app, client):  # type: ignore[no-untyped-def]
    probed = 0
    for rule in app.url_map.iter_rules():
        if rule.endpoint in PUBLIC or rule.endpoint.startswith("static"):
            continue
        path = _concrete(rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            if rule.websocket:
                continue  # the WebSocket route: tested against a live server in test_live.py
            r = client.open(path, method=method)
            probed += 1
            if path.startswith("/api/") or path == "/metrics":
                assert r.status_code == 401, (method, path, r.status_code)
                assert r.json["error"]["code"] == "unauthorized"
            elif method == "POST":
                # UI forms: the CSRF check refuses the request before the login check can (400), or login does
                assert r.status_code == 400 or "/login" in r.headers.get("Location", ""), (method, path)
            else:
                assert r.status_code == 302 and "/login" in r.headers["Location"], (method, path, r.status_code)
    assert probed > 40
    assert client.get("/api/health/live").status_code == 200


@pytest.mark.parametrize("method,template", JOB_API)
def test_api_foreign_job_is_indistinguishable_from_missing(client, alice, bob, driver, method, template):  # type: ignore[no-untyped-def]
    job = client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "a"}}, headers=alice.bearer).json
    driver.fail(job["id"])
    foreign = client.open(template.format(id=job["id"]), method=method, headers=bob.bearer)
    missing = client.open(template.format(id="f" * 32), method=method, headers=bob.bearer)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.get_data() == missing.get_data()
    assert driver.status(job["id"]) == "failed"  # nothing happened to it
    assert driver.count() == 1  # no retry was created
    own = client.open(template.format(id=job["id"]), method=method, headers=alice.bearer)
    assert own.status_code in (200, 201, 409) or "/files/" in template  # no such file: 404 for the owner too


def test_list_and_bulk_never_reach_foreign_jobs(client, alice, bob, driver):  # type: ignore[no-untyped-def]
    a = client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "a"}}, headers=alice.bearer).json["id"]
    assert client.get("/api/v1/jobs", headers=bob.bearer).json["items"] == []
    assert client.get(f"/api/v1/jobs?q={a}", headers=bob.bearer).json["items"] == []
    r = client.post("/api/v1/jobs/bulk/cancel", json={"filter": {}}, headers=bob.bearer).json
    assert r["matched"] == 0 and driver.status(a) == "queued"


@pytest.mark.parametrize("method,template", JOB_UI)
def test_ui_foreign_job_is_indistinguishable_from_missing(client, alice, bob, driver, method, template):  # type: ignore[no-untyped-def]
    job = driver.submit(alice.user.owner_id, payload={"text": "a"})
    token = login(client, bob)
    data = {"csrf_token": token} if method == "POST" else None
    foreign = client.open(template.format(id=job.id), method=method, data=data)
    missing = client.open(template.format(id="f" * 32), method=method, data=data)
    assert foreign.status_code == missing.status_code == 404
    assert without_csrf_token(foreign.get_data()) == without_csrf_token(missing.get_data())
    assert driver.status(job.id) == "queued"


OPS_API = [
    ("GET", "/api/v1/queues"),
    ("GET", "/api/v1/admission"),
    ("POST", "/api/v1/queues/default/pause"),
    ("POST", "/api/v1/queues/default/resume"),
    ("GET", "/api/v1/dead"),
    ("POST", "/api/v1/dead/replay"),
    ("POST", "/api/v1/dead/purge"),
    ("POST", "/api/v1/jobs/x/run-now"),
    ("POST", "/api/v1/dead/bulk/replay"),
    ("POST", "/api/v1/dead/bulk/purge"),
    ("GET", "/api/v1/workers"),
    ("GET", "/api/v1/workers/slots"),
    ("GET", "/api/v1/schedules"),
    ("POST", "/api/v1/schedules/x/run"),
    ("POST", "/api/v1/schedules/x/pause"),
    ("POST", "/api/v1/schedules/x/resume"),
    ("GET", "/api/v1/activity"),
    ("GET", "/api/v1/workers/unclean-exits"),
    ("POST", "/api/v1/workers/unclean-exits/acknowledge"),
]
#: Request bodies of the probes that take something other than ``{"queue": "default"}``.
OPS_API_BODIES = {
    **{path: {"filter": {}, "dry_run": True} for path in ("/api/v1/dead/bulk/replay", "/api/v1/dead/bulk/purge")},
    "/api/v1/workers/unclean-exits/acknowledge": {"owners": ["nobody"]},
}
OPS_UI = ["/ops", "/ops/queues", "/ops/dead", "/ops/dead/bulk?action=purge", "/ops/workers", "/ops/schedules"]
OPS_UI_POST = [
    "/ops/queues/default/pause",
    "/ops/dead/replay",
    "/ops/dead/bulk",
    "/ops/schedules/x/run",
    "/ops/schedules/x/pause",
    "/ops/workers/unclean-exits/acknowledge",
]


def test_users_get_403_from_operator_endpoints(app, client, alice, root):  # type: ignore[no-untyped-def]
    documented = {rule.rule for rule in app.url_map.iter_rules() if rule.endpoint.startswith("ops_api.")}
    assert len(documented) == len({t for _, t in OPS_API}), "a new operator endpoint needs a probe here"
    for method, path in OPS_API:
        body = OPS_API_BODIES.get(path, {"queue": "default"})
        r = client.open(path, method=method, json=body, headers=alice.bearer)
        assert r.status_code == 403 and r.json["error"]["code"] == "forbidden", (method, path)
        assert client.open(path, method=method, json=body, headers=root.bearer).status_code in (
            200,
            201,
            404,
        )
    token = login(client, alice)
    for path in OPS_UI:
        assert client.get(path).status_code == 403, path
    for path in OPS_UI_POST:
        assert client.post(path, data={"csrf_token": token, "queue": "default"}).status_code == 403, path
