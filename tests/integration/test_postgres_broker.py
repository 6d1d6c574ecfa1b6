"""PostgresBroker behaviour beyond Dramatiq's own suite (tests/conformance runs that one against it too): leases
and fencing, expiry and reclaim, dead letters, native delays, transactional enqueue, wake-ups on commit, the
schema check and fork safety. Every test gets a fresh PostgreSQL database.

Time is never slept through: leases are aged with ``UPDATE`` and every wait polls a row with a deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy
from dramatiq.message import Message

from broker import UnsupportedDatabase, make_broker, postgres_store
from broker.postgres import PostgresBroker, PostgresMessageProxy, parse_postgres_url
from tests.integration.forking import run_forked
from tests.integration.jobs.support import postgres_database

pytestmark = pytest.mark.services

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


def msg(n: int = 0, queue: str = QUEUE, **options: Any) -> Message:
    return Message(queue_name=queue, actor_name="act", args=(n,), kwargs={}, options=options)


@pytest.fixture()
def database_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture()
def sql(database_url: str) -> Iterator[Callable[..., list[tuple]]]:
    """Run a statement on the test database in its own autocommit connection, as an operator would."""
    conn = psycopg.connect(parse_postgres_url(database_url).conninfo, autocommit=True)

    def run(statement: str, *params: Any) -> list[tuple]:
        cur = conn.execute(statement, params or None)
        return cur.fetchall() if cur.description else []

    yield run
    conn.close()


@pytest.fixture()
def engine(database_url: str) -> Iterator[sqlalchemy.Engine]:
    """A SQLAlchemy engine on the test database, for enqueues inside a caller's transaction."""
    made = sqlalchemy.create_engine(database_url)
    yield made
    made.dispose()


@pytest.fixture()
def brokers(database_url: str) -> Iterator[Callable[..., PostgresBroker]]:
    """Build brokers on the test's database (several = several lease owners); all closed afterwards."""
    made: list[PostgresBroker] = []

    def make(**kwargs: Any) -> PostgresBroker:
        kwargs.setdefault("lease_ttl_ms", 60_000)  # heartbeats stay out of the way of aged leases
        b = PostgresBroker(database_url, **kwargs)
        b.declare_queue(QUEUE)
        made.append(b)
        return b

    yield make
    for b in reversed(made):
        b.close()


def next_message(consumer: Any, timeout_s: float = WAIT_S) -> PostgresMessageProxy:
    return wait_until(lambda: next(consumer), timeout_s, "a delivery")


def row(sql: Callable[..., list[tuple]], row_id: int) -> tuple | None:
    rows = sql("SELECT state, lease_owner, deliveries FROM pgbroker_messages WHERE id = %s", row_id)
    return rows[0] if rows else None


def test_make_broker_builds_it_from_a_postgresql_url_and_it_creates_its_schema_on_first_use(
    database_url: str, sql: Callable[..., list[tuple]]
) -> None:
    b = make_broker(database_url.replace("postgresql+psycopg://", "postgresql://"), middleware=[])
    try:
        assert isinstance(b, PostgresBroker)
        assert sql("SELECT to_regclass('pgbroker_messages')") == [(None,)]
        b.declare_queue(QUEUE)
        b.enqueue(msg())
        assert sql("SELECT state, queue, deliveries FROM pgbroker_messages") == [(0, QUEUE, 0)]
    finally:
        b.close()


def test_a_newer_schema_is_refused_and_left_untouched(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    brokers().ensure_schema()
    sql("UPDATE pgbroker_meta SET value = '2' WHERE key = 'schema_version'")
    with pytest.raises(UnsupportedDatabase, match="schema version 2"):
        brokers().ensure_schema()
    assert sql("SELECT value FROM pgbroker_meta") == [("2",)]


def test_a_stale_owner_cannot_settle_a_reclaimed_message(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    # Given owner A's delivery whose lease expired and which owner B reclaimed
    a, b = brokers(), brokers()
    a.enqueue(msg())
    consumer_a = a.consume(QUEUE, prefetch=1, timeout=100)
    delivery = next_message(consumer_a)
    sql("UPDATE pgbroker_messages SET lease_expires = 0 WHERE id = %s", delivery._row_id)
    assert b.reap() == 1
    consumer_b = b.consume(QUEUE, prefetch=1, timeout=100)
    stolen = next_message(consumer_b)
    assert stolen._row_id == delivery._row_id and stolen.redelivered

    # When A acks it late
    consumer_a.ack(delivery)

    # Then nothing changes: the row stays leased by B on its second delivery
    wait_until(lambda: a.leases_lost == 1, what="the lost lease to be counted")
    assert row(sql, delivery._row_id) == (1, b.owner, 2)
    # And B's own ack still works
    consumer_b.ack(stolen)
    b.join(QUEUE, timeout=10_000)
    assert row(sql, delivery._row_id) is None


def test_a_lease_expired_in_a_dead_process_is_reclaimed_by_a_live_one(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    # Given a message leased by a process that died holding it (its lease is no longer renewed)
    brokers().ensure_schema()
    sql(
        "INSERT INTO pgbroker_messages (queue, message_id, actor, eta, state, lease_owner, lease_expires, "
        "deliveries, enqueued_at, body) VALUES (%s, 'm', 'act', 0, 1, 'gone:1:x', 1, 1, 0, %s)",
        QUEUE,
        msg(7).encode(),
    )
    # When a consuming process runs its lease keeper (every reap interval)
    live = brokers(lease_ttl_ms=1_000, reap_interval_s=0.05)
    consumer = live.consume(QUEUE, prefetch=1, timeout=100)
    got = next_message(consumer)
    # Then the message is delivered again, counted as its second delivery
    assert got.args == (7,) and got._deliveries == 2
    consumer.ack(got)
    live.join(QUEUE, timeout=10_000)


def test_a_message_redelivered_more_than_max_deliveries_is_dead_lettered(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    b = brokers(max_deliveries=2)
    b.enqueue(msg())
    sql("UPDATE pgbroker_messages SET deliveries = 3")
    consumer = b.consume(QUEUE, prefetch=1, timeout=100)
    assert next(consumer) is None
    assert sql("SELECT state, dead_reason FROM pgbroker_messages") == [(2, "poison: redelivered more than 2 times")]
    assert [(s.queue, s.dead) for s in b.stats()] == [(QUEUE, 1)]


def test_a_nacked_message_is_dead_lettered_with_its_reason_and_purged_after_the_ttl(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    b = brokers()
    b.enqueue(msg())
    consumer = b.consume(QUEUE, prefetch=1, timeout=100)
    delivery = next_message(consumer)
    delivery.stuff_exception(RuntimeError("boom"))
    consumer.nack(delivery)
    b.join(QUEUE, timeout=10_000)
    assert sql("SELECT state, dead_reason FROM pgbroker_messages") == [(2, "nack: RuntimeError: boom")]
    assert b.purge_dead(older_than_ms=60_000) == 0
    sql("UPDATE pgbroker_messages SET dead_at = dead_at - 120000")
    assert b.purge_dead(older_than_ms=60_000) == 1


def test_a_dry_queues_delayed_check_promotes_its_due_rows_and_finds_the_next_eta_in_one_statement(
    brokers: Callable[..., PostgresBroker], database_url: str, sql: Callable[..., list[tuple]]
) -> None:
    b = brokers()
    b.declare_queue("other")
    for n, queue in ((1, QUEUE), (2, QUEUE), (3, "other")):
        b.enqueue(msg(n, queue=queue), delay=60_000)
    # Message 1 and the other queue's are due now; message 2 is due in a minute.
    sql("UPDATE pgbroker_messages SET eta = eta - 60000 WHERE body NOT LIKE '%%[2]%%'")
    [(next_eta,)] = sql("SELECT eta FROM pgbroker_messages WHERE body LIKE '%%[2]%%'")
    statements: list[str] = []
    with psycopg.connect(parse_postgres_url(database_url).conninfo, autocommit=True) as conn:
        execute = conn.execute

        def counted(query: Any, *args: Any, **kwargs: Any) -> Any:
            statements.append(str(query))
            return execute(query, *args, **kwargs)

        conn.execute = counted  # type: ignore[method-assign]
        now = int(time.time() * 1000)
        assert postgres_store.delayed_promote(conn, QUEUE, now) == next_eta
        assert len(statements) == 1
        assert sql("SELECT queue, state FROM pgbroker_messages ORDER BY id") == [(QUEUE, 0), (QUEUE, 3), ("other", 3)]
        sql("DELETE FROM pgbroker_messages WHERE queue = %s AND state = 3", QUEUE)
        assert postgres_store.delayed_promote(conn, QUEUE, now) is None  # nothing of this queue is delayed now


def test_a_delayed_message_waits_for_its_eta_then_an_idle_consumer_gets_it(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    b = brokers()
    consumer = b.consume(QUEUE, prefetch=1, timeout=50)
    assert next(consumer) is None
    returned = b.enqueue(msg(1), delay=400)
    sent_at = time.monotonic()
    assert returned.queue_name == f"{QUEUE}.DQ" and "eta" in returned.options
    assert sql("SELECT state FROM pgbroker_messages") == [(3,)]
    got = next_message(consumer)
    assert time.monotonic() - sent_at >= 0.35
    assert got.args == (1,) and "eta" not in got.options
    consumer.ack(got)
    b.join(QUEUE, timeout=10_000)


def test_higher_broker_priority_is_delivered_first(brokers: Callable[..., PostgresBroker]) -> None:
    b = brokers()
    for n, priority in enumerate([0, 5, 1]):
        b.enqueue(msg(n, broker_priority=priority))
    consumer = b.consume(QUEUE, prefetch=3, timeout=100)
    assert [next_message(consumer).args[0] for _ in range(3)] == [1, 2, 0]


def _idle_consumer_waiting(b: PostgresBroker, sql: Callable[..., list[tuple]]) -> tuple[threading.Thread, list[Any]]:
    """A thread waiting (up to 5 s) for one message of *b*'s queue, and the list it appends that message to.

    Returns once the listener is up and the consumer has claimed nothing (their connections' last statements:
    LISTEN; the claim, or the delayed-message check after it). Whatever it does next, it read the queue's wake-up
    generation before that claim, so only a wake can end its wait early."""
    consumer = b.consume(QUEUE, prefetch=1, timeout=5_000)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(next(consumer)))
    waiter.start()
    wait_until(
        lambda: (
            sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' "
                "AND (query LIKE 'LISTEN%%' OR query LIKE 'WITH picked%%' OR query LIKE 'WITH promoted%%')"
            )
            == [(2,)]
        ),
        what="a listening broker and an idle consumer",
    )
    return waiter, got


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_enqueue_inside_a_sqlalchemy_transaction_wakes_an_idle_consumer_only_when_it_commits(
    brokers: Callable[..., PostgresBroker], engine: sqlalchemy.Engine, sql: Callable[..., list[tuple]], commit: bool
) -> None:
    b = brokers()
    b.ensure_schema()
    waiter, got = _idle_consumer_waiting(b, sql)
    with engine.connect() as conn:
        tx = conn.begin()
        b.enqueue(msg(3), connection=conn)
        assert sql("SELECT count(*) FROM pgbroker_messages") == [(0,)]  # not visible before the commit
        tx.commit() if commit else tx.rollback()
        ended_at = time.monotonic()
    waiter.join(10)
    if commit:
        # Woken by the commit's notification, well before its 5 s wait would end
        assert got and got[0].args == (3,) and time.monotonic() - ended_at < 2
    else:
        assert got == [None]


def test_an_enqueue_of_its_own_wakes_this_processs_idle_consumer_without_waiting_for_the_notification(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    b = brokers()
    b.ensure_schema()
    # No NOTIFY from here on: only the enqueue itself can end the consumer's 5 s wait early
    sql("ALTER TABLE pgbroker_messages DISABLE TRIGGER pgbroker_messages_notify")
    waiter, got = _idle_consumer_waiting(b, sql)
    b.enqueue(msg(7))
    sent_at = time.monotonic()
    waiter.join(10)
    assert got and got[0].args == (7,) and time.monotonic() - sent_at < 2


def test_transactional_enqueue_on_another_database_is_refused(brokers: Callable[..., PostgresBroker]) -> None:
    b = brokers()
    with postgres_database() as other:
        engine = sqlalchemy.create_engine(other)
        try:
            with engine.connect() as conn, conn.begin():
                with pytest.raises(UnsupportedDatabase, match="transactional enqueue needs a connection"):
                    b.enqueue(msg(), connection=conn)
        finally:
            engine.dispose()


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_enqueue_many_writes_its_messages_in_one_statement_in_order_inside_the_callers_transaction(
    brokers: Callable[..., PostgresBroker], engine: sqlalchemy.Engine, sql: Callable[..., list[tuple]], commit: bool
) -> None:
    b = brokers()
    b.ensure_schema()
    b.enqueue(msg(0))  # already waiting: the batch goes after it
    statements: list[str] = []
    with engine.connect() as conn:
        tx = conn.begin()
        raw = conn.connection.driver_connection
        execute = raw.execute
        raw.execute = lambda query, *args, **kwargs: statements.append(str(query)) or execute(query, *args, **kwargs)
        returned = b.enqueue_many([(msg(1), None), (msg(2), 60_000), (msg(3), None)], connection=conn)
        assert [r.args for r in returned] == [(1,), (2,), (3,)]
        assert returned[1].queue_name.endswith(".DQ") and "eta" in returned[1].options  # as enqueue returns it
        assert sql("SELECT count(*) FROM pgbroker_messages") == [(1,)]  # not visible before the commit
        tx.commit() if commit else tx.rollback()
    assert [s for s in statements if s.startswith("INSERT")] == [statements[-1]]
    assert statements[-1].count("), (") == 2  # three rows, one statement
    consumer = b.consume(QUEUE, prefetch=1, timeout=100)
    got = []
    for _ in range(3 if commit else 1):
        delivery = next_message(consumer)
        consumer.ack(delivery)
        got.append(delivery.args)
    assert got == ([(0,), (1,), (3,)] if commit else [(0,)])  # the delayed one waits for its eta
    assert sql("SELECT count(*) FROM pgbroker_messages WHERE state = 3") == ([(1,)] if commit else [(0,)])


def test_enqueue_many_past_one_statements_parameters_writes_one_statement_per_chunk_in_order(
    brokers: Callable[..., PostgresBroker], engine: sqlalchemy.Engine, sql: Callable[..., list[tuple]]
) -> None:
    b = brokers()
    b.ensure_schema()
    # 8 parameters each, 65,600 in all: more than PostgreSQL binds in one statement
    sent = [msg(n) for n in range(8_200)]
    with engine.begin() as conn:
        b.enqueue_many([(m, None) for m in sent], connection=conn)
    assert sql("SELECT message_id FROM pgbroker_messages ORDER BY id") == [(m.message_id,) for m in sent]


def test_requeued_deliveries_are_ready_again_without_counting_a_delivery(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    b = brokers()
    b.enqueue(msg())
    consumer = b.consume(QUEUE, prefetch=1, timeout=100)
    delivery = next_message(consumer)
    consumer.requeue([delivery])
    assert sql("SELECT state, lease_owner, deliveries FROM pgbroker_messages") == [(0, None, 0)]


def test_a_forked_child_uses_the_broker_with_its_own_connections_and_owner(
    brokers: Callable[..., PostgresBroker], database_url: str
) -> None:
    # Given a broker already used (connections, threads, leases) before fork
    b = brokers()
    b.enqueue(msg(0))
    consumer = b.consume(QUEUE, prefetch=1, timeout=100)
    consumer.ack(next_message(consumer))
    b.join(QUEUE, timeout=10_000)

    def child() -> str:
        sent = b.enqueue(msg(1))
        child_consumer = b.consume(QUEUE, prefetch=1, timeout=100)
        got = next_message(child_consumer, timeout_s=10)
        with psycopg.connect(parse_postgres_url(database_url).conninfo) as own:  # never the parent's socket
            found = own.execute("SELECT state, lease_owner FROM pgbroker_messages WHERE id = %s", (got._row_id,))
            leased_by = found.fetchone()
        child_consumer.ack(got)
        b.join(QUEUE, timeout=10_000)
        ok = got.message_id == sent.message_id and leased_by is not None
        report = f"{b.owner}|{leased_by[1] if leased_by else ''}|{ok}"
        b.close()
        return report

    report = run_forked(child)
    child_owner, leased_by, ok = report.split("|")
    assert ok == "True"
    assert child_owner == leased_by != b.owner

    # And the parent's connections still work
    b.enqueue(msg(2))
    consumer.ack(next_message(consumer))
    b.join(QUEUE, timeout=10_000)


def test_queue_depth_counts_each_state_and_the_operators_actions_it_lacks_are_refused(
    brokers: Callable[..., PostgresBroker], sql: Callable[..., list[tuple]]
) -> None:
    from broker.depth import POSTGRES, broker_kind, queue_depths
    from webapp.operations import Unavailable, pause_unavailable, require_operation

    b = brokers()
    for n in range(3):
        b.enqueue(msg(n))
    b.enqueue(msg(9), delay=60_000)
    consumer = b.consume(QUEUE, prefetch=1, timeout=100)
    next_message(consumer)
    sql("UPDATE pgbroker_messages SET enqueued_at = enqueued_at - 5000, eta = eta - 5000 WHERE state = 0")
    assert broker_kind(b) == POSTGRES
    [depth] = queue_depths(b)
    assert (depth.queue, depth.ready, depth.delayed, depth.leased, depth.dead, depth.consumers) == (
        QUEUE, 2, 1, 1, 0, None,
    )  # fmt: skip
    assert depth.oldest_ready_age_ms >= 5000
    assert "cannot be paused on the PostgresBroker" in (pause_unavailable(b) or "")
    for operation in ("dead_letters_list", "replay_dead", "unclean_exits"):
        with pytest.raises(Unavailable):
            require_operation(b, operation)
