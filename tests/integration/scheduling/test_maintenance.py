"""The resync on a real SQLite file: it reclaims expired leases, purges, prunes, refreshes; twice is harmless."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import dramatiq

from broker import SQLiteBroker
from tasks.maintenance import MaintenanceConfig, ResyncReport, resync, run_resync
from tasks.scheduling import Scheduler, every

from .conftest import Clock


def test_the_resync_actor_is_a_30_second_sub_minute_schedule() -> None:
    spec = resync.options["periodic"]
    assert spec.describe() == "every 30s" and spec.max_staleness_s is not None and spec.catchup == "latest"
    assert resync.queue_name == "maintenance" and resync.options["max_retries"] == 0


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
