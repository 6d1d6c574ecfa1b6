"""The supervisors' ``worker_slots`` table: migration == model, and what a supervisor's report writes.

The report is driven here through its Report methods with real Slot objects and a real migrated SQLite
file; the supervisor loop itself runs in tests/acceptance/operations/test_supervision.py.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, text

from jobs.db import make_engine, write
from jobs.schema import upgrade
from monitoring import store
from monitoring.models import metadata
from tenure_cli.slot_report import SlotReport
from tenure_cli.supervisor import GIVEN_UP, RESTARTING, RestartPolicy, Slot
from tests.integration.jobs.support import postgres_database


@pytest.fixture()
def engine(sqlite_url: str) -> Iterator[Engine]:
    upgrade(sqlite_url)
    e = make_engine(sqlite_url)
    try:
        yield e
    finally:
        e.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def database(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[tuple[Engine, str]]:
    """A migrated job database, SQLite or PostgreSQL (the report bounds its calls differently on each)."""
    if request.param == "sqlite":
        url = sqlite_url
        upgrade(url)
        e = make_engine(url)
        try:
            yield e, url
        finally:
            e.dispose()
        return
    with postgres_database(migrated=True) as url:
        e = make_engine(url)
        try:
            yield e, url
        finally:
            e.dispose()


def test_migration_equals_the_model(engine: Engine) -> None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={"compare_type": True, "include_object": lambda o, n, t, r, c: t != "table" or n in metadata.tables},
        )
        assert compare_metadata(ctx, metadata) == []
        ddl = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'worker_slots'")).scalar_one()
    for ck in metadata.tables["worker_slots"].constraints:
        if ck.__class__.__name__ == "CheckConstraint":
            assert str(ck.sqltext) in ddl


def test_a_report_writes_its_slots_beats_and_removes_them_at_the_stop(database: tuple[Engine, str]) -> None:
    engine, url = database
    # Given a report of two slots, one restarting after a crash
    slots = [Slot(0, pid=101), Slot(1, pid=102)]
    report = SlotReport("worker", url)
    report.started(slots)
    slots[1].state, slots[1].pid, slots[1].crashes, slots[1].last_exit = RESTARTING, None, 1, "killed by SIGKILL"
    slots[1].last_exit_at, slots[1].restart_at = time.time(), time.time() + 0.5
    report.crashed(slots[1])

    # Then the live rows are the slots as they are now
    live = {r.slot: r for r in store.worker_slots_live(engine, int(time.time() * 1000))}
    assert (live[0].state, live[0].pid, live[0].role) == ("running", 101, "worker")
    assert (live[1].state, live[1].pid, live[1].crashes) == ("restarting", None, 1)
    assert live[1].last_exit == "killed by SIGKILL"
    assert live[1].restart_at is not None and live[0].supervisor == live[1].supervisor == report.supervisor

    # When the slot is given up, then its row says so (no pid, no restart time)
    slots[1].state, slots[1].restart_at, slots[1].crashes = GIVEN_UP, None, 10
    report.given_up(slots[1])
    row = {r.slot: r for r in store.worker_slots_live(engine, int(time.time() * 1000))}[1]
    assert (row.state, row.pid, row.restart_at, row.crashes) == ("given_up", None, None, 10)

    # When it stops, its rows are gone
    report.stopped()
    assert store.worker_slots_live(engine, int(time.time() * 1000)) == []


def test_rows_of_a_supervisor_that_stopped_heartbeating_are_hidden_then_pruned(engine: Engine, sqlite_url: str) -> None:
    # Given a supervisor that was killed: its rows' heartbeat is older than the staleness limit
    gone = SlotReport("worker", sqlite_url)
    gone.started([Slot(0, pid=201)])
    stale_ms = int(time.time() * 1000) - store.WORKER_SLOT_STALE_MS - 1
    with engine.begin() as conn:
        conn.execute(text("UPDATE worker_slots SET heartbeat_at = :t"), {"t": stale_ms})
    now_ms = int(time.time() * 1000)
    assert store.worker_slots_live(engine, now_ms) == []

    # When another supervisor starts, then those rows are deleted (its own are there)
    SlotReport("relay", sqlite_url).started([Slot(0, pid=301)])
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT role, pid FROM worker_slots")).fetchall()
    assert [tuple(r) for r in rows] == [("relay", 301)]
    with write(engine) as tx:
        assert store.worker_slots_prune(tx.conn, int(time.time() * 1000)) == 0


def test_no_database_file_or_an_unmigrated_one_is_never_written(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    SlotReport("worker", f"sqlite:///{missing}").started([Slot(0, pid=1)])
    assert not missing.exists()  # the supervisor never creates the job database

    bare = tmp_path / "bare.db"
    make_engine(f"sqlite:///{bare}").dispose()
    with make_engine(f"sqlite:///{bare}").begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    report = SlotReport("worker", f"sqlite:///{bare}")
    report.started([Slot(0, pid=1)])
    report.beat()
    report.stopped()
    with make_engine(f"sqlite:///{bare}").connect() as conn:
        tables = conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'")).scalars().all()
    assert tables == ["t"]


def test_the_backoff_doubles_up_to_its_maximum() -> None:
    policy = RestartPolicy(max_crashes=10, window_s=60, backoff_s=0.5, backoff_max_s=30)
    assert [policy.delay_s(n) for n in range(1, 10)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_a_write_that_finds_the_database_locked_is_logged_once_and_done_at_the_next_beat(
    engine: Engine, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a report whose first rows are written
    slots = [Slot(0, pid=401)]
    report = SlotReport("worker", sqlite_url)
    report.started(slots)
    # When another process holds SQLite's write lock for longer than the report waits (2 s) during a crash
    # and a restart
    locker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    slots[0].restarts, slots[0].pid = 1, 402
    with caplog.at_level(logging.INFO, logger="tenure.supervisor"):
        report.restarted(slots[0])
        report.crashed(slots[0])
        locker.execute("ROLLBACK")
        locker.close()
        # Then nothing raised, one warning was logged, and the next beat writes the slot as it is now
        report.beat()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Could not write slot states to the job database (will retry)" in warnings[0]
    assert "Slot states are written to the job database again." in caplog.text
    [row] = store.worker_slots_live(engine, int(time.time() * 1000))
    assert (row.pid, row.restarts) == (402, 1)
    report.stopped()
