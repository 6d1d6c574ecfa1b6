"""SQLiteBroker behaviour the other brokers don't share: leases, fencing, dead letters, operators' API,
transactional enqueue, fork safety and SQLite hygiene.

Time is never slept through: leases are aged with ``UPDATE`` and every wait polls a row with a deadline.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import sqlalchemy
from dramatiq import Worker
from dramatiq.common import current_millis
from dramatiq.message import Message

import broker.connection
import broker.sqlite
import broker.store
from broker import DeadMatch, SQLiteBroker, UnsupportedDatabase
from broker.consumer import SQLiteMessageProxy
from broker.leases import WAL_CHECKPOINT_BYTES
from tests.integration.forking import run_forked

REPO = Path(__file__).resolve().parents[2]
QUEUE = "work"
WAIT_S = 15.0


def wait_until(predicate: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.005)


def raw(path: Path) -> sqlite3.Connection:
    """A plain autocommit connection to the broker's file, as an operator or test would open one."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    return conn


def msg(n: int = 0, queue: str = QUEUE, **options: Any) -> Message:
    return Message(queue_name=queue, actor_name="act", args=(n,), kwargs={}, options=options)


def row(path: Path, row_id: int) -> tuple | None:
    with raw(path) as conn:
        return conn.execute(
            "SELECT state, lease_owner, deliveries FROM broker_messages WHERE id = ?", (row_id,)
        ).fetchone()


def count(path: Path, where: str = "1") -> int:
    conn = raw(path)
    try:
        return conn.execute(f"SELECT count(*) FROM broker_messages WHERE {where}").fetchone()[0]
    finally:
        conn.close()


def next_message(consumer: Any, timeout_s: float = WAIT_S) -> SQLiteMessageProxy:
    return wait_until(lambda: next(consumer), timeout_s, "a delivery")


@pytest.fixture()
def make_broker(sqlite_url: str) -> Iterator[Callable[..., SQLiteBroker]]:
    """Build brokers on the test's file (several = several lease owners); all closed afterwards."""
    made: list[SQLiteBroker] = []

    def make(**kwargs: Any) -> SQLiteBroker:
        kwargs.setdefault("lease_ttl_ms", 60_000)  # heartbeats stay out of the way of aged leases
        b = SQLiteBroker(sqlite_url, **kwargs)
        b.declare_queue(QUEUE)
        made.append(b)
        return b

    yield make
    for b in reversed(made):
        b.close()


@pytest.fixture()
def sqlite_broker(make_broker: Callable[..., SQLiteBroker]) -> SQLiteBroker:
    return make_broker()


# -- configuration and schema ---------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [0, 999])
def test_lease_ttl_under_one_second_is_refused(sqlite_url: str, ttl: int) -> None:
    with pytest.raises(ValueError, match="lease_ttl_ms"):
        SQLiteBroker(sqlite_url, lease_ttl_ms=ttl)


def test_lease_ttl_of_exactly_one_second_is_accepted(sqlite_url: str) -> None:
    SQLiteBroker(sqlite_url, lease_ttl_ms=1000).close()


def test_old_sqlite_is_refused_with_the_version_needed(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker.connection.sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(broker.connection.sqlite3, "sqlite_version", "3.34.1")

    with pytest.raises(UnsupportedDatabase, match=r"3\.34\.1.*3\.35"):
        SQLiteBroker(sqlite_url)


def test_schema_is_created_on_first_use(sqlite_broker: SQLiteBroker, sqlite_path: Path) -> None:
    sqlite_broker.enqueue(msg())

    with raw(sqlite_path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = conn.execute("SELECT value FROM broker_meta WHERE key = 'schema_version'").fetchone()[0]
    assert {"broker_messages", "broker_queues", "broker_processes", "broker_meta"} <= tables
    assert int(version) == broker.SCHEMA_VERSION


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_newer_schema_written_by_the_broker_is_refused_and_left_untouched(sqlite_url: str, sqlite_path: Path) -> None:
    # Given a database a newer broker upgraded
    first = SQLiteBroker(sqlite_url)
    first.stats()
    first.close()
    with raw(sqlite_path) as conn:
        conn.execute("UPDATE broker_meta SET value = ? WHERE key = 'schema_version'", (broker.SCHEMA_VERSION + 1,))
    digest = _digest(sqlite_path)

    # When this broker opens it, Then it refuses clearly and changes nothing
    b = SQLiteBroker(sqlite_url)
    with pytest.raises(UnsupportedDatabase, match=rf"schema version {broker.SCHEMA_VERSION + 1}.*Upgrade"):
        b.stats()
    b.close()
    assert _digest(sqlite_path) == digest


def test_newer_schema_in_a_rollback_journal_file_is_refused_and_left_byte_identical(
    sqlite_url: str, sqlite_path: Path
) -> None:
    # Given a database created by a newer Tenure's migrations (Alembic leaves journal_mode=delete)
    conn = sqlite3.connect(sqlite_path)
    conn.execute("CREATE TABLE broker_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")
    conn.execute("INSERT INTO broker_meta VALUES ('schema_version', ?)", (str(broker.SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    digest = _digest(sqlite_path)

    b = SQLiteBroker(sqlite_url)
    with pytest.raises(UnsupportedDatabase, match="schema version"):
        b.stats()
    b.close()
    assert _digest(sqlite_path) == digest


# -- fencing ------------------------------------------------------------------------------------------


def _steal(path: Path, thief: SQLiteBroker, message: SQLiteMessageProxy) -> SQLiteMessageProxy:
    """Expire *message*'s lease, let *thief* reap and claim it; return the thief's delivery."""
    with raw(path) as conn:
        assert conn.execute("UPDATE broker_messages SET lease_expires = 0 WHERE id = ?", (message._row_id,)).rowcount
    assert thief.reap() == 1
    stolen = next_message(thief.consume(QUEUE, prefetch=1, timeout=100))
    assert stolen._row_id == message._row_id and stolen.message_id == message.message_id
    assert stolen._deliveries == 2
    return stolen


@pytest.mark.parametrize("late", ["ack", "nack", "requeue"])
def test_a_stale_owner_cannot_settle_a_reclaimed_message(
    make_broker: Callable[..., SQLiteBroker], sqlite_path: Path, late: str
) -> None:
    # Given owner A's delivery whose lease expired and which owner B reclaimed
    a, b = make_broker(), make_broker()
    assert a.owner != b.owner
    a.enqueue(msg())
    consumer_a = a.consume(QUEUE, prefetch=1, timeout=100)
    delivery = next_message(consumer_a)
    stolen = _steal(sqlite_path, b, delivery)

    # When A settles it late
    getattr(consumer_a, late)([delivery] if late == "requeue" else delivery)

    # Then nothing changes: the row stays leased by B on its second delivery
    if late != "requeue":
        wait_until(lambda: a.leases_lost == 1, what="the lost lease to be counted")
    assert row(sqlite_path, delivery._row_id) == (1, b.owner, 2)
    assert b.dead_letters_list(QUEUE) == []
    assert b.leases_lost == 0

    # And B's own ack still works
    b.consume(QUEUE, prefetch=1, timeout=100).ack(stolen)
    b.join(QUEUE, timeout=10_000)
    assert row(sqlite_path, delivery._row_id) is None


def test_the_same_owner_cannot_ack_an_older_delivery_of_a_row_it_claimed_again(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    sqlite_broker.enqueue(msg())
    consumer = sqlite_broker.consume(QUEUE, prefetch=2, timeout=100)
    first = next_message(consumer)
    second = _steal(sqlite_path, sqlite_broker, first)

    consumer.ack(first)

    wait_until(lambda: sqlite_broker.leases_lost == 1, what="the lost lease to be counted")
    assert row(sqlite_path, first._row_id) == (1, sqlite_broker.owner, 2)
    consumer.ack(second)
    sqlite_broker.join(QUEUE, timeout=10_000)


def test_a_batch_of_acks_is_one_delete_that_skips_a_delivery_the_owner_no_longer_holds(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    # Given three deliveries of this owner, the second of which it has since claimed again (delivery 2)
    for n in range(3):
        sqlite_broker.enqueue(msg(n))
    consumer = sqlite_broker.consume(QUEUE, prefetch=3, timeout=100)
    first, second, third = (next_message(consumer) for _ in range(3))
    again = _steal(sqlite_path, sqlite_broker, second)
    store = sqlite_broker.store
    statements: list[str] = []

    # When one batch acks all three as first delivered
    with store.write() as conn:
        conn.set_trace_callback(statements.append)
        try:
            acked = store.message_ack_many(
                conn, sqlite_broker.owner, [(d._row_id, d._deliveries) for d in (first, second, third)]
            )
        finally:
            conn.set_trace_callback(None)

    # Then one statement deleted the first and the third; the second stays leased on its second delivery
    assert acked == {first._row_id, third._row_id}
    assert [s.split()[0] for s in statements] == ["DELETE"], statements
    assert row(sqlite_path, first._row_id) is None and row(sqlite_path, third._row_id) is None
    assert row(sqlite_path, second._row_id) == (1, sqlite_broker.owner, 2)
    consumer.ack(again)
    sqlite_broker.join(QUEUE, timeout=10_000)


def test_more_messages_than_one_statement_takes_are_inserted_and_acked_in_several(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    sqlite_broker.stats()  # the schema, made on first use
    store = sqlite_broker.store
    n = broker.store.ROWS_PER_STATEMENT + 1
    now = current_millis()
    rows = [
        {"queue": QUEUE, "message_id": f"m{i}", "actor": "noop", "priority": 0, "eta": now, "enqueued_at": now,
         "body": b"{}"}
        for i in range(n)
    ]  # fmt: skip
    with store.write() as conn:
        store.message_insert_many(conn, rows)
        stored = conn.execute("SELECT id, message_id FROM broker_messages ORDER BY id").fetchall()
        conn.execute(
            "UPDATE broker_messages SET state = 1, lease_owner = 'me', lease_expires = ?, deliveries = 1", [now]
        )
        ids = [row_id for row_id, _ in stored]
        acked = store.message_ack_many(conn, "me", [(row_id, 1) for row_id in ids])
    assert [message_id for _, message_id in stored] == [f"m{i}" for i in range(n)]  # in the order given
    assert acked == set(ids) and count(sqlite_path) == 0


def test_a_lease_just_expired_is_reclaimed_and_one_not_yet_expired_is_not(
    make_broker: Callable[..., SQLiteBroker], sqlite_path: Path
) -> None:
    a, b = make_broker(), make_broker()
    a.enqueue(msg(1))
    a.enqueue(msg(2))
    consumer = a.consume(QUEUE, prefetch=2, timeout=100)
    d1, d2 = next_message(consumer), next_message(consumer)
    now = current_millis()
    with raw(sqlite_path) as conn:
        conn.execute("UPDATE broker_messages SET lease_expires = ? WHERE id = ?", (now - 1, d1._row_id))
        conn.execute("UPDATE broker_messages SET lease_expires = ? WHERE id = ?", (now + 60_000, d2._row_id))

    assert b.reap() == 1

    assert row(sqlite_path, d1._row_id) == (0, None, 1)
    assert row(sqlite_path, d2._row_id) == (1, a.owner, 1)


# -- undecodable and poison rows ------------------------------------------------------------------------


def _insert_row(path: Path, body: bytes, deliveries: int = 0, message_id: str | None = None) -> int:
    with raw(path) as conn:
        cur = conn.execute(
            "INSERT INTO broker_messages (queue, message_id, eta, deliveries, enqueued_at, body) "
            "VALUES (?, ?, 0, ?, 0, ?)",
            (QUEUE, message_id or str(uuid.uuid4()), deliveries, body),
        )
        return int(cur.lastrowid or 0)


def test_an_undecodable_row_is_dead_lettered_and_the_consumer_keeps_working(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    sqlite_broker.stats()  # schema
    bad = _insert_row(sqlite_path, b"\x00not json at all")
    good = sqlite_broker.enqueue(msg(7))
    consumer = sqlite_broker.consume(QUEUE, prefetch=2, timeout=100)

    delivered = next_message(consumer)
    consumer.ack(delivered)

    assert delivered.message_id == good.message_id
    [dead] = sqlite_broker.dead_letters_list(QUEUE)
    assert dead.id == bad
    assert "undecodable" in (dead.reason or "")
    sqlite_broker.join(QUEUE, timeout=10_000)


@pytest.mark.parametrize(("deliveries_before", "poison"), [(3, False), (4, True)])
def test_a_row_redelivered_more_than_max_deliveries_is_dead_lettered_as_poison(
    make_broker: Callable[..., SQLiteBroker], sqlite_path: Path, deliveries_before: int, poison: bool
) -> None:
    # Given max_deliveries=3 and a row already delivered `deliveries_before` times; the next delivery
    # is redelivery number `deliveries_before`, which is poison only when it exceeds 3
    b = make_broker(max_deliveries=3)
    b.stats()
    message = msg()
    row_id = _insert_row(sqlite_path, message.encode(), deliveries=deliveries_before, message_id=message.message_id)
    consumer = b.consume(QUEUE, prefetch=1, timeout=100)

    delivered = [m for m in (next(consumer) for _ in range(3)) if m is not None]

    dead = b.dead_letters_list(QUEUE)
    if poison:
        assert delivered == []
        assert [d.id for d in dead] == [row_id]
        assert "poison" in (dead[0].reason or "") and "3" in (dead[0].reason or "")
    else:
        assert [m.message_id for m in delivered] == [message.message_id]
        assert dead == []


# -- dead letters ---------------------------------------------------------------------------------------


def _nack_all(b: SQLiteBroker, n: int) -> list[str]:
    ids = [b.enqueue(msg(i)).message_id for i in range(n)]
    consumer = b.consume(QUEUE, prefetch=n, timeout=100)
    for _ in range(n):
        consumer.nack(next_message(consumer))
    wait_until(lambda: len(b.dead_letters_list(QUEUE)) == n, what=f"{n} dead letters")
    return ids


def test_replay_dead_moves_chosen_dead_letters_back_to_ready(sqlite_broker: SQLiteBroker) -> None:
    sent = _nack_all(sqlite_broker, 3)
    dead = sqlite_broker.dead_letters_list(QUEUE)
    assert sorted(d.message_id for d in dead) == sorted(sent)

    assert sqlite_broker.replay_dead(QUEUE, ids=[dead[0].id]) == 1
    consumer = sqlite_broker.consume(QUEUE, prefetch=5, timeout=100)
    replayed = next_message(consumer)
    assert replayed.message_id == dead[0].message_id
    assert not replayed.redelivered  # replay starts the delivery count afresh
    consumer.ack(replayed)
    assert [d.id for d in sqlite_broker.dead_letters_list(QUEUE)] == [d.id for d in dead[1:]]

    assert sqlite_broker.replay_dead(QUEUE) == 2
    again = sorted(next_message(consumer).message_id for _ in range(2))
    assert again == sorted(d.message_id for d in dead[1:])
    assert sqlite_broker.dead_letters_list(QUEUE) == []


def test_delete_dead_deletes_chosen_dead_letters_of_the_queue_only(sqlite_broker: SQLiteBroker) -> None:
    _nack_all(sqlite_broker, 3)
    first, *rest = sqlite_broker.dead_letters_list(QUEUE)
    live = sqlite_broker.enqueue(msg(99))

    assert sqlite_broker.delete_dead("other", ids=[first.id]) == 0  # ids of another queue are left alone
    assert sqlite_broker.delete_dead(QUEUE, ids=[first.id, first.id]) == 1
    assert [d.id for d in sqlite_broker.dead_letters_list(QUEUE)] == [d.id for d in rest]
    assert sqlite_broker.delete_dead(QUEUE) == 2
    assert sqlite_broker.dead_letters_list(QUEUE) == []
    consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
    assert next_message(consumer).message_id == live.message_id  # a live message is never a dead letter


def test_purge_dead_deletes_only_dead_letters_older_than_the_ttl(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    _nack_all(sqlite_broker, 2)
    old, recent = sqlite_broker.dead_letters_list(QUEUE)
    now = current_millis()
    ttl = sqlite_broker.dead_message_ttl_ms
    with raw(sqlite_path) as conn:
        conn.execute("UPDATE broker_messages SET dead_at = ? WHERE id = ?", (now - ttl - 1000, old.id))
        conn.execute("UPDATE broker_messages SET dead_at = ? WHERE id = ?", (now - ttl + 60_000, recent.id))

    assert sqlite_broker.purge_dead() == 1

    assert [d.id for d in sqlite_broker.dead_letters_list(QUEUE)] == [recent.id]
    assert sqlite_broker.purge_dead(older_than_ms=0) == 1
    assert sqlite_broker.dead_letters_list(QUEUE) == []


def test_bulk_replay_and_purge_take_what_the_match_selects_up_to_the_counted_row(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    # Given dead letters of two actors on two queues, one of them dead for a day
    b = sqlite_broker
    b.declare_queue("other")
    for queue, actor, n in (("work", "act", 3), ("other", "act", 1), ("work", "tidy", 2)):
        for i in range(n):
            b.enqueue(Message(queue_name=queue, actor_name=actor, args=(i,), kwargs={}, options={}))
    with raw(sqlite_path) as conn:
        conn.execute("UPDATE broker_messages SET state = 2, dead_at = ?, dead_reason = 'nack'", (current_millis(),))
        oldest = conn.execute("SELECT min(id) FROM broker_messages").fetchone()[0]
        conn.execute("UPDATE broker_messages SET dead_at = dead_at - 86400000 WHERE id = ?", (oldest,))
    # When a dry run counts the work queue's "act" letters (the oldest two of them)
    matched, ids = b.dead_letters_match(DeadMatch(queue="work", actor="act"), limit=2)
    assert matched == 3 and len(ids) == 2 and ids[0] == oldest
    assert b.dead_letters_match(DeadMatch(dead_before=current_millis() - 3600_000), limit=10) == (1, [oldest])
    assert b.dead_letters_match(DeadMatch(queue="work.DQ"), limit=10)[0] == 5  # delay queues fold into theirs
    # And a letter of that match dies after the dry run
    b.enqueue(Message(queue_name="work", actor_name="act", args=(9,), kwargs={}, options={}))
    with raw(sqlite_path) as conn:
        conn.execute("UPDATE broker_messages SET state = 2, dead_at = ? WHERE state = 0", (current_millis(),))
    # Then the confirmed replay takes only what the dry run counted (through its last counted id)
    counted = DeadMatch(queue="work", actor="act", through_id=max(ids))
    assert b.replay_dead_matching(counted, limit=1000) == 2
    assert count(sqlite_path, "state = 0") == 2 and count(sqlite_path, "state = 2 AND actor = 'act'") == 3
    # And a purge by actor across queues deletes only that actor's letters
    assert b.purge_dead_matching(DeadMatch(actor="tidy"), limit=1000) == 2
    assert sorted(d.queue for d in b.dead_letters_list()) == ["other", "work", "work"]
    assert b.purge_dead_matching(DeadMatch(), limit=1) == 1  # the limit bounds one action


def test_a_failed_actor_is_dead_lettered_with_its_final_body(sqlite_broker: SQLiteBroker) -> None:
    def boom() -> None:
        raise ValueError("kaput")

    actor = dramatiq.actor(boom, broker=sqlite_broker, queue_name=QUEUE, max_retries=1, min_backoff=1, max_backoff=5)
    worker = Worker(sqlite_broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        sent = actor.send()
        [dead] = wait_until(lambda: sqlite_broker.dead_letters_list(QUEUE), what="the dead letter")
    finally:
        worker.stop()

    body = Message.decode(dead.body)
    assert dead.message_id == sent.message_id
    assert body.options["retries"] == 2
    assert "kaput" in body.options["traceback"]
    assert "eta" not in body.options
    assert "ValueError" in (dead.reason or "")


# -- operators' API -------------------------------------------------------------------------------------


def test_stats_count_ready_delayed_leased_dead_and_the_oldest_ready_age(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    # Given 1 dead, 1 leased, 1 delayed and 2 ready messages, the oldest ready one 5 s old
    _nack_all(sqlite_broker, 1)
    sqlite_broker.enqueue(msg(1))
    consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
    next_message(consumer)
    sqlite_broker.enqueue(msg(2), delay=600_000)
    first = sqlite_broker.enqueue(msg(3))
    sqlite_broker.enqueue(msg(4))
    with raw(sqlite_path) as conn:
        conn.execute("UPDATE broker_messages SET eta = eta - 5000 WHERE message_id = ?", (first.message_id,))

    [stats] = [s for s in sqlite_broker.stats() if s.queue == QUEUE]

    assert (stats.ready, stats.delayed, stats.leased, stats.dead) == (2, 1, 1, 1)
    assert stats.oldest_ready_age_ms is not None and 5000 <= stats.oldest_ready_age_ms < 15_000
    assert stats.paused is False


def _in_other_process(url: str, method: str, queue: str) -> None:
    code = (
        "import sys; from broker import SQLiteBroker; b = SQLiteBroker(sys.argv[1]); "
        "getattr(b, sys.argv[2])(sys.argv[3]); b.close()"
    )
    subprocess.run([sys.executable, "-c", code, url, method, queue], cwd=REPO, check=True, timeout=60)


def test_a_queue_paused_by_another_process_is_skipped_until_resumed(
    sqlite_broker: SQLiteBroker, sqlite_url: str
) -> None:
    consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
    sqlite_broker.enqueue(msg())

    _in_other_process(sqlite_url, "pause", QUEUE)

    assert [s.paused for s in sqlite_broker.stats() if s.queue == QUEUE] == [True]
    assert [m for m in (next(consumer) for _ in range(3)) if m is not None] == []

    _in_other_process(sqlite_url, "resume", QUEUE)

    consumer.ack(next_message(consumer))
    sqlite_broker.join(QUEUE, timeout=10_000)


# -- transactional enqueue ------------------------------------------------------------------------------


def test_enqueue_inside_a_sqlite3_transaction_is_visible_only_after_commit(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    sqlite_broker.stats()
    consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
    conn = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        # rolled back: gone
        conn.execute("BEGIN")
        sqlite_broker.enqueue(msg(1), connection=conn)
        conn.execute("ROLLBACK")
        assert count(sqlite_path) == 0

        # committed: invisible before, consumed after
        conn.execute("BEGIN")
        sent = sqlite_broker.enqueue(msg(2), connection=conn)
        assert count(sqlite_path) == 0
        assert next(consumer) is None
        conn.execute("COMMIT")
    finally:
        conn.close()

    delivered = next_message(consumer, timeout_s=5)
    assert delivered.message_id == sent.message_id
    consumer.ack(delivered)
    sqlite_broker.join(QUEUE, timeout=10_000)


def test_enqueue_inside_a_sqlalchemy_transaction_is_visible_only_after_commit(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    sqlite_broker.stats()
    consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
    engine = sqlalchemy.create_engine(f"sqlite:///{sqlite_path}")
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
            sqlite_broker.enqueue(msg(1), connection=conn)
            conn.rollback()
        assert count(sqlite_path) == 0

        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
            sent = sqlite_broker.enqueue(msg(2), connection=conn)
            assert count(sqlite_path) == 0
            assert next(consumer) is None
            conn.commit()
    finally:
        engine.dispose()

    delivered = next_message(consumer, timeout_s=5)
    assert delivered.message_id == sent.message_id
    consumer.ack(delivered)


def test_a_transactional_enqueue_on_the_brokers_own_connection_is_not_asked_which_file_it_is_on(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    """A fair-share refill publishes many messages in the ack writer's transaction, on the broker's own
    connection: the file check asks SQLite only about connections the broker did not open."""
    sqlite_broker.stats()
    asked: list[str] = []
    own = sqlite_broker.store.conn()
    other = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        for conn in (own, other):
            conn.set_trace_callback(asked.append)
            conn.execute("BEGIN IMMEDIATE")
            sqlite_broker.enqueue(msg(), connection=conn)
            conn.execute("COMMIT")
            conn.set_trace_callback(None)
            assert sqlite_broker.on_same_database(conn)
            # the broker's own connection is never asked; another one on the same file is, and accepted
            assert any("database_list" in s for s in asked) == (conn is other), asked
            asked.clear()
    finally:
        own.set_trace_callback(None)
        other.close()
    assert count(sqlite_path) == 2


def test_a_message_written_in_the_brokers_own_write_transaction_wakes_its_queue_when_that_commits(
    sqlite_broker: SQLiteBroker, sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's refill publishes in the ack writer's transaction, whose commit the broker makes itself: its
    queue's consumers are woken then, once per queue, without the commit watcher's polling; a rollback wakes
    nobody."""
    sqlite_broker.stats()
    woken: list[list[str]] = []
    wake = sqlite_broker.wake
    monkeypatch.setattr(sqlite_broker, "wake", lambda queues: (woken.append(list(queues)), wake(queues)))
    sent = [msg(0), msg(1)]
    with sqlite_broker.store.write() as conn:
        for message in sent:
            sqlite_broker.enqueue(message, connection=conn)
        assert woken == []
    assert woken == [[QUEUE]]
    with pytest.raises(RuntimeError), sqlite_broker.store.write() as conn:
        sqlite_broker.enqueue(msg(2), connection=conn)
        raise RuntimeError("rolled back")
    assert woken == [[QUEUE]]
    assert count(sqlite_path) == 2
    assert sqlite_broker not in broker.sqlite._CommitWatcher._by_broker
    consumer = sqlite_broker.consume(QUEUE, prefetch=2, timeout=100)
    try:
        assert {next_message(consumer).message_id for _ in sent} == {m.message_id for m in sent}
    finally:
        consumer.close()


def test_enqueue_many_in_the_brokers_own_transaction_is_one_insert_in_order_and_one_wake_at_its_commit(
    sqlite_broker: SQLiteBroker, sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window refill's messages, in the ack writer's transaction: one ``INSERT`` run for them all, delivered in
    the order given, their queue woken once when the transaction commits; in a caller's transaction each goes
    alone, followed by the commit watcher."""
    sqlite_broker.stats()
    woken: list[list[str]] = []
    wake = sqlite_broker.wake
    monkeypatch.setattr(sqlite_broker, "wake", lambda queues: (woken.append(list(queues)), wake(queues)))
    inserted: list[int] = []
    insert_many = sqlite_broker.store.message_insert_many
    monkeypatch.setattr(sqlite_broker.store, "message_insert", lambda *a, **k: pytest.fail("a message inserted alone"))
    monkeypatch.setattr(
        sqlite_broker.store,
        "message_insert_many",
        lambda conn, rows: inserted.append(len(rows)) or insert_many(conn, rows),
    )
    sent = [msg(n) for n in range(4)]
    statements: list[str] = []
    with sqlite_broker.store.write() as conn:
        conn.set_trace_callback(statements.append)
        returned = sqlite_broker.enqueue_many(
            [(m, 60_000 if n == 2 else None) for n, m in enumerate(sent)], connection=conn
        )
        conn.set_trace_callback(None)
        assert woken == []
    assert inserted == [4] and woken == [[QUEUE]]
    assert len([s for s in statements if s.startswith("INSERT INTO broker_messages")]) == 1, statements
    assert returned[2].queue_name.endswith(".DQ") and "eta" in returned[2].options  # as enqueue returns it
    assert [r.message_id for r in returned] == [m.message_id for m in sent]
    with pytest.raises(RuntimeError), sqlite_broker.store.write() as conn:
        sqlite_broker.enqueue_many([(msg(9), None)], connection=conn)
        raise RuntimeError("rolled back")
    assert woken == [[QUEUE]] and count(sqlite_path) == 4
    consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
    try:
        got = []
        for _ in range(3):
            delivery = next_message(consumer)
            consumer.ack(delivery)
            got.append(delivery.message_id)
        assert got == [sent[0].message_id, sent[1].message_id, sent[3].message_id]  # the delayed one waits
    finally:
        consumer.close()
    # A caller's own transaction: each message alone (the commit watcher follows its row)
    monkeypatch.undo()
    with sqlite3.connect(sqlite_path, isolation_level=None) as caller:
        caller.execute("BEGIN IMMEDIATE")
        sqlite_broker.enqueue_many([(msg(5), None), (msg(6), None)], connection=caller)
        caller.execute("COMMIT")
    caller.close()
    assert sqlite_broker in broker.sqlite._CommitWatcher._by_broker
    assert count(sqlite_path, "state IN (0, 3)") == 1 + 2  # the delayed one and these two (acks commit later)


def test_a_join_counts_a_queues_unfinished_messages_in_one_snapshot(sqlite_broker: SQLiteBroker) -> None:
    """A join's count of ready, delayed and leased messages is one statement: counted one state per statement,
    an ack committing between the counts took the message it had just enqueued (an ``on_success`` callback's)
    out of both counts, and Dramatiq's own callbacks test saw the join return before the callback ran."""
    sqlite_broker.enqueue(msg(0))
    sqlite_broker.enqueue(msg(1), delay=60_000)
    consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
    try:
        assert next_message(consumer) is not None  # leased now
        sqlite_broker.enqueue(msg(2))
        statements: list[str] = []
        with sqlite_broker.store.read() as conn:
            conn.set_trace_callback(statements.append)
            try:
                pending = sqlite_broker.store.queue_pending_count(conn, QUEUE)
            finally:
                conn.set_trace_callback(None)
    finally:
        consumer.close()
    assert pending == 3 and len(statements) == 1, statements


def test_transactional_enqueue_on_another_database_is_refused(sqlite_broker: SQLiteBroker, tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / "other.db", isolation_level=None)
    try:
        other.execute("BEGIN")
        with pytest.raises(UnsupportedDatabase, match="other.db"):
            sqlite_broker.enqueue(msg(), connection=other)
        other.execute("ROLLBACK")
    finally:
        other.close()


# -- process hygiene ------------------------------------------------------------------------------------


def test_a_forked_child_uses_the_broker_with_its_own_connections_and_owner(
    sqlite_broker: SQLiteBroker, sqlite_path: Path
) -> None:
    # Given a broker already used (connections, threads, leases) before fork
    sqlite_broker.enqueue(msg(0))
    consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
    consumer.ack(next_message(consumer))
    sqlite_broker.join(QUEUE, timeout=10_000)

    def child() -> str:
        sent = sqlite_broker.enqueue(msg(1))
        child_consumer = sqlite_broker.consume(QUEUE, prefetch=1, timeout=100)
        got = next_message(child_consumer, timeout_s=10)
        leased_by = row(sqlite_path, got._row_id)
        child_consumer.ack(got)
        sqlite_broker.join(QUEUE, timeout=10_000)
        ok = got.message_id == sent.message_id and leased_by is not None
        report = f"{sqlite_broker.owner}|{leased_by[1] if leased_by else ''}|{ok}"
        sqlite_broker.close()
        return report

    report = run_forked(child)
    child_owner, leased_by, ok = report.split("|")
    assert ok == "True"
    assert child_owner == leased_by != sqlite_broker.owner

    # And the parent still works
    sqlite_broker.enqueue(msg(2))
    consumer.ack(next_message(consumer))
    sqlite_broker.join(QUEUE, timeout=10_000)


def _wal_size(path: Path) -> int:
    try:
        return os.path.getsize(f"{path}-wal")
    except OSError:
        return 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_wal_stays_bounded_through_a_50k_message_burst(sqlite_broker: SQLiteBroker, sqlite_path: Path) -> None:
    n = 50_000
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _wal_size(sqlite_path))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    consumer = sqlite_broker.consume(QUEUE, prefetch=256, timeout=100)
    try:
        for i in range(n):
            sqlite_broker.enqueue(msg(i))
        drained = 0
        while drained < n:
            m = next(consumer)
            if m is not None:
                consumer.ack(m)
                drained += 1
        sqlite_broker.join(QUEUE, timeout=30_000)
    finally:
        stop.set()
        sampler.join()

    assert count(sqlite_path) == 0
    assert peak <= WAL_CHECKPOINT_BYTES, f"WAL peaked at {peak / 1e6:.1f} MB"
    assert _wal_size(sqlite_path) <= WAL_CHECKPOINT_BYTES


def _rows_in_database_file(path: Path, copy: Path) -> int | None:
    """Rows of ``broker_messages`` in the main database file alone (its WAL left out); None if the copy
    was torn by a checkpoint writing the file meanwhile."""
    copy.write_bytes(path.read_bytes())
    conn = sqlite3.connect(copy)
    try:
        return conn.execute("SELECT count(*) FROM broker_messages").fetchone()[0]
    except sqlite3.DatabaseError:
        return None
    finally:
        conn.close()
        for leftover in (copy, Path(f"{copy}-wal"), Path(f"{copy}-shm")):
            leftover.unlink(missing_ok=True)


def test_a_consumer_checkpoints_the_wal_soon_after_its_acks_commit(
    make_broker: Callable[..., SQLiteBroker], sqlite_path: Path, tmp_path: Path
) -> None:
    # Given a consumer process and three messages due in an hour: a few WAL pages, far below the
    # automatic checkpoint's 1,000, so without a checkpointer the database file would not hold them
    b = make_broker()
    consumer = b.consume(QUEUE, prefetch=1, timeout=100)
    for i in range(3):
        b.enqueue(msg(i), delay=3_600_000)

    # When the consumer settles one more message (its ack writer commits)
    b.enqueue(msg(99))
    delivered = wait_until(lambda: next(consumer), what="the due message to be delivered")
    consumer.ack(delivered)

    # Then the database file itself holds the three delayed messages shortly after
    wait_until(
        lambda: _rows_in_database_file(sqlite_path, tmp_path / "file-only.db") == 3,
        5,
        "the WAL to be checkpointed into the database file",
    )


@pytest.mark.timeout(60)
def test_a_reader_pinning_the_wal_does_not_stall_writers_and_the_wal_shrinks_after(
    make_broker: Callable[..., SQLiteBroker], sqlite_path: Path
) -> None:
    # Given a consumer process (its keeper checkpoints) and a reader holding an old snapshot, so the
    # WAL grows past the checkpoint threshold
    b = make_broker(lease_ttl_ms=3000, busy_timeout_ms=3000)
    b.consume(QUEUE, prefetch=1, timeout=100)
    reader = raw(sqlite_path)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM broker_messages").fetchone()

    # When producers keep enqueueing for a few keeper rounds
    worst = 0.0
    until = time.monotonic() + 3 * b.reap_interval_s + 1
    try:
        while time.monotonic() < until or _wal_size(sqlite_path) <= WAL_CHECKPOINT_BYTES:
            started = time.monotonic()
            b.enqueue(msg())
            worst = max(worst, time.monotonic() - started)
    finally:
        reader.execute("COMMIT")
        reader.close()

    # Then no enqueue waited on the checkpoint, and once the reader is gone the WAL is cut back
    assert worst < 1.0, f"an enqueue waited {worst:.2f}s for the write lock"
    wait_until(lambda: _wal_size(sqlite_path) <= WAL_CHECKPOINT_BYTES, 10, "the WAL to be checkpointed")


@pytest.mark.timeout(90)
def test_a_database_is_locked_storm_loses_no_ack_and_runs_everything_once(
    make_broker: Callable[..., SQLiteBroker], sqlite_path: Path
) -> None:
    # Given a worker whose SQLite waits only 300 ms for the write lock, so a 2 s lock really fails its
    # claims, acks and heartbeats with "database is locked"
    b = make_broker(lease_ttl_ms=10_000, busy_timeout_ms=300)
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    def record(n: int) -> None:
        with lock:
            runs[n] += 1
        time.sleep(0.002)

    actor = dramatiq.actor(record, broker=b, queue_name=QUEUE, actor_name="record")
    n = 300
    for i in range(n):
        actor.send(i)
    worker = Worker(b, worker_timeout=100, worker_threads=4)
    worker.start()
    holder = raw(sqlite_path)
    try:
        wait_until(lambda: sum(runs.values()) >= 20, what="processing to start")

        # When another connection holds the write lock for 2 s while the worker is busy
        holder.execute("BEGIN IMMEDIATE")
        time.sleep(2.0)  # the storm itself
        holder.execute("COMMIT")

        # Then every message runs exactly once and every ack lands
        wait_until(lambda: len(runs) == n, 60, f"{n} distinct runs")
        b.join(QUEUE, timeout=30_000)
    finally:
        holder.close()
        worker.stop()
    assert sorted(runs) == list(range(n))
    assert set(runs.values()) == {1}
    assert b.leases_lost == 0
    assert count(sqlite_path) == 0
