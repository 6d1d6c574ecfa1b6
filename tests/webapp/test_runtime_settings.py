"""``/api/v1/settings`` and the settings page: revisions, conflicts, validation, secrets, admin only."""

from __future__ import annotations

import logging

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine

from settings.runtime_models import metadata, runtime_settings

from .conftest import Person, login

SECRET = "whsec_czNjcjN0LXdlYmhvb2stdmFsdWUtczNjcjN0LXdlYmg="  # a Standard Webhooks secret


@pytest.fixture(autouse=True)
def _settings_table(web_engine: Engine) -> None:
    metadata.create_all(web_engine, tables=[runtime_settings])


def _get(client: FlaskClient, person: Person) -> dict:
    r = client.get("/api/v1/settings", headers=person.bearer)
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()


def _put(client: FlaskClient, person: Person, values: dict, revision: int):  # type: ignore[no-untyped-def]
    return client.put("/api/v1/settings", json={"expected_revision": revision, "values": values}, headers=person.bearer)


def test_users_get_403(client: FlaskClient, alice: Person) -> None:
    assert client.get("/api/v1/settings", headers=alice.bearer).status_code == 403
    assert _put(client, alice, {}, 0).status_code == 403
    assert client.get("/api/v1/settings").status_code == 401


def test_revisions_increment_and_a_stale_revision_is_409(client: FlaskClient, root: Person) -> None:
    view = _get(client, root)
    assert view["revision"] == 0 and view["saved"] == {} and view["effective"]["retention.dead_letters_days"] == 7
    r = _put(client, root, {"retention.events_days": 5}, 0)
    assert r.status_code == 200 and r.get_json()["revision"] == 1
    r = _put(client, root, {"retention.events_days": 6}, 1)
    assert r.get_json()["revision"] == 2 and r.get_json()["saved_by"] == root.user.username
    stale = _put(client, root, {"retention.events_days": 7}, 1)
    assert stale.status_code == 409 and stale.get_json()["error"]["code"] == "conflict"
    assert _get(client, root)["saved"] == {"retention.events_days": 6}


def test_failed_validation_saves_nothing(client: FlaskClient, root: Person) -> None:
    r = _put(client, root, {"retention.events_days": 3, "retention.dead_letters_days": 0, "nope": 1}, 0)
    assert r.status_code == 422
    details = r.get_json()["error"]["details"]
    assert set(details) == {"retention.dead_letters_days", "nope"}
    for bad in (
        {"jobs.default_max_attempts": "3"},
        {"jobs.default_max_attempts": True},
        {"queues.default.paused": 1},
        {"queues.bad name.paused": True},
        {"database_url": "sqlite:///x.db"},
    ):
        assert _put(client, root, bad, 0).status_code == 422, bad
    for body in ({"values": {}}, {"expected_revision": 1.5, "values": {}}, {"expected_revision": 0, "values": []}):
        assert client.put("/api/v1/settings", json=body, headers=root.bearer).status_code == 422
    assert _get(client, root)["revision"] == 0


def test_a_queue_can_be_paused_before_its_first_message(client: FlaskClient, root: Person) -> None:
    # Any well-formed name is accepted (as the OpenAPI document says): the pause waits for the queue.
    r = _put(client, root, {"queues.later.paused": True}, 0)
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["saved"]["queues.later.paused"] is True
    assert _get(client, root)["revision"] == 1


def test_secrets_are_write_only(client: FlaskClient, root: Person, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    r = _put(client, root, {"notify.webhook_secret": SECRET, "retention.events_days": 2}, 0)
    assert r.status_code == 200 and SECRET not in r.get_data(as_text=True)
    assert r.get_json()["saved"]["notify.webhook_secret"] == {"set": True}
    # omitted: kept
    r = _put(client, root, {"retention.events_days": 3}, 1)
    assert r.get_json()["saved"]["notify.webhook_secret"] == {"set": True}
    got = client.get("/api/v1/settings", headers=root.bearer)
    assert SECRET not in got.get_data(as_text=True)
    assert got.get_json()["effective"]["notify.webhook_secret"] == {"set": True}
    # a too-long secret is refused without echoing it
    bad = _put(client, root, {"notify.webhook_secret": SECRET * 100}, 2)
    assert bad.status_code == 422 and SECRET not in bad.get_data(as_text=True)
    # null: cleared
    r = _put(client, root, {"notify.webhook_secret": None}, 2)
    assert r.get_json()["saved"].get("notify.webhook_secret", {"set": False}) == {"set": False}
    assert SECRET not in caplog.text


def test_effective_vs_pending_restart(client: FlaskClient, root: Person) -> None:
    r = _put(client, root, {"jobs.default_max_attempts": 9, "retention.finished_jobs_days": 4}, 0).get_json()
    assert r["saved"]["jobs.default_max_attempts"] == 9
    assert r["effective"]["jobs.default_max_attempts"] == 3  # this process started with the default
    assert r["pending_restart"] == ["jobs.default_max_attempts"]
    assert r["effective"]["retention.finished_jobs_days"] == 4  # next boundary: effective at once
    assert r["jobs_on_older_snapshot"] == 0
    assert {c["key"]: c["effect"] for c in r["catalogue"]}["jobs.default_max_attempts"] == "restart"


def test_queue_and_schedule_pause_are_applied(
    client: FlaskClient,
    root: Person,
    web_broker,
    app,  # type: ignore[no-untyped-def]
) -> None:
    from tasks.scheduling import cron, install, schedule_job

    install(web_broker)
    schedule_job("echo", cron("0 3 * * *", name="nightly"), broker=web_broker)

    def nightly_paused() -> bool:
        (view,) = app.extensions["tenure"].jobs.schedules()
        return view.paused

    r = _put(client, root, {"queues.default.paused": True, "schedules.nightly.paused": True}, 0)
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json()["changed"] == {"queues.default.paused": True, "schedules.nightly.paused": True}
    assert {s.queue: s.paused for s in web_broker.stats()}["default"]
    assert nightly_paused()
    # omitting the keys falls back to the default (not paused), applied at once
    r = _put(client, root, {}, 1)
    assert r.get_json()["changed"] == {"queues.default.paused": False, "schedules.nightly.paused": False}
    assert not {s.queue: s.paused for s in web_broker.stats()}["default"]
    assert not nightly_paused()


def test_settings_page_shows_and_saves_with_csrf(client: FlaskClient, root: Person, alice: Person) -> None:
    token = login(client, root)
    page = client.get("/ops/settings")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "retention.events_days" in html and "queues.default.paused" in html and 'id="settings-revision">0' in html
    assert "/ops/settings" in client.get("/ops").get_data(as_text=True)  # linked from the operations nav
    form = {
        "csrf_token": token,
        "expected_revision": "0",
        "v:retention.events_days": "12",
        "v:queues.default.paused": "",
        "v:notify.webhook_secret": SECRET,
    }
    assert client.post("/ops/settings", data={**form, "csrf_token": "bad"}).status_code in (302, 400)
    r = client.post("/ops/settings", data=form, follow_redirects=True)
    html = r.get_data(as_text=True)
    assert "Saved revision 1" in html and SECRET not in html and 'id="settings-revision">1' in html
    r = client.post("/ops/settings", data={**form, "v:retention.events_days": "0"}, follow_redirects=True)
    assert "Nothing was saved" in r.get_data(as_text=True)
    other = FlaskClient(client.application)
    login(other, alice)
    assert other.get("/ops/settings").status_code == 403
