"""The resync on a real SQLite file: it reclaims expired leases, purges, prunes, refreshes; twice is harmless."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import dramatiq

from broker import SQLiteBroker
from tasks.maintenance import MaintenanceConfig, ResyncReport, declare_resync, run_resync
from tasks.scheduling import Scheduler, every

from .conftest import Clock


def test_the_resync_actor_is_a_30_second_sub_minute_schedule(sqlite_url: str) -> None:
    broker = SQLiteBroker(sqlite_url)  # Dramatiq's default middleware, as a worker's broker has
    resync = declare_resync(broker)
    assert declare_resync(broker) is resync  # declared once per broker
    spec = resync.options["periodic"]
    assert spec.describe() == "every 30s" and spec.max_staleness_s is not None and spec.catchup == "latest"
    assert resync.queue_name == "maintenance" and resync.options["max_retries"] == 0
    broker.close()


def test_resync_reclaims_purges_prunes_and_refreshes_and_is_idempotent(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_path: Path
) -> None:
    def job() -> None:
        pass

    actor = dramatiq.actor(job, actor_name="job", queue_name="work", broker=sched_broker)
    dramatiq.actor(job, actor_name="ticking", queue_name="work", broker=sched_broker, periodic=every(seconds=60))
    # Given a message leased by a process that died long ago, and an old dead letter
    actor.send()
    actor.send()
    with sqlite3.connect(sqlite_path) as conn:
        first, second = (r[0] for r in conn.execute("SELECT id FROM broker_messages ORDER BY id"))
        conn.execute(
            "UPDATE broker_messages SET state = 1, lease_owner = 'ghost:1', lease_expires = 1, deliveries = 1 "
            "WHERE id = ?",
            (first,),
        )
        conn.execute("UPDATE broker_messages SET state = 2, dead_at = 1, dead_reason = 'old' WHERE id = ?", (second,))
    config = MaintenanceConfig(fire_retention_s=3600)
    # When two resyncs run at the same time
    reports: list[ResyncReport] = []
    threads = [threading.Thread(target=lambda: reports.append(run_resync(sched_broker, config=config))) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then the lease came back once, the dead letter went once, and nothing failed
    assert [r.errors for r in reports] == [(), ()]
    assert sum(r.leases_reaped or 0 for r in reports) == 1
    assert sum(r.dead_letters_purged or 0 for r in reports) == 1
    with sqlite3.connect(sqlite_path) as conn:
        assert conn.execute("SELECT state, lease_owner FROM broker_messages").fetchall() == [(0, None)]
    # And the schedules' view was written
    assert all(r.schedules_refreshed == 1 for r in reports)
    (view,) = scheduler.list()
    assert view.name == "ticking" and view.next_fire_ms is not None
    # And a third run has nothing left to do
    again = run_resync(sched_broker, config=config)
    assert again.leases_reaped == 0 and again.dead_letters_purged == 0 and again.errors == ()


def test_resync_prunes_finished_jobs_reports_and_counts_them(
    scheduler: Scheduler, sched_broker: SQLiteBroker, sqlite_url: str
) -> None:
    import jobs
    from jobs.registry import Registry
    from monitoring.metrics import REGISTRY
    from settings.environment import Settings

    # Given a job cancelled long ago, and a live job (it owns the newest event, which is never deleted)
    registry = Registry()
    registry.kind("noop", broker=sched_broker)(lambda ctx: None)
    settings = Settings(database_url=sqlite_url, broker_url=sqlite_url)
    engine = scheduler.engine
    old = jobs.submit(engine, owner_id="u", kind="noop", registry=registry, settings=settings)
    assert jobs.cancel(engine, old.id, by="u").job.status == "cancelled"
    live = jobs.submit(engine, owner_id="u", kind="noop", registry=registry, settings=settings)
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE jobs SET completed_at = 1 WHERE id = ?", (old.id,))
    pruned_before = REGISTRY.get_sample_value("tenure_rows_pruned_total", {"table": "jobs"}) or 0.0
    # When the resync runs (retention from the settings in force: cancelled jobs 30 days)
    report = run_resync(sched_broker, config=MaintenanceConfig(fire_retention_s=3600))
    # Then the old job and its events went, the live one stayed, and the counts say so
    assert report.errors == () and report.jobs_pruned == 1 and (report.events_pruned or 0) >= 2
    assert REGISTRY.get_sample_value("tenure_rows_pruned_total", {"table": "jobs"}) == pruned_before + 1
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        assert conn.execute("SELECT id FROM jobs").fetchall() == [(live.id,)]
    assert run_resync(sched_broker, config=MaintenanceConfig(fire_retention_s=3600)).jobs_pruned == 0
