"""The PostgreSQL change cursor with a transaction that commits late: it is not skipped, and a job it
moves after a younger transaction did keeps its events in commit order (revisions 0009 and 0012).
Transactions of other databases on the same server do not hold the feed back.

The concurrent version, through two gunicorn processes, is tests/acceptance/jobs/test_live_feed.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from jobs import db, read_store, store, transitions
from jobs.queries import (
    ChangePage,
    CursorUnknown,
    change_head,
    changes_after,
    decode_position,
    encode_position,
)

from .support import PG_ADMIN_URL, JobEnv, job_env


@pytest.fixture()
def pg(tmp_path: Path) -> Iterator[JobEnv]:
    with job_env("postgres", tmp_path) as env:
        env.declare("feed_echo", lambda: None)
        yield env


def _until(env: JobEnv, cursor: str, count: int) -> ChangePage:
    """The changes after *cursor* once *count* are served (or what is served after a deadline)."""
    deadline = time.monotonic() + 20
    while True:
        page = changes_after(env.engine, cursor, is_admin=True)
        if len(page.items) >= count or time.monotonic() > deadline:
            return page
        time.sleep(0.02)


@pytest.mark.services
def test_a_late_committer_is_served_not_skipped(pg: JobEnv) -> None:
    early = pg.submit("feed_echo")
    start = change_head(pg.engine)
    with db.write(pg.engine) as tx:  # takes its transaction id now, commits after the submit below
        assert transitions.claim(tx, early.id, worker="h:1:w", lease_ms=60_000, now=store.now_ms())
        later = pg.submit("feed_echo")
        held_back = changes_after(pg.engine, start, is_admin=True)
        # The younger submit has committed, but the feed waits for the older open transaction (and its
        # cursor stays behind it: resuming from there serves both).
        assert held_back.items == []
    page = _until(pg, held_back.cursor, 2)
    assert [(c.job_id, c.status) for c in page.items] == [(early.id, "running"), (later.id, "queued")]
    assert changes_after(pg.engine, page.cursor, is_admin=True).items == []


@pytest.mark.services
def test_a_job_moved_by_an_older_open_transaction_keeps_its_order(pg: JobEnv) -> None:
    first = pg.submit("feed_echo")
    start = change_head(pg.engine)
    with db.write(pg.engine) as tx:
        assert transitions.claim(tx, first.id, worker="h:1:w", lease_ms=60_000, now=store.now_ms())
        second = pg.submit("feed_echo")  # a younger transaction, committed while this one is open
        row = store.job_get(tx.conn, second.id)
        assert row is not None and transitions.cancel_queued(tx, row, now=store.now_ms(), by="test")
    page = _until(pg, start, 3)
    moves = [(c.job_id, c.sequence, c.status) for c in page.items]
    assert [m for m in moves if m[0] == second.id] == [(second.id, 1, "queued"), (second.id, 2, "cancelled")]
    assert (first.id, 2, "running") in moves and len(moves) == 3


@pytest.mark.services
def test_a_cursor_past_a_head_that_moved_back_waits_and_one_past_every_transaction_is_unknown(
    pg: JobEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a suite's load the head once moved back below a cursor it had handed out: a transaction of another
    database, dropped from the horizon because pg_stat_activity named it, was in progress without being named
    a moment later. No session can be made to do that on demand, so the horizon is held back here instead."""
    cursor = change_head(pg.engine)
    real = read_store.head_position
    monkeypatch.setattr(read_store, "head_position", lambda conn: (real(conn)[0] - 50, real(conn)[1]))
    job = pg.submit("feed_echo")
    # Then the cursor is still the feed's: nothing new yet, and the same cursor back
    waiting = changes_after(pg.engine, cursor, is_admin=True)
    assert waiting.items == [] and waiting.cursor == cursor
    # and once the head is past it again, the change is served
    monkeypatch.setattr(read_store, "head_position", real)
    assert [c.job_id for c in _until(pg, cursor, 1).items] == [job.id]
    # but a cursor past every transaction id handed out is no cursor of this database
    xid, _ = decode_position(cursor)
    with pytest.raises(CursorUnknown):
        changes_after(pg.engine, encode_position((xid + 1_000_000, 0)), is_admin=True)


@pytest.mark.services
def test_an_open_transaction_in_another_database_does_not_hold_the_feed_back(pg: JobEnv) -> None:
    start = change_head(pg.engine)
    other = create_engine(PG_ADMIN_URL)  # another database on the same server
    try:
        with other.connect() as conn:
            conn.execute(text("SELECT pg_current_xact_id()"))  # a transaction id, as a bulk load would hold
            job = pg.submit("feed_echo")
            assert [c.job_id for c in _until(pg, start, 1).items] == [job.id]
            conn.rollback()
    finally:
        other.dispose()


def test_a_page_of_changes_reaches_past_the_feeds_backlog_bound(tmp_path: Path) -> None:
    """The live feed asks for LIVE_MAX_BACKLOG + 1 changes to tell a far-behind client to resync: a page
    must be able to hold that many (it was once capped at 500, so "behind" could never be seen)."""
    with job_env("sqlite", tmp_path) as env:
        env.declare("feed_echo", lambda: None)
        start = change_head(env.engine)
        for i in range(1_100):
            env.submit("feed_echo", idempotency_key=f"k{i}")
        page = changes_after(env.engine, start, is_admin=True, limit=1_001)
    assert len(page.items) == 1_001
