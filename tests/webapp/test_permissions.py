"""The permission probe: every route of the app's URL map × every built-in role and a scoped token.

Each route's probe names the actions it needs and makes fresh objects for the caller (their own job in
the state the action wants, a dead letter, a token…), so an allowed call must SUCCEED (2xx; a UI action
must land on a page without an error message) and a refused one must answer 403 before touching
anything. A route without a probe fails the test (:func:`test_every_route_has_a_probe`), and so does a
route whose declared permission is not the one its probe expects. Then: the OpenAPI document names each
operation's permission, tokens carry subsets that a role change narrows at once, and role management
keeps its invariants.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import accounts
from webapp.api import view_permission

from .world import SCHEDULE, Caller, World, unique

CALLERS = ("viewer", "user", "operator", "admin", "scoped")
UI_CALLERS = ("viewer", "user", "operator", "admin")
#: Routes that need no credentials at all (the login form, logging out, static files).
PUBLIC_ENDPOINTS = {"auth.login", "auth.logout", "static"}
#: The live feed's routes: checked before the upgrade by ``webapp.live._admit`` (the WebSocket's handshake is
#: that same check; probed here through the SSE transport, which the test client can open).
LIVE_ENDPOINTS = {"live.live_sse": "jobs.read_own", "live.live_ws": "jobs.read_own"}


@dataclass
class Call:
    path: str
    json: Any = None
    data: dict[str, Any] | None = None
    ok: tuple[int, ...] = (200,)
    files: bool = False


@dataclass
class Probe:
    needs: tuple[str, ...]
    make: Callable[[World, Caller], Call]
    ui: bool = False
    #: Routes whose body streams (read the status, then close).
    stream: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _get(path: str, ok: tuple[int, ...] = (200,)) -> Callable[[World, Caller], Call]:
    return lambda w, c: Call(path, ok=ok)


def _file_job(w: World, c: Caller) -> str:
    job = w.job(c, "succeeded")
    w.driver.write_file(job, "out.txt", b"done")
    w.driver.write_file(job, "pic.png", b"\x89PNG\r\n\x1a\n")
    return job


def _spare_user(w: World) -> str:
    return accounts.create_user(w.engine, unique("spare"), role="user")[0].username


def _custom_role(w: World) -> str:
    return accounts.create_role(w.engine, unique("custom"), "", ["jobs.read_own"]).name


def _revision(w: World) -> int:
    from settings.runtime import get_settings

    return int(get_settings(w.engine, w.driver.settings)["revision"])


def _own_token(w: World, c: Caller) -> int:
    return accounts.create_token(w.engine, c.user.id, "to revoke", ["jobs.read_own"] if c.may("jobs.read_own") else [])[
        0
    ].id


API: dict[tuple[str, str], Probe] = {
    ("GET", "/api/health/ready"): Probe(("authenticated",), _get("/api/health/ready", (200, 503))),
    ("GET", "/api/openapi.json"): Probe(("authenticated",), _get("/api/openapi.json")),
    ("GET", "/api/v1/me"): Probe(("authenticated",), _get("/api/v1/me")),
    ("GET", "/api/v1/permissions"): Probe(("authenticated",), _get("/api/v1/permissions")),
    ("GET", "/api/v1/kinds"): Probe(("jobs.read_own",), _get("/api/v1/kinds")),
    ("GET", "/api/v1/jobs"): Probe(("jobs.read_own",), _get("/api/v1/jobs")),
    ("POST", "/api/v1/jobs"): Probe(
        ("jobs.submit",), lambda w, c: Call("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "p"}}, ok=(201,))
    ),
    ("GET", "/api/v1/jobs/<job_id>"): Probe(("jobs.read_own",), lambda w, c: Call(f"/api/v1/jobs/{w.job(c)}")),
    ("DELETE", "/api/v1/jobs/<job_id>"): Probe(
        ("jobs.cancel",), lambda w, c: Call(f"/api/v1/jobs/{w.job(c, 'succeeded')}")
    ),
    ("GET", "/api/v1/jobs/<job_id>/attempts"): Probe(
        ("jobs.read_own",), lambda w, c: Call(f"/api/v1/jobs/{w.job(c, 'failed')}/attempts")
    ),
    ("POST", "/api/v1/jobs/<job_id>/cancel"): Probe(
        ("jobs.cancel",), lambda w, c: Call(f"/api/v1/jobs/{w.job(c)}/cancel")
    ),
    ("GET", "/api/v1/jobs/<job_id>/events"): Probe(
        ("jobs.read_own",), lambda w, c: Call(f"/api/v1/jobs/{w.job(c)}/events")
    ),
    ("GET", "/api/v1/jobs/<job_id>/files/<name>"): Probe(
        ("jobs.read_own",), lambda w, c: Call(f"/api/v1/jobs/{_file_job(w, c)}/files/out.txt")
    ),
    ("POST", "/api/v1/jobs/<job_id>/retry"): Probe(
        ("jobs.retry",), lambda w, c: Call(f"/api/v1/jobs/{w.job(c, 'failed')}/retry", ok=(201,))
    ),
    ("POST", "/api/v1/jobs/<job_id>/run-now"): Probe(
        ("queues.pause",), lambda w, c: Call(f"/api/v1/jobs/{w.job(c, 'delayed')}/run-now")
    ),
    ("POST", "/api/v1/jobs/bulk/cancel"): Probe(
        ("jobs.bulk", "jobs.cancel"),
        lambda w, c: Call("/api/v1/jobs/bulk/cancel", json={"filter": {"kind": "echo"}}),
    ),
    ("POST", "/api/v1/jobs/bulk/retry"): Probe(
        ("jobs.bulk", "jobs.retry"),
        lambda w, c: Call("/api/v1/jobs/bulk/retry", json={"filter": {"kind": "echo"}}),
    ),
    ("POST", "/api/v1/uploads"): Probe(
        ("jobs.submit",),
        lambda w, c: Call(
            "/api/v1/uploads",
            data={"files": [(io.BytesIO(b"FLV\x01\x05" + bytes(11)), "s.flv")]},
            ok=(201,),
            files=True,
        ),
    ),
    ("GET", "/api/v1/activity"): Probe(("metrics.read",), _get("/api/v1/activity")),
    ("GET", "/api/v1/queues"): Probe(("metrics.read",), _get("/api/v1/queues")),
    ("GET", "/api/v1/admission"): Probe(("metrics.read",), _get("/api/v1/admission")),
    ("POST", "/api/v1/queues/<name>/pause"): Probe(("queues.pause",), _get("/api/v1/queues/default/pause")),
    ("POST", "/api/v1/queues/<name>/resume"): Probe(("queues.pause",), _get("/api/v1/queues/default/resume")),
    ("GET", "/api/v1/dead"): Probe(("metrics.read",), _get("/api/v1/dead")),
    ("POST", "/api/v1/dead/replay"): Probe(
        ("dead_letters.manage",),
        lambda w, c: Call("/api/v1/dead/replay", json={"queue": "default", "ids": [w.dead_letter()]}),
    ),
    ("POST", "/api/v1/dead/purge"): Probe(
        ("dead_letters.manage",),
        lambda w, c: Call("/api/v1/dead/purge", json={"queue": "default", "ids": [w.dead_letter()]}),
    ),
    ("POST", "/api/v1/dead/bulk/replay"): Probe(
        ("dead_letters.manage",),
        lambda w, c: Call(
            "/api/v1/dead/bulk/replay", json={"filter": {"queue": "default"}, "through_id": w.dead_letter()}
        ),
    ),
    ("POST", "/api/v1/dead/bulk/purge"): Probe(
        ("dead_letters.manage",),
        lambda w, c: Call(
            "/api/v1/dead/bulk/purge", json={"filter": {"queue": "default"}, "through_id": w.dead_letter()}
        ),
    ),
    ("GET", "/api/v1/workers"): Probe(("metrics.read",), _get("/api/v1/workers")),
    ("GET", "/api/v1/workers/slots"): Probe(("metrics.read",), _get("/api/v1/workers/slots")),
    ("GET", "/api/v1/workers/unclean-exits"): Probe(("metrics.read",), _get("/api/v1/workers/unclean-exits")),
    ("POST", "/api/v1/workers/unclean-exits/acknowledge"): Probe(
        ("queues.pause",),
        lambda w, c: Call("/api/v1/workers/unclean-exits/acknowledge", json={"owners": [w.unclean_exit()]}),
    ),
    ("GET", "/api/v1/schedules"): Probe(("metrics.read",), _get("/api/v1/schedules")),
    ("POST", "/api/v1/schedules/<name>/run"): Probe(
        ("schedules.manage",), _get(f"/api/v1/schedules/{SCHEDULE}/run", (201,))
    ),
    ("POST", "/api/v1/schedules/<name>/pause"): Probe(
        ("schedules.manage",), _get(f"/api/v1/schedules/{SCHEDULE}/pause")
    ),
    ("POST", "/api/v1/schedules/<name>/resume"): Probe(
        ("schedules.manage",), _get(f"/api/v1/schedules/{SCHEDULE}/resume")
    ),
    ("GET", "/api/v1/settings"): Probe(("settings.change",), _get("/api/v1/settings")),
    ("PUT", "/api/v1/settings"): Probe(
        ("settings.change",),
        lambda w, c: Call("/api/v1/settings", json={"expected_revision": _revision(w), "values": {}}),
    ),
    ("GET", "/api/v1/tokens"): Probe(("tokens.manage_own",), _get("/api/v1/tokens")),
    ("POST", "/api/v1/tokens"): Probe(
        ("tokens.manage_own",), lambda w, c: Call("/api/v1/tokens", json={"name": "probe"}, ok=(201,))
    ),
    ("DELETE", "/api/v1/tokens/<int:token_id>"): Probe(
        ("tokens.manage_own",), lambda w, c: Call(f"/api/v1/tokens/{_own_token(w, c)}")
    ),
    ("GET", "/api/v1/users"): Probe(("users.manage",), _get("/api/v1/users")),
    ("POST", "/api/v1/users"): Probe(
        ("users.manage",),
        lambda w, c: Call("/api/v1/users", json={"name": unique("new"), "password": "a long password"}, ok=(201,)),
    ),
    ("PATCH", "/api/v1/users/<name>"): Probe(
        ("users.manage",), lambda w, c: Call(f"/api/v1/users/{_spare_user(w)}", json={"role": "viewer"})
    ),
    ("PUT", "/api/v1/users/<name>/password"): Probe(
        ("users.manage",),
        lambda w, c: Call(f"/api/v1/users/{_spare_user(w)}/password", json={"password": "another long one"}, ok=(204,)),
    ),
    ("GET", "/api/v1/roles"): Probe(("users.manage",), _get("/api/v1/roles")),
    ("POST", "/api/v1/roles"): Probe(
        ("users.manage",),
        lambda w, c: Call("/api/v1/roles", json={"name": unique("r"), "permissions": ["jobs.read_own"]}, ok=(201,)),
    ),
    ("PUT", "/api/v1/roles/<name>"): Probe(
        ("users.manage",), lambda w, c: Call(f"/api/v1/roles/{_custom_role(w)}", json={"permissions": ["metrics.read"]})
    ),
    ("DELETE", "/api/v1/roles/<name>"): Probe(("users.manage",), lambda w, c: Call(f"/api/v1/roles/{_custom_role(w)}")),
    ("GET", "/api/v1/audit"): Probe(("audit.read",), _get("/api/v1/audit")),
    ("GET", "/api/v1/audit/export"): Probe(("audit.read",), _get("/api/v1/audit/export")),
    ("GET", "/metrics"): Probe(("metrics.read",), _get("/metrics")),
    ("GET", "/api/v1/live.sse"): Probe(("jobs.read_own",), _get("/api/v1/live.sse"), stream=True),
}


def _form(**values: Any) -> Callable[[World, Caller], Call]:
    return lambda w, c: Call("", data=values)


UI: dict[tuple[str, str], Probe] = {
    ("GET", "/"): Probe(("jobs.read_own",), _get("/")),
    ("GET", "/jobs"): Probe(("jobs.read_own",), _get("/jobs")),
    ("GET", "/jobs/<job_id>"): Probe(("jobs.read_own",), lambda w, c: Call(f"/jobs/{w.job(c)}")),
    ("GET", "/jobs/<job_id>/panel"): Probe(("jobs.read_own",), lambda w, c: Call(f"/jobs/{w.job(c)}/panel")),
    ("GET", "/jobs/<job_id>/row"): Probe(("jobs.read_own",), lambda w, c: Call(f"/jobs/{w.job(c)}/row")),
    ("GET", "/jobs/<job_id>/workflow"): Probe(("jobs.read_own",), lambda w, c: Call(f"/jobs/{w.job(c)}/workflow")),
    ("GET", "/jobs/<job_id>/files/<path:name>"): Probe(
        ("jobs.read_own",), lambda w, c: Call(f"/jobs/{_file_job(w, c)}/files/out.txt")
    ),
    ("GET", "/jobs/<job_id>/media/<path:name>"): Probe(
        ("jobs.read_own",), lambda w, c: Call(f"/jobs/{_file_job(w, c)}/media/pic.png")
    ),
    ("POST", "/jobs/<job_id>/cancel"): Probe(("jobs.cancel",), lambda w, c: Call(f"/jobs/{w.job(c)}/cancel", data={})),
    ("POST", "/jobs/<job_id>/retry"): Probe(
        ("jobs.retry",), lambda w, c: Call(f"/jobs/{w.job(c, 'failed')}/retry", data={})
    ),
    ("POST", "/jobs/<job_id>/delete"): Probe(
        ("jobs.cancel",), lambda w, c: Call(f"/jobs/{w.job(c, 'succeeded')}/delete", data={})
    ),
    ("POST", "/jobs/bulk"): Probe(
        ("jobs.bulk", "jobs.cancel"), lambda w, c: Call("/jobs/bulk", data={"action": "cancel", "ids": [w.job(c)]})
    ),
    ("GET", "/jobs/bulk-by-filter"): Probe(("jobs.bulk", "jobs.cancel"), _get("/jobs/bulk-by-filter?action=cancel")),
    ("POST", "/jobs/bulk-by-filter"): Probe(
        ("jobs.bulk", "jobs.cancel"),
        lambda w, c: Call("/jobs/bulk-by-filter", data={"action": "cancel", "kind": "echo"}),
    ),
    ("GET", "/submit"): Probe(("jobs.submit",), _get("/submit")),
    ("GET", "/submit/<kind_name>"): Probe(("jobs.submit",), _get("/submit/echo")),
    ("POST", "/submit/<kind_name>"): Probe(
        ("jobs.submit",),
        lambda w, c: Call("/submit/echo", data={"p_text": "hi", "p_times": "1", "priority": "0", "delay_s": "0"}),
    ),
    ("GET", "/tokens"): Probe(("tokens.manage_own",), _get("/tokens")),
    ("POST", "/tokens"): Probe(("tokens.manage_own",), lambda w, c: Call("/tokens", data={"name": "ui probe"})),
    ("POST", "/tokens/<int:token_id>/revoke"): Probe(
        ("tokens.manage_own",), lambda w, c: Call(f"/tokens/{_own_token(w, c)}/revoke", data={})
    ),
    ("GET", "/users"): Probe(("users.manage",), _get("/users")),
    ("POST", "/users/new"): Probe(
        ("users.manage",),
        lambda w, c: Call("/users/new", data={"name": unique("ui"), "role": "viewer", "password": "a long password"}),
    ),
    ("POST", "/users/<name>/role"): Probe(
        ("users.manage",), lambda w, c: Call(f"/users/{_spare_user(w)}/role", data={"role": "operator"})
    ),
    ("POST", "/users/<name>/disabled"): Probe(
        ("users.manage",), lambda w, c: Call(f"/users/{_spare_user(w)}/disabled", data={"disabled": "1"})
    ),
    ("POST", "/users/<name>/password"): Probe(
        ("users.manage",), lambda w, c: Call(f"/users/{_spare_user(w)}/password", data={"password": "a long password"})
    ),
    ("POST", "/roles/new"): Probe(
        ("users.manage",),
        lambda w, c: Call("/roles/new", data={"name": unique("ui"), "scoped": "1", "permission": ["jobs.read_own"]}),
    ),
    ("POST", "/roles/<name>/save"): Probe(
        ("users.manage",),
        lambda w, c: Call(f"/roles/{_custom_role(w)}/save", data={"scoped": "1", "permission": ["metrics.read"]}),
    ),
    ("POST", "/roles/<name>/delete"): Probe(
        ("users.manage",), lambda w, c: Call(f"/roles/{_custom_role(w)}/delete", data={})
    ),
    ("GET", "/audit"): Probe(("audit.read",), _get("/audit")),
    ("GET", "/ops"): Probe(("metrics.read",), _get("/ops")),
    ("GET", "/ops/queues"): Probe(("metrics.read",), _get("/ops/queues")),
    ("POST", "/ops/queues/<name>/<action>"): Probe(
        ("queues.pause",), lambda w, c: Call("/ops/queues/default/pause", data={})
    ),
    ("GET", "/ops/dead"): Probe(("metrics.read",), _get("/ops/dead")),
    ("POST", "/ops/dead/replay"): Probe(
        ("dead_letters.manage",),
        lambda w, c: Call("/ops/dead/replay", data={"queue": "default", "ids": w.dead_letter()}),
    ),
    ("GET", "/ops/dead/bulk"): Probe(
        ("dead_letters.manage",), lambda w, c: Call(f"/ops/dead/bulk?action=purge&x={w.dead_letter()}")
    ),
    ("POST", "/ops/dead/bulk"): Probe(
        ("dead_letters.manage",),
        lambda w, c: Call(
            "/ops/dead/bulk", data={"action": "purge", "queue": "default", "through_id": w.dead_letter()}
        ),
    ),
    ("GET", "/ops/workers"): Probe(("metrics.read",), _get("/ops/workers")),
    ("POST", "/ops/workers/unclean-exits/acknowledge"): Probe(
        ("queues.pause",), lambda w, c: Call("/ops/workers/unclean-exits/acknowledge", data={"owner": w.unclean_exit()})
    ),
    ("GET", "/ops/schedules"): Probe(("metrics.read",), _get("/ops/schedules")),
    ("POST", "/ops/schedules/<name>/run"): Probe(
        ("schedules.manage",), lambda w, c: Call(f"/ops/schedules/{SCHEDULE}/run", data={})
    ),
    ("POST", "/ops/schedules/<name>/<action>"): Probe(
        ("schedules.manage",), lambda w, c: Call(f"/ops/schedules/{SCHEDULE}/pause", data={})
    ),
    ("GET", "/ops/settings"): Probe(("settings.change",), _get("/ops/settings")),
    ("POST", "/ops/settings"): Probe(
        ("settings.change",), lambda w, c: Call("/ops/settings", data={"expected_revision": str(_revision(w))})
    ),
}
for probe in UI.values():
    probe.ui = True
PROBES = {**API, **UI}


def _routes(app) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    return sorted(
        (method, rule.rule, rule.endpoint)
        for rule in app.url_map.iter_rules()
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}
    )


def test_every_route_has_a_probe_and_names_its_permission(app) -> None:  # type: ignore[no-untyped-def]
    """A new route without a permission, or without a probe here, fails this test."""
    for method, rule, endpoint in _routes(app):
        if endpoint in PUBLIC_ENDPOINTS or endpoint == "health.live":
            assert endpoint == "health.live" or view_permission(app, endpoint, method) is None
            continue
        if endpoint in LIVE_ENDPOINTS:
            continue
        declared = view_permission(app, endpoint, method)
        assert declared is not None, f"{method} {rule} names no permission"
        assert (method, rule) in PROBES, f"{method} {rule} ({declared}) has no probe"
        assert PROBES[(method, rule)].needs[0] == declared, (method, rule, declared)
    assert view_permission(app, "health.live", "GET") == "public"
    probed = {(m, r) for m, r, _ in _routes(app)}
    assert set(PROBES) <= probed, set(PROBES) - probed


def _call(w: World, caller: Caller, method: str, probe: Probe) -> tuple[int, str]:
    call = probe.make(w, caller)
    if probe.ui:
        client = w.login(caller)
        if method == "GET":
            r = client.get(call.path, follow_redirects=True)
        else:
            r = client.post(call.path, data={**(call.data or {}), "csrf_token": caller.csrf}, follow_redirects=True)
        assert r.request.path != "/login", (method, call.path, "the session was lost")
        return r.status_code, r.get_data().decode(errors="replace")
    client = w.app.test_client()
    kwargs: dict[str, Any] = {"headers": caller.bearer}
    if call.files:
        kwargs.update(data=call.data, content_type="multipart/form-data")
    elif call.json is not None:
        kwargs["json"] = call.json
    elif method != "GET":
        kwargs["json"] = {}
    if probe.stream:
        r = client.open(call.path, method=method, buffered=False, **kwargs)
        status = r.status_code
        r.close()
        return status, ""
    r = client.open(call.path, method=method, **kwargs)
    ok = r.status_code in call.ok
    return (r.status_code if ok or r.status_code == 403 else -r.status_code), r.get_data()[:300].decode(
        errors="replace"
    )


@pytest.mark.slow
def test_probe_every_route_for_every_role_and_a_scoped_token(world: World) -> None:
    refused_before = len(world.audit_rows())
    refusals = 0
    for (method, rule), probe in sorted(PROBES.items()):
        for name in UI_CALLERS if probe.ui else CALLERS:
            caller = world.callers[name]
            status, body = _call(world, caller, method, probe)
            where = (method, rule, name, status, body[:200])
            if caller.may(*probe.needs):
                if probe.ui:
                    assert status == 200 and 'class="flash error"' not in body, where
                    # an action says what it did (a new token shows its secret instead)
                    assert method == "GET" or 'class="flash info"' in body or 'id="new-token"' in body, where
                else:
                    assert status > 0 and status != 403, where
            else:
                refusals += 1
                assert status == 403, where
                if not probe.ui:
                    assert "permission" in body, where
    # Every refusal was recorded in the audit log (refused, naming the missing permission).
    refused = [r for r in world.audit_rows()[refused_before:] if r["outcome"] == "refused"]
    assert refusals > 100 and len(refused) == refusals
    assert all('"permission"' in (r["details"] or "") for r in refused)


JOB_ROUTES = [
    ("GET", "/api/v1/jobs/{id}"),
    ("DELETE", "/api/v1/jobs/{id}"),
    ("POST", "/api/v1/jobs/{id}/cancel"),
    ("POST", "/api/v1/jobs/{id}/retry"),
    ("POST", "/api/v1/jobs/{id}/run-now"),
    ("GET", "/api/v1/jobs/{id}/attempts"),
    ("GET", "/api/v1/jobs/{id}/events"),
    ("GET", "/api/v1/jobs/{id}/files/out.txt"),
]


@pytest.mark.parametrize("who", ["user", "scoped"])
def test_another_owners_job_is_byte_identical_to_a_missing_one(world: World, who: str) -> None:
    """Callers without jobs.read_all: someone else's job answers exactly like no job (when the action is
    theirs to try at all: otherwise 403, the same for both)."""
    caller, other = world.callers[who], world.callers["admin"]
    for method, template in JOB_ROUTES:
        job = _file_job(world, other)
        client = world.app.test_client()
        foreign = client.open(template.format(id=job), method=method, headers=caller.bearer, json={})
        missing = client.open(template.format(id="f" * 32), method=method, headers=caller.bearer, json={})
        assert foreign.status_code == missing.status_code in (403, 404), (method, template)
        assert foreign.get_data() == missing.get_data(), (method, template)
        assert world.driver.status(job) == "succeeded"  # nothing happened to it


def test_openapi_names_each_operations_permission(world: World) -> None:
    doc = world.app.test_client().get("/api/openapi.json", headers=world.callers["viewer"].bearer).get_json()
    operations = 0
    for rule in world.app.url_map.iter_rules():
        path = rule.rule.replace("<int:", "<").replace("<", "{").replace(">", "}")
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}:
            operation = doc["paths"].get(path, {}).get(method.lower())
            if operation is None:
                continue
            operations += 1
            declared = view_permission(world.app, rule.endpoint, method)
            assert operation["x-permission"] == declared, (method, path)
            assert declared in operation["description"] or declared in ("public", "authenticated"), (method, path)
    documented = sum(1 for ops in doc["paths"].values() for m in ops if m in ("get", "post", "put", "patch", "delete"))
    assert operations == documented > 45


def test_a_role_change_narrows_existing_tokens_at_once(world: World) -> None:
    operator = world.callers["operator"]
    client = world.app.test_client()
    assert client.get("/api/v1/queues", headers=operator.bearer).status_code == 200
    accounts.set_role(world.engine, operator.user.id, "user")
    # The same token, the next request: the user role has no metrics.read.
    assert client.get("/api/v1/queues", headers=operator.bearer).status_code == 403
    me = client.get("/api/v1/me", headers=operator.bearer).get_json()
    assert me["role"] == "user" and "metrics.read" not in me["permissions"]
    assert me["token"]["name"] == "probe" and me["via"] == "token"
    # Back to operator: the token carried metrics.read all along, so it works again.
    accounts.set_role(world.engine, operator.user.id, "operator")
    assert client.get("/api/v1/queues", headers=operator.bearer).status_code == 200


def test_a_token_carries_at_most_what_its_creator_may_do(world: World) -> None:
    client = world.app.test_client()
    user, scoped = world.callers["user"], world.callers["scoped"]
    made = client.post("/api/v1/tokens", json={"name": "ci", "permissions": ["jobs.submit"]}, headers=user.bearer)
    assert made.status_code == 201 and made.get_json()["token"]["permissions"] == ["jobs.submit"]
    secret = made.get_json()["secret"]
    ci = {"Authorization": f"Bearer {secret}"}
    assert client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "x"}}, headers=ci).status_code == 201
    assert client.get("/api/v1/jobs", headers=ci).status_code == 403  # it carries no jobs.read_own
    # Asking for more than you may do is refused (and recorded)
    more = client.post("/api/v1/tokens", json={"name": "x", "permissions": ["metrics.read"]}, headers=user.bearer)
    assert more.status_code == 403 and "metrics.read" in more.get_json()["error"]["message"]
    unknown = client.post("/api/v1/tokens", json={"name": "x", "permissions": ["root"]}, headers=user.bearer)
    assert unknown.status_code == 422
    # A token that may not manage tokens cannot make one; one that may passes on at most what it may do
    assert client.post("/api/v1/tokens", json={"name": "x"}, headers=scoped.bearer).status_code == 403
    narrow = {"name": "n", "permissions": ["tokens.manage_own", "jobs.read_own"]}
    minted = {
        "Authorization": f"Bearer {client.post('/api/v1/tokens', json=narrow, headers=user.bearer).json['secret']}"
    }
    wider = client.post("/api/v1/tokens", json={"name": "w", "permissions": ["jobs.submit"]}, headers=minted)
    assert wider.status_code == 403
    child = client.post("/api/v1/tokens", json={"name": "c"}, headers=minted).json["token"]
    assert child["permissions"] == ["jobs.read_own", "tokens.manage_own"]
    # The default of a new token is what you may do now
    default = client.post("/api/v1/tokens", json={"name": "all"}, headers=user.bearer).get_json()["token"]
    assert set(default["permissions"]) == user.permissions
    refused = [r for r in world.audit_rows("token.create") if r["outcome"] != "ok"]
    assert [r["outcome"] for r in refused] == ["refused", "refused", "refused"]  # the unknown action: a 422 before


def test_roles_defined_by_an_admin_and_the_builtins_kept(world: World) -> None:
    client = world.app.test_client()
    admin = world.callers["admin"].bearer
    r = client.post(
        "/api/v1/roles", json={"name": "auditor", "permissions": ["audit.read", "jobs.read_own"]}, headers=admin
    )
    assert r.status_code == 201 and r.get_json()["permissions"] == ["jobs.read_own", "audit.read"]
    bob = world.person("user")
    assert (
        client.patch(f"/api/v1/users/{bob.name}", json={"role": "auditor"}, headers=admin).get_json()["role"]
        == "auditor"
    )
    assert client.get("/api/v1/audit", headers=bob.basic).status_code == 200
    assert client.get("/api/v1/jobs", headers=bob.basic).status_code == 200
    assert (
        client.post("/api/v1/jobs", json={"kind": "echo", "payload": {"text": "x"}}, headers=bob.basic).status_code
        == 403
    )
    # Built-in roles neither change nor go; a role in use stays; unknown actions are refused
    assert client.put("/api/v1/roles/viewer", json={"permissions": []}, headers=admin).status_code == 409
    assert client.delete("/api/v1/roles/admin", headers=admin).status_code == 409
    assert client.delete("/api/v1/roles/auditor", headers=admin).status_code == 409
    assert client.post("/api/v1/roles", json={"name": "x", "permissions": ["root"]}, headers=admin).status_code == 422
    assert client.put("/api/v1/roles/nope", json={"permissions": []}, headers=admin).status_code == 404
    # Its actions change at its users' next request
    client.put("/api/v1/roles/auditor", json={"permissions": ["jobs.read_own"]}, headers=admin)
    assert client.get("/api/v1/audit", headers=bob.basic).status_code == 403
    roles = {r["name"]: r for r in client.get("/api/v1/roles", headers=admin).get_json()}
    assert set(roles["admin"]["permissions"]) == set(accounts.permissions.ALL)
    assert {n for n, r in roles.items() if r["builtin"]} == {"viewer", "user", "operator", "admin"}


def test_the_last_user_who_may_manage_users_stays(world: World) -> None:
    client = world.app.test_client()
    admin = world.callers["admin"]
    for name in [u.username for u in accounts.list_users(world.engine) if u.role == "admin" and u.id != admin.user.id]:
        accounts.set_role(world.engine, accounts.get_user_by_name(world.engine, name).id, "user")  # type: ignore[union-attr]
    r = client.patch(f"/api/v1/users/{admin.name}", json={"role": "operator"}, headers=admin.bearer)
    assert r.status_code == 409 and "manage users" in r.get_json()["error"]["message"]
    assert client.patch(f"/api/v1/users/{admin.name}", json={"disabled": True}, headers=admin.bearer).status_code == 409
    assert accounts.get_user_by_name(world.engine, admin.name).role == "admin"  # type: ignore[union-attr]


def test_a_disabled_user_and_their_tokens_stop_at_once(world: World) -> None:
    client = world.app.test_client()
    user = world.callers["user"]
    assert client.get("/api/v1/jobs", headers=user.bearer).status_code == 200
    r = client.patch(f"/api/v1/users/{user.name}", json={"disabled": True}, headers=world.callers["admin"].bearer)
    assert r.status_code == 200 and r.get_json()["disabled"] is True
    assert client.get("/api/v1/jobs", headers=user.bearer).status_code == 401
    assert client.get("/api/v1/jobs", headers=user.basic).status_code == 401
