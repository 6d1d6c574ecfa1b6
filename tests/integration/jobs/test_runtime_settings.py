"""Runtime settings on a real, migrated SQLite file: revisions, conflicts, secrets, snapshots, wiring."""

from __future__ import annotations

import logging
import threading
from functools import partial
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from jobs.db import make_engine
from jobs.queries import running_jobs_submitted_before
from settings import runtime as rs
from settings.environment import Settings
from settings.runtime_models import metadata
from tasks.maintenance import MaintenanceConfig, retention_in_force

from .support import JobEnv

SECRET = "whsec_ZG8tbm90LXByaW50LW1lLTAxMjMtZG8tbm90LXByaW4="  # a Standard Webhooks secret (32 bytes)


def test_migration_creates_the_table_as_the_model_declares(sqlite_env: JobEnv) -> None:
    def only_ours(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
        table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
        return table == "runtime_settings"

    with sqlite_env.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": only_ours})
        assert compare_metadata(ctx, metadata) == []


def test_revisions_are_an_append_only_history(sqlite_env: JobEnv) -> None:
    engine = sqlite_env.engine
    assert rs.get_settings(engine)["revision"] == 0
    for n in range(1, 4):
        view = rs.put_settings(engine, {"retention.events_days": n}, n - 1, "root")
        assert view["revision"] == n
    assert sqlite_env.sql("SELECT revision FROM runtime_settings ORDER BY revision") == [(1,), (2,), (3,)]
    assert rs.get_settings(engine)["saved"] == {"retention.events_days": 3}
    with pytest.raises(rs.SettingsConflict) as caught:
        rs.put_settings(engine, {}, 2, "root")
    assert caught.value.current == 3


def test_concurrent_saves_on_one_revision_one_wins(sqlite_env: JobEnv, tmp_path: Path) -> None:
    outcomes: list[str] = []
    engines = [make_engine(sqlite_env.url) for _ in range(4)]

    def save(i: int) -> None:
        try:
            rs.put_settings(engines[i], {"retention.events_days": i + 1}, 0, f"admin{i}")
            outcomes.append("saved")
        except rs.SettingsConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=save, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in engines:
        e.dispose()
    assert sorted(outcomes) == ["conflict"] * 3 + ["saved"]


def test_a_failed_save_publishes_nothing(sqlite_env: JobEnv) -> None:
    engine = sqlite_env.engine
    rs.put_settings(engine, {"retention.events_days": 2}, 0, "root")
    with pytest.raises(rs.SettingsInvalid) as caught:
        rs.put_settings(engine, {"retention.events_days": 9, "jobs.default_max_attempts": 0}, 1, "root")
    assert set(caught.value.errors) == {"jobs.default_max_attempts"}
    with pytest.raises(rs.SettingsInvalid):
        rs.put_settings(engine, {"queues.q.paused": True}, 1, "root", queues={"default"})
    with pytest.raises(rs.SettingsInvalid):
        rs.put_settings(engine, {"broker_url": "redis://x"}, 1, "root")
    view = rs.get_settings(engine)
    assert view["revision"] == 1 and view["saved"] == {"retention.events_days": 2}


def test_secrets_are_never_returned_nor_logged(sqlite_env: JobEnv, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    engine = sqlite_env.engine
    view = rs.put_settings(engine, {"notify.webhook_secret": SECRET}, 0, "root")
    assert SECRET not in repr(view) and view["saved"]["notify.webhook_secret"] == {"set": True}
    view = rs.put_settings(engine, {"retention.events_days": 1}, 1, "root")  # omitted: kept
    assert SECRET not in repr(view) and view["effective"]["notify.webhook_secret"] == {"set": True}
    assert SECRET not in repr(rs.get_settings(engine))
    assert rs.saved_values(engine)["notify.webhook_secret"] == SECRET  # components of the deployment read it
    with pytest.raises(rs.SettingsInvalid) as caught:
        rs.put_settings(engine, {"notify.webhook_secret": ""}, 2, "root")
    assert SECRET not in str(caught.value.errors)
    # not a Standard Webhooks secret: refused at save time (receivers could never verify it), not echoed
    for bad in ("do-not-print-me-0123", "whsec_" + "QUJD" * 4, "whsec_" + SECRET[6:] + "$"):
        with pytest.raises(rs.SettingsInvalid) as caught:
            rs.put_settings(engine, {"notify.webhook_secret": bad}, 2, "root")
        assert "Standard Webhooks" in caught.value.errors["notify.webhook_secret"] and bad not in str(caught.value)
    view = rs.put_settings(engine, {"notify.webhook_secret": None}, 2, "root")
    assert view["effective"]["notify.webhook_secret"] == {"set": False}
    assert SECRET not in caplog.text


def test_effective_layers_and_pending_restart(sqlite_env: JobEnv) -> None:
    engine = sqlite_env.engine
    env_settings = Settings(database_url=sqlite_env.url, broker_url=sqlite_env.url, max_attempts=4)
    view = rs.get_settings(engine, env_settings)
    assert view["effective"]["jobs.default_max_attempts"] == 4  # env over the default
    assert view["deployment"]["database_url"] == sqlite_env.url  # shown, read-only
    view = rs.put_settings(engine, {"jobs.default_max_attempts": 6}, 0, "root", settings=env_settings)
    assert view["effective"]["jobs.default_max_attempts"] == 4 and view["pending_restart"] == [
        "jobs.default_max_attempts"
    ]
    restarted = rs.overlay_settings(engine, env_settings)  # what a process does at start
    assert restarted.max_attempts == 6
    view = rs.get_settings(engine, restarted)
    assert view["effective"]["jobs.default_max_attempts"] == 6 and view["pending_restart"] == []


def test_running_jobs_on_an_older_snapshot_are_counted(sqlite_env: JobEnv) -> None:
    sqlite_env.declare("noop", lambda ctx: None)
    job = sqlite_env.submit("noop")
    assert sqlite_env.claim(job.id) is not None  # running, submitted before any save
    queued = sqlite_env.submit("noop")
    assert queued.status == "queued"
    older = partial(running_jobs_submitted_before, sqlite_env.engine)
    view = rs.put_settings(sqlite_env.engine, {"retention.events_days": 2}, 0, "root", older_snapshots=older)
    assert view["jobs_on_older_snapshot"] == 1
    sqlite_env.sql("UPDATE jobs SET created_at = :t WHERE id = :id", t=10**15, id=job.id)
    assert rs.get_settings(sqlite_env.engine, older_snapshots=older)["jobs_on_older_snapshot"] == 0


def test_the_resync_reads_saved_retention(sqlite_env: JobEnv) -> None:
    engine = sqlite_env.engine
    settings = Settings(database_url=sqlite_env.url, broker_url=sqlite_env.url, retention_fires_days=3)
    day_s = 86_400.0
    # nothing saved: the environment's values (and the defaults)
    in_force = retention_in_force(engine, MaintenanceConfig(), settings)
    assert in_force.fire_retention_s == 3 * day_s and in_force.dead_letter_retention_ms == 7 * 86_400_000
    assert in_force.jobs.jobs_s["succeeded"] == 7 * day_s and in_force.jobs.events_s == 30 * day_s
    rs.put_settings(
        engine,
        {"retention.finished_jobs_days": 2, "retention.events_days": None, "retention.dead_letters_days": 1},
        0,
        "root",
    )
    in_force = retention_in_force(engine, MaintenanceConfig(fire_retention_s=60), settings)
    assert all(s == 2 * day_s for s in in_force.jobs.jobs_s.values()) and in_force.jobs.events_s == 30 * day_s
    assert in_force.dead_letter_retention_ms == 86_400_000
    assert in_force.fire_retention_s == 60  # an explicit MaintenanceConfig value wins


def test_queue_pause_key_applies_on_the_broker(sqlite_env: JobEnv) -> None:
    """The web layer applies ``changed`` keys on the broker (webapp.runtime_settings.apply)."""
    from types import SimpleNamespace

    from accounts.audit import Entry
    from jobs.db import write_session
    from webapp import runtime_settings as web_rs
    from webapp.audit_log import Audited

    broker = sqlite_env.broker
    broker.declare_queue("default")
    svc = SimpleNamespace(
        engine=sqlite_env.engine, broker=broker, settings=sqlite_env.settings, jobs=SimpleNamespace(schedules=list)
    )

    def save(values: dict, revision: int) -> dict:  # type: ignore[type-arg]
        # As the web app saves: in one transaction with its audit record; the keys apply after the commit.
        with write_session(sqlite_env.engine) as session:
            return web_rs.save(svc, values, revision, "root", act=Audited(session, Entry("settings.save")))  # type: ignore[arg-type]

    view = save({"queues.default.paused": True}, 0)
    assert view["warnings"] == [] and {s.queue: s.paused for s in broker.stats()}["default"]
    save({"queues.default.paused": False}, 1)
    assert not {s.queue: s.paused for s in broker.stats()}["default"]
