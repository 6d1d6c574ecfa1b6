"""Live-feed subscriptions (jobs/feeds.py): a cursor per subscriber over the change feed, on SQLite and PostgreSQL.

A feed numbers the changes its owner filter lets through; other owners' changes never move its cursor.
Every cursor a feed handed out resumes exactly after itself (the position is found by counting the
owner's events from the feed's mark, forward or back), in another process as well; only its subscriber,
with the same filter, may resume it; the owner's events are read through ``ix_job_events_owner``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import db, feeds, store, transitions
from jobs.db import make_engine
from jobs.errors import CursorExpired
from jobs.queries import CursorUnknown

from .support import JobEnv, job_env

KIND = "feed_echo"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobEnv]:
    with job_env(request.param, tmp_path) as env:
        env.declare(KIND, lambda: None)
        yield env


def _drain(env: JobEnv, feed: feeds.Feed, limit: int = 100) -> list[feeds.FeedChange]:
    """Everything the feed has now (PostgreSQL serves a change once no older transaction is open: at once here)."""
    got: list[feeds.FeedChange] = []
    while batch := feeds.next_changes(env.engine, feed, limit):
        got.extend(batch)
    return got


def _what(changes: list[feeds.FeedChange]) -> list[tuple[str, int]]:
    return [(c.change.job_id, c.change.sequence) for c in changes]


def test_other_owners_changes_never_move_a_feeds_cursor(env: JobEnv) -> None:
    mine = feeds.open_feed(env.engine, "user:1", "u1")
    everyone = feeds.open_feed(env.engine, "user:9", None)
    start = mine.cursor
    assert start.endswith(".0") and len(start.split(".")[0]) == 16
    theirs = [env.submit(KIND, owner_id="u2").id for _ in range(30)]
    assert _drain(env, mine) == [] and mine.cursor == start  # passed over, without a trace
    own = env.submit(KIND, owner_id="u1").id
    (change,) = _drain(env, mine)
    assert change.cursor == f"{start[:16]}.1" and change.change.job_id == own
    # An admin's feed (no owner filter) numbers every change.
    seen = _drain(env, everyone)
    assert [c.change.job_id for c in seen] == [*theirs, own]
    assert [c.cursor for c in seen] == [f"{everyone.id}.{n}" for n in range(1, 32)]


def test_every_cursor_of_a_feed_resumes_right_after_itself(env: JobEnv) -> None:
    feed = feeds.open_feed(env.engine, "user:1", "u1")
    delivered: list[feeds.FeedChange] = []
    for round_ in range(4):
        for i in range(5):
            env.submit(KIND, owner_id="u2")  # others' changes between the feed's own
            job = env.submit(KIND, owner_id="u1")
            if i % 2:
                with db.write(env.engine) as tx:
                    row = store.job_get(tx.conn, job.id)
                    assert row is not None and transitions.cancel_queued(tx, row, now=store.now_ms(), by="u1")
        delivered.extend(_drain(env, feed, limit=3))
        if round_ == 1:
            feeds.mark_feed(env.engine, feed)  # the mark now stands in the middle: counted forward and back
    assert len(delivered) == 4 * (5 + 2) and delivered[-1].cursor == feed.cursor
    cursors = [f"{feed.id}.0", *(c.cursor for c in delivered)]
    other_process = make_engine(env.url)  # another web process, on another host as far as the feed knows
    try:
        for k, cursor in enumerate(cursors):
            engine = other_process if k % 2 else env.engine
            resumed = feeds.resume_feed(engine, cursor, "user:1", "u1")
            assert resumed.cursor == cursor
            rest = []
            while batch := feeds.next_changes(engine, resumed, 7):
                rest.extend(batch)
            assert _what(rest) == _what(delivered[k:]), k  # nothing lost, nothing twice
            assert [c.cursor for c in rest] == cursors[k + 1 :]
    finally:
        other_process.dispose()


def test_a_cursor_resumes_only_for_its_subscriber_and_visibility(env: JobEnv) -> None:
    feed = feeds.open_feed(env.engine, "user:1", "u1")
    env.submit(KIND, owner_id="u1")
    (change,) = _drain(env, feed)
    for subscriber, owner in (("user:2", "u1"), ("user:1", None), ("user:1", "u2")):
        with pytest.raises(CursorUnknown):
            feeds.resume_feed(env.engine, change.cursor, subscriber, owner)
    with pytest.raises(CursorUnknown):  # more notices than the feed ever delivered
        feeds.resume_feed(env.engine, f"{feed.id}.2", "user:1", "u1")
    with pytest.raises(CursorUnknown):
        feeds.resume_feed(env.engine, "0123456789abcdef.0", "user:1", "u1")
    for malformed in ("1", "12.34", f"{feed.id}", f"{feed.id.upper()}.1", f"{feed.id}.-1"):
        with pytest.raises(ValueError):
            feeds.resume_feed(env.engine, malformed, "user:1", "u1")


def test_retention_inside_the_counted_range_expires_the_cursor(env: JobEnv) -> None:
    from jobs.retention import DAY_S, RetentionPolicy, prune

    feed = feeds.open_feed(env.engine, "user:1", "u1")
    jobs = [env.submit(KIND, owner_id="u1").id for _ in range(6)]
    for job_id in jobs[:3]:
        with db.write(env.engine) as tx:
            row = store.job_get(tx.conn, job_id)
            assert row is not None and transitions.cancel_queued(tx, row, now=store.now_ms(), by="u1")
    delivered = _drain(env, feed)
    assert len(delivered) == 9
    feeds.mark_feed(env.engine, feed)
    env.submit(KIND, owner_id="u2")  # the newest event row stays (SQLite would hand its id out again)
    policy = RetentionPolicy(jobs_s={s: DAY_S for s in ("succeeded", "failed", "cancelled", "interrupted")})
    assert prune(env.engine, policy, now=store.now_ms() + 10 * 86_400_000).jobs == 3
    # Counting back from the mark would cross deleted events: refused, not answered with a shifted place.
    with pytest.raises(CursorExpired):
        feeds.resume_feed(env.engine, delivered[1].cursor, "user:1", "u1")
    # The mark lies after everything deleted: it still resumes exactly.
    resumed = feeds.resume_feed(env.engine, feed.cursor, "user:1", "u1")
    assert _drain(env, resumed) == []
    newer = env.submit(KIND, owner_id="u1").id
    assert [(c.cursor, c.change.job_id) for c in _drain(env, resumed)] == [(f"{feed.id}.10", newer)]


def test_a_subscriber_keeps_its_newest_feeds(env: JobEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feeds, "FEEDS_PER_SUBSCRIBER", 3)
    opened = []
    for _ in range(5):  # one per millisecond at least: "newest" is by the time a feed was opened
        opened.append(feeds.open_feed(env.engine, "user:1", "u1"))
        time.sleep(0.002)
    other = feeds.open_feed(env.engine, "user:2", "u2")
    for feed in opened[2:] + [other]:
        assert feeds.resume_feed(env.engine, feed.cursor, feed.subscriber, feed.owner_id).cursor == feed.cursor
    for feed in opened[:2]:
        with pytest.raises(CursorUnknown):
            feeds.resume_feed(env.engine, feed.cursor, "user:1", "u1")


def test_a_users_changes_are_an_index_range(env: JobEnv) -> None:
    """The owner's events come from ``ix_job_events_owner`` in feed order: no walk over everyone's, no sort."""
    from sqlalchemy import event

    from jobs import read_store

    env.submit(KIND, owner_id="u1")
    statements: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append((statement, parameters))

    with db.read(env.engine) as conn:
        head = read_store.head_position(conn)
        event.listen(conn, "before_cursor_execute", capture)
        try:
            read_store.event_changes_after(conn, (0, 0), "u1", 10)
            read_store.event_position_nth(conn, "u1", 1, after=(0, 0), upto=head)
            read_store.event_position_nth(conn, "u1", 1, after=(0, 0), upto=head, backward=True)
        finally:
            event.remove(conn, "before_cursor_execute", capture)
        owner_reads = [(sql, params) for sql, params in statements if "owner_id" in sql]
        assert len(owner_reads) == 3
        for sql, params in owner_reads:
            if env.backend == "sqlite":
                plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params))
                assert "INDEX ix_job_events_owner (owner_id=?" in plan and "TEMP B-TREE" not in plan, plan
            else:
                conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # prove the index serves it, not the stats
                plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql, params))
                assert "ix_job_events_owner" in plan and "Sort" not in plan, plan


@pytest.mark.services
def test_a_late_committer_of_the_feeds_owner_is_served_not_skipped(tmp_path: Path) -> None:
    with job_env("postgres", tmp_path) as env:
        env.declare(KIND, lambda: None)
        early = env.submit(KIND, owner_id="u1")
        feed = feeds.open_feed(env.engine, "user:1", "u1")
        with db.write(env.engine) as tx:  # takes its transaction id now, commits after the submit below
            assert transitions.claim(tx, early.id, worker="h:1:w", lease_ms=60_000, now=store.now_ms())
            later = env.submit(KIND, owner_id="u1")
            assert feeds.next_changes(env.engine, feed, 10) == [] and feed.cursor.endswith(".0")
        got = _drain(env, feed)
    assert [(c.change.job_id, c.change.status) for c in got] == [(early.id, "running"), (later.id, "queued")]
    assert [c.cursor for c in got] == [f"{feed.id}.1", f"{feed.id}.2"]


def test_a_quiet_feeds_mark_follows_the_change_feed(env: JobEnv) -> None:
    """A feed that delivers nothing still moves its mark (every REFRESH_EVERY_MS): after retention deleted
    older events, its cursor resumes exactly instead of expiring."""
    from jobs.retention import DAY_S, RetentionPolicy, prune

    feed = feeds.open_feed(env.engine, "user:1", "u1")
    stale = feeds.Feed(feed.id, feed.subscriber, feed.owner_id, 0, feed.position)  # where the mark started
    others = [env.submit(KIND, owner_id="u2").id for _ in range(3)]
    for job_id in others:
        with db.write(env.engine) as tx:
            row = store.job_get(tx.conn, job_id)
            assert row is not None and transitions.cancel_queued(tx, row, now=store.now_ms(), by="u2")
    assert _drain(env, feed) == [] and feed.cursor.endswith(".0")
    assert not feeds.mark_due(feed, store.now_ms())  # nothing delivered, not a minute yet
    assert feeds.mark_due(feed, feed.marked_at + feeds.REFRESH_EVERY_MS)
    feeds.mark_feed(env.engine, feed)
    env.submit(KIND, owner_id="u2")  # the newest event row stays
    policy = RetentionPolicy(jobs_s={s: DAY_S for s in ("succeeded", "failed", "cancelled", "interrupted")})
    assert prune(env.engine, policy, now=store.now_ms() + 10 * 86_400_000).jobs == 3
    resumed = feeds.resume_feed(env.engine, feed.cursor, "user:1", "u1")  # from the moved mark: exact
    mine = env.submit(KIND, owner_id="u1").id
    assert [(c.cursor, c.change.job_id) for c in _drain(env, resumed)] == [(f"{feed.id}.1", mine)]
    with pytest.raises(CursorExpired):  # from where the mark started, the same cursor would have expired
        feeds.next_changes(env.engine, stale, 10)
