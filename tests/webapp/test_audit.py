"""The audit log: every operator/admin action and security event, recorded in the transaction that does it.

For each audited action: done normally, its effect and exactly one ``ok`` row (who, from where, on what)
commit together; with a failure forced right after the row is written inside that transaction, neither
the effect nor an ``ok`` row exists — only the ``failed`` row written alone afterwards says it was tried.
Then: logins and refused credentials, the API's filters, cursor paging and JSON-lines export, the page,
retention, and the command line's changes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import accounts
import tenure_cli
from accounts import audit, audit_store

from .world import SCHEDULE, World, unique

UA = "probe-agent/1.0"


@dataclass
class Spec:
    """One audited action: what it needs, how it is done, and whether its effect is there."""

    setup: Callable[[World], Any]
    do: Callable[[World, Any], Any]
    effect: Callable[[World, Any], bool]


def _api(method: str, path: str, body: Any = None) -> Callable[[World, Any], Any]:
    def do(w: World, ctx: Any) -> Any:
        url = path.format(ctx=ctx)
        payload = body(ctx) if callable(body) else body
        headers = {**w.callers["admin"].bearer, "User-Agent": UA}
        return w.app.test_client().open(
            url, method=method, json=payload if payload is not None else {}, headers=headers
        )

    return do


def _ui_post(path: str, data: dict[str, Any]) -> Callable[[World, Any], Any]:
    def do(w: World, ctx: Any) -> Any:
        client = w.login(w.callers["admin"])
        return client.post(path.format(ctx=ctx), data={**data, "csrf_token": w.callers["admin"].csrf})

    return do


def _login(w: World, ctx: Any) -> Any:
    client = ctx["client"]
    page = client.get("/login").get_data(as_text=True)
    token = page.split('name="csrf-token" content="')[1].split('"')[0]
    user = w.callers["user"]
    client.post(
        "/login",
        data={"username": user.user.username, "password": user.password, "csrf_token": token},
        headers={"User-Agent": UA},
    )
    return None


def _logged_in(w: World, ctx: Any) -> bool:
    # The same User-Agent: sessions are bound to it (Flask-Login's strong session protection).
    return ctx["client"].get("/jobs", headers={"User-Agent": UA}).status_code == 200


def _status(w: World, job: str) -> str:
    return w.driver.status(job)


def _user(w: World, name: str) -> accounts.User:
    found = accounts.get_user_by_name(w.engine, name)
    assert found is not None
    return found


def _revision(w: World) -> int:
    from settings.runtime import get_settings

    return int(get_settings(w.engine, w.driver.settings)["revision"])


def _disabled_user(w: World) -> str:
    name = unique("off")
    user, _ = accounts.create_user(w.engine, name)
    accounts.set_disabled(w.engine, user.id, True)
    return name


def _token(w: World) -> int:
    return accounts.create_token(w.engine, w.callers["admin"].user.id, "doomed")[0].id


def _paused_queue(w: World) -> None:
    w.broker.pause("default")


def _paused_schedule(w: World) -> None:
    from tasks.scheduling import pause

    pause(SCHEDULE, broker=w.broker)


def _jobs_of(w: World, states: list[str]) -> list[str]:
    return [w.job(w.callers["admin"], s) for s in states]


def _events(w: World, job: str) -> list[str]:
    import jobs

    return [e.type for e in jobs.job_events(w.engine, job, owner_id="", is_admin=True)]


def _retries(w: World) -> int:
    import jobs

    return sum(1 for j in jobs.list_jobs(w.engine, owner_id="", is_admin=True, limit=500) if j.retry_of_job_id)


ACTIONS: dict[str, Spec] = {
    "login": Spec(lambda w: {"client": w.app.test_client()}, _login, _logged_in),
    "token.create": Spec(
        lambda w: unique("tok"),
        _api("POST", "/api/v1/tokens", lambda ctx: {"name": ctx}),
        lambda w, ctx: any(t.name == ctx for t in accounts.list_tokens(w.engine, w.callers["admin"].user.id)),
    ),
    "token.revoke": Spec(
        _token,
        _api("DELETE", "/api/v1/tokens/{ctx}"),
        lambda w, ctx: (
            not next(t for t in accounts.list_tokens(w.engine, w.callers["admin"].user.id) if t.id == ctx).active
        ),
    ),
    "user.create": Spec(
        lambda w: unique("new"),
        _api("POST", "/api/v1/users", lambda ctx: {"name": ctx, "password": "a long password"}),
        lambda w, ctx: accounts.get_user_by_name(w.engine, ctx) is not None,
    ),
    "user.password": Spec(
        lambda w: w.callers["user"].name,
        _api("PUT", "/api/v1/users/{ctx}/password", {"password": "the new password"}),
        lambda w, ctx: accounts.authenticate(w.engine, ctx, "the new password") is not None,
    ),
    "user.role": Spec(
        lambda w: w.callers["user"].name,
        _api("PATCH", "/api/v1/users/{ctx}", {"role": "viewer"}),
        lambda w, ctx: _user(w, ctx).role == "viewer",
    ),
    "user.disable": Spec(
        lambda w: w.callers["user"].name,
        _api("PATCH", "/api/v1/users/{ctx}", {"disabled": True}),
        lambda w, ctx: _user(w, ctx).disabled,
    ),
    "user.enable": Spec(
        _disabled_user,
        _api("PATCH", "/api/v1/users/{ctx}", {"disabled": False}),
        lambda w, ctx: not _user(w, ctx).disabled,
    ),
    "role.create": Spec(
        lambda w: unique("role"),
        _api("POST", "/api/v1/roles", lambda ctx: {"name": ctx, "permissions": ["jobs.read_own"]}),
        lambda w, ctx: accounts.get_role(w.engine, ctx) is not None,
    ),
    "role.update": Spec(
        lambda w: accounts.create_role(w.engine, unique("role"), "", ["jobs.read_own"]).name,
        _api("PUT", "/api/v1/roles/{ctx}", {"permissions": ["metrics.read"]}),
        lambda w, ctx: accounts.get_role(w.engine, ctx).permissions == {"metrics.read"},  # type: ignore[union-attr]
    ),
    "role.delete": Spec(
        lambda w: accounts.create_role(w.engine, unique("role"), "", []).name,
        _api("DELETE", "/api/v1/roles/{ctx}"),
        lambda w, ctx: accounts.get_role(w.engine, ctx) is None,
    ),
    "settings.save": Spec(
        _revision,
        _api("PUT", "/api/v1/settings", lambda ctx: {"expected_revision": ctx, "values": {"retention.audit_days": 30}}),
        lambda w, ctx: _revision(w) == ctx + 1,
    ),
    "job.cancel": Spec(
        lambda w: w.job(w.callers["user"]),
        _api("POST", "/api/v1/jobs/{ctx}/cancel"),
        lambda w, ctx: _status(w, ctx) == "cancelled",
    ),
    "job.retry": Spec(
        lambda w: w.job(w.callers["user"], "failed"),
        _api("POST", "/api/v1/jobs/{ctx}/retry"),
        lambda w, ctx: _retries(w) == 1,
    ),
    "job.delete": Spec(
        lambda w: w.job(w.callers["user"], "succeeded"),
        _api("DELETE", "/api/v1/jobs/{ctx}"),
        lambda w, ctx: w.driver.count() == 1,  # the other job of the fixture stays
    ),
    "job.run_now": Spec(
        lambda w: w.job(w.callers["user"], "delayed"),
        _api("POST", "/api/v1/jobs/{ctx}/run-now"),
        lambda w, ctx: "run_now" in _events(w, ctx),
    ),
    "jobs.bulk_cancel": Spec(
        lambda w: _jobs_of(w, ["queued", "queued"]),
        _api("POST", "/api/v1/jobs/bulk/cancel", {"filter": {"status": ["queued"]}}),
        lambda w, ctx: any(_status(w, j) == "cancelled" for j in ctx),
    ),
    "jobs.bulk_retry": Spec(
        lambda w: _jobs_of(w, ["failed", "failed"]),
        _api("POST", "/api/v1/jobs/bulk/retry", {"filter": {"status": ["failed"]}}),
        lambda w, ctx: _retries(w) > 0,
    ),
    "queue.pause": Spec(lambda w: None, _api("POST", "/api/v1/queues/default/pause"), lambda w, ctx: w.paused()),
    "queue.resume": Spec(_paused_queue, _api("POST", "/api/v1/queues/default/resume"), lambda w, ctx: not w.paused()),
    "dead_letters.replay": Spec(
        lambda w: w.dead_letter(),
        _api("POST", "/api/v1/dead/replay", lambda ctx: {"queue": "default", "ids": [ctx]}),
        lambda w, ctx: w.dead_count() == 0,
    ),
    "dead_letters.purge": Spec(
        lambda w: w.dead_letter(),
        _api("POST", "/api/v1/dead/purge", {"queue": "default"}),
        lambda w, ctx: w.dead_count() == 0,
    ),
    "dead_letters.bulk_replay": Spec(
        lambda w: w.dead_letter(),
        _api("POST", "/api/v1/dead/bulk/replay", lambda ctx: {"filter": {}, "through_id": ctx}),
        lambda w, ctx: w.dead_count() == 0,
    ),
    "dead_letters.bulk_purge": Spec(
        lambda w: w.dead_letter(),
        _api("POST", "/api/v1/dead/bulk/purge", lambda ctx: {"filter": {"queue": "default"}, "through_id": ctx}),
        lambda w, ctx: w.dead_count() == 0,
    ),
    "schedule.run": Spec(
        lambda w: None, _api("POST", f"/api/v1/schedules/{SCHEDULE}/run"), lambda w, ctx: w.fires() == 1
    ),
    "schedule.pause": Spec(
        lambda w: None, _api("POST", f"/api/v1/schedules/{SCHEDULE}/pause"), lambda w, ctx: w.schedule_paused()
    ),
    "schedule.resume": Spec(
        _paused_schedule, _api("POST", f"/api/v1/schedules/{SCHEDULE}/resume"), lambda w, ctx: not w.schedule_paused()
    ),
    "workers.acknowledge": Spec(
        lambda w: w.unclean_exit(),
        _api("POST", "/api/v1/workers/unclean-exits/acknowledge", lambda ctx: {"owners": [ctx]}),
        lambda w, ctx: w.unclean_count() == 0,
    ),
}
#: The same mechanism from the UI's forms (a sample: each UI action opens its transaction the same way).
UI_ACTIONS: dict[str, Spec] = {
    "queue.pause": Spec(lambda w: None, _ui_post("/ops/queues/default/pause", {}), lambda w, ctx: w.paused()),
    "settings.save": Spec(
        _revision, _ui_post("/ops/settings", {"expected_revision": "0"}), lambda w, ctx: _revision(w) == ctx + 1
    ),
    "jobs.bulk_cancel": Spec(
        lambda w: _jobs_of(w, ["queued"]),
        lambda w, ctx: _ui_post("/jobs/bulk", {"action": "cancel", "ids": ctx})(w, ctx),
        lambda w, ctx: _status(w, ctx[0]) == "cancelled",
    ),
}
#: Events with no write of their own (a refused permission, credentials that do not authenticate): their
#: rows are tested below, not here.
EVENTS_ONLY = {"access", "auth.failed"}


def test_every_audited_action_has_a_transaction_test() -> None:
    assert set(ACTIONS) == set(audit.ACTIONS) - EVENTS_ONLY


@pytest.fixture()
def arm_failure(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[int]]:
    """Arming makes the audit row's insert fail right AFTER it wrote the row, inside the action's transaction;
    it returns the ids of the rows so written (and rolled back)."""

    def arm() -> list[int]:
        written: list[int] = []
        real = audit_store.entry_insert

        def insert_then_fail(conn: Any, values: dict[str, Any]) -> int:
            row_id = real(conn, values)
            if values["outcome"] == "ok":
                written.append(row_id)
                raise RuntimeError("forced failure after the audit row was written")
            return row_id

        monkeypatch.setattr(audit_store, "entry_insert", insert_then_fail)
        return written

    return arm


def _run(w: World, spec: Spec, arm: Callable[[], list[int]] | None = None) -> tuple[Any, Any, list[int]]:
    ctx = spec.setup(w)
    assert not spec.effect(w, ctx), "the effect is there before the action"
    written = arm() if arm is not None else []
    return ctx, spec.do(w, ctx), written


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_action_and_its_record_commit_together(world: World, action: str) -> None:
    spec = ACTIONS[action]
    before = len(world.audit_rows(action))
    ctx, response, _ = _run(world, spec)
    assert response is None or response.status_code < 400, response.get_data(as_text=True)[:300]
    assert spec.effect(world, ctx)
    rows = world.audit_rows(action)[before:]
    assert [r["outcome"] for r in rows] == ["ok"]
    row = rows[0]
    who = world.callers["user" if action == "login" else "admin"]
    assert row["actor_name"] == who.user.username and row["actor_id"] == who.user.id
    assert row["via"] == ("session" if action == "login" else "token")
    assert (row["token_id"] is None) == (action == "login")
    assert row["ip"] == "127.0.0.1" and row["user_agent"] == UA and row["at"] > 0
    assert row["target"] or action.startswith(("jobs.bulk", "dead_letters.bulk", "settings", "workers"))
    # Never a secret: no password, token secret or hash in any column
    text = json.dumps(row)
    assert "tnr_" not in text and "password" not in (row["details"] or "") and "scrypt$" not in text


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_failure_after_the_write_leaves_neither_action_nor_record(
    world: World, arm_failure: Callable[[], list[int]], action: str
) -> None:
    spec = ACTIONS[action]
    ctx, response, written = _run(world, spec, arm_failure)
    assert written, "the audit row was never written inside the action's transaction"
    assert response is None or response.status_code == 500
    assert not spec.effect(world, ctx)
    rows = world.audit_rows(action)
    assert [r for r in rows if r["outcome"] == "ok"] == []
    if action != "login":  # the attempt itself is recorded, as failed, on its own
        assert [(r["outcome"], r["reason"]) for r in rows] == [("failed", "internal error (RuntimeError)")]


@pytest.mark.parametrize("action", sorted(UI_ACTIONS))
def test_ui_actions_commit_with_their_record(world: World, arm_failure: Callable[[], list[int]], action: str) -> None:
    spec = UI_ACTIONS[action]
    world.login(world.callers["admin"])  # the login is recorded too: before the failure is armed
    ctx, response, written = _run(world, spec, arm_failure)
    assert written and response.status_code == 500 and not spec.effect(world, ctx)
    assert [r for r in world.audit_rows(action) if r["outcome"] == "ok"] == []


def test_ui_actions_record_who_did_them(world: World) -> None:
    for action, spec in UI_ACTIONS.items():
        ctx, response, _ = _run(world, spec)
        assert response.status_code == 302 and spec.effect(world, ctx), action
        (row,) = world.audit_rows(action)
        assert row["outcome"] == "ok" and row["via"] == "session" and row["actor_name"] == world.callers["admin"].name


def test_logins_and_refused_credentials_are_recorded(world: World) -> None:
    client = world.app.test_client()
    page = client.get("/login").get_data(as_text=True)
    token = page.split('name="csrf-token" content="')[1].split('"')[0]
    r = client.post("/login", data={"username": "mallory", "password": "guess-guess", "csrf_token": token})
    assert r.status_code == 200
    (failed,) = world.audit_rows("login")
    assert (failed["outcome"], failed["target"], failed["actor_name"]) == ("refused", "mallory", None)
    assert "guess-guess" not in json.dumps(failed)
    assert client.get("/api/v1/jobs", headers={"Authorization": "Basic bWFsbG9yeTp4eHh4"}).status_code == 401
    assert client.get("/api/v1/jobs", headers={"Authorization": "Bearer tnr_not-a-token"}).status_code == 401
    rows = world.audit_rows("auth.failed")
    assert [(r["target"], json.loads(r["details"])["via"]) for r in rows] == [("mallory", "basic"), (None, "token")]
    assert "tnr_not-a-token" not in json.dumps(rows)


def _record(w: World, action: str, outcome: str, actor: str, at: datetime) -> None:
    with w.engine.begin() as conn:
        audit.record(conn, audit.Entry(action, outcome=outcome, actor_name=actor), now=at)


def test_api_filters_pages_and_exports(world: World) -> None:
    client = world.app.test_client()
    headers = world.callers["admin"].bearer
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(7):
        _record(
            world, "queue.pause", "ok" if i % 2 else "failed", "ana" if i < 4 else "ben", start + timedelta(hours=i)
        )
    page = client.get("/api/v1/audit?actor=ana&limit=3", headers=headers).get_json()
    assert [r["actor"] for r in page["items"]] == ["ana"] * 3 and page["next_cursor"]
    rest = client.get(f"/api/v1/audit?actor=ana&limit=3&cursor={page['next_cursor']}", headers=headers).get_json()
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None
    ids = [r["id"] for r in page["items"] + rest["items"]]
    assert ids == sorted(ids, reverse=True)  # newest first
    failed = client.get("/api/v1/audit?outcome=failed&action=queue.pause", headers=headers).get_json()["items"]
    assert len(failed) == 4 and {r["outcome"] for r in failed} == {"failed"}
    since, until = (start + timedelta(hours=2)).isoformat(), (start + timedelta(hours=5)).isoformat()
    window = client.get("/api/v1/audit", query_string={"since": since, "until": until}, headers=headers).get_json()
    assert len(window["items"]) == 3
    assert client.get("/api/v1/audit?outcome=maybe", headers=headers).status_code == 422
    assert client.get("/api/v1/audit?cursor=abc", headers=headers).status_code == 422
    past_int64 = client.get("/api/v1/audit?cursor=9941305353165830496", headers=headers)  # 19 digits, > 2**63 - 1
    assert past_int64.status_code == 422 and "cursor" in past_int64.get_json()["error"]["message"]
    assert client.get("/api/v1/audit?since=2026-01-01T00:00:00", headers=headers).status_code == 422  # no zone
    export = client.get("/api/v1/audit/export?actor=ben", headers=headers)
    assert export.status_code == 200 and export.mimetype == "application/x-ndjson"
    lines = [json.loads(line) for line in export.get_data(as_text=True).splitlines()]
    assert [r["actor"] for r in lines] == ["ben"] * 3 and set(lines[0]) >= {"at", "action", "outcome", "ip", "details"}


def test_the_page_filters_and_pages(world: World) -> None:
    for i in range(55):
        _record(world, "schedule.run", "ok", "cron-ops", datetime.now(UTC) - timedelta(minutes=i))
    client = world.login(world.callers["admin"])
    first = client.get("/audit?actor=cron-ops").get_data(as_text=True)
    assert first.count('class="audit-row"') == 50 and 'id="audit-older"' in first
    older = first.split('id="audit-older"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    assert client.get(older).get_data(as_text=True).count('class="audit-row"') == 5
    assert client.get("/audit?outcome=refused&actor=cron-ops").get_data(as_text=True).count('class="audit-row"') == 0
    export = first.split('id="audit-export"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    assert len(client.get(export).get_data(as_text=True).splitlines()) == 55


def test_retention_prunes_old_rows(world: World) -> None:
    from tasks.maintenance import MaintenanceConfig, run_resync

    now = datetime.now(UTC)
    _record(world, "queue.pause", "ok", "old", now - timedelta(days=40))
    _record(world, "queue.pause", "ok", "new", now - timedelta(days=1))
    report = run_resync(world.broker, config=MaintenanceConfig(audit_retention_s=30 * 86400))
    assert report.audit_pruned == 1 and not report.errors
    assert [r["actor_name"] for r in world.audit_rows("queue.pause")] == ["new"]
    # The runtime setting is what the resync reads by default
    client = world.app.test_client()
    headers = world.callers["admin"].bearer
    saved = client.put(
        "/api/v1/settings", json={"expected_revision": 0, "values": {"retention.audit_days": 1}}, headers=headers
    )
    assert saved.status_code == 200
    assert run_resync(world.broker).audit_pruned == 1
    assert [r["action"] for r in world.audit_rows()][-1] == "settings.save"


def test_command_line_changes_are_recorded(world: World, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("TENURE_DATABASE_URL", str(world.engine.url))
    monkeypatch.setattr("sys.stdin", io.StringIO("a typed long password\n"))
    assert tenure_cli.main(["users", "create", "olga", "--role", "operator", "--password-stdin"]) == 0
    assert tenure_cli.main(["users", "set-role", "olga", "viewer"]) == 0
    assert tenure_cli.main(["users", "define-role", "ops-lite", "--permission", "metrics.read"]) == 0
    assert tenure_cli.main(["users", "set-role", "olga", "ops-lite"]) == 0
    assert tenure_cli.main(["users", "set-role", "olga", "no-such-role"]) == 1
    assert "No role named" in capsys.readouterr().err
    assert accounts.get_user_by_name(world.engine, "olga").permissions == {"metrics.read"}  # type: ignore[union-attr]
    rows = [r for r in world.audit_rows() if r["via"] == "cli"]
    assert [(r["action"], r["outcome"], r["target"]) for r in rows] == [
        ("user.create", "ok", "olga"),
        ("user.role", "ok", "olga"),
        ("role.create", "ok", "ops-lite"),
        ("user.role", "ok", "olga"),
        ("user.role", "failed", "olga"),
    ]
    assert all("@" in r["actor_name"] for r in rows)
    assert "a typed long password" not in json.dumps(rows)


def test_a_dry_run_changes_nothing_and_is_not_recorded(world: World) -> None:
    client = world.app.test_client()
    headers = world.callers["admin"].bearer
    world.job(world.callers["user"])
    world.dead_letter()
    assert (
        client.post("/api/v1/jobs/bulk/cancel", json={"filter": {}, "dry_run": True}, headers=headers).json["affected"]
        == 1
    )
    assert (
        client.post("/api/v1/dead/bulk/purge", json={"filter": {}, "dry_run": True}, headers=headers).json["affected"]
        == 1
    )
    assert world.audit_rows("jobs.bulk_cancel") == [] and world.audit_rows("dead_letters.bulk_purge") == []


def test_a_pause_the_broker_cannot_do_is_recorded_as_failed(app_config: dict, root: Any) -> None:  # type: ignore[type-arg]
    """On Redis a queue cannot be paused: the 409 and its reason are what the log records."""
    import uuid

    from dramatiq.brokers.redis import RedisBroker

    from webapp import create_app

    broker = RedisBroker(
        url="redis://127.0.0.1:6379/15", namespace=f"tenure-test-{uuid.uuid4().hex[:8]}", middleware=[]
    )
    broker.declare_queue("default")
    app = create_app({**app_config, "TENURE_BROKER": broker})
    r = app.test_client().post("/api/v1/queues/default/pause", headers=root.bearer)
    assert r.status_code == 409 and r.json["error"]["code"] == "pause_unavailable"
    (row,) = [e for e in audit.page(app_config["TENURE_ENGINE"], audit.AuditFilter(action="queue.pause")).items]
    assert (row.outcome, row.target, row.reason) == ("failed", "default", r.json["error"]["message"])
    broker.close()
