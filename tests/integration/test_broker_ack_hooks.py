"""Writes that ride on the broker's ack group commit: ``SQLiteMessageProxy.in_ack_transaction`` hooks and
``SQLiteBroker.write_with_acks`` calls, on a real SQLite file."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dramatiq.message import Message

from broker import SQLiteBroker
from broker.errors import DatabaseUnavailable

QUEUE = "work"


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[SQLiteBroker]:
    b = SQLiteBroker(f"sqlite:///{tmp_path / 'b.db'}", middleware=[])
    b.declare_queue(QUEUE)
    with sqlite3.connect(b.target.path) as conn:
        conn.execute("CREATE TABLE notes (v TEXT PRIMARY KEY)")
    yield b
    b.close()


def _rows(b: SQLiteBroker, sql: str) -> list[tuple]:
    conn = sqlite3.connect(b.target.path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _note(value: str):  # type: ignore[no-untyped-def]
    def write(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO notes (v) VALUES (?)", (value,))
        return value

    return write


def _delivered(b: SQLiteBroker):  # type: ignore[no-untyped-def]
    b.enqueue(Message(queue_name=QUEUE, actor_name="act", args=(), kwargs={}, options={}))
    consumer = b.consume(QUEUE, prefetch=1, timeout=1000)
    message = next(consumer)
    assert message is not None
    return consumer, message


def test_hooks_commit_with_the_ack_and_run_their_after_commit_step(broker: SQLiteBroker) -> None:
    consumer, message = _delivered(broker)
    seen: list[int] = []

    def hook(conn: sqlite3.Connection):  # type: ignore[no-untyped-def]
        _note("with the ack")(conn)
        return lambda: seen.append(len(_rows(broker, "SELECT * FROM broker_messages")))

    message.in_ack_transaction(hook)
    consumer.ack(message)
    assert broker._acks is not None and broker._acks.flush(5)
    assert _rows(broker, "SELECT v FROM notes") == [("with the ack",)]
    assert seen == [0]  # after the commit: the message row was already gone
    consumer.close()


def test_a_failing_hook_rolls_back_alone_and_the_ack_commits(broker: SQLiteBroker) -> None:
    consumer, message = _delivered(broker)

    def bad(conn: sqlite3.Connection) -> None:
        _note("half")(conn)
        raise RuntimeError("hook bug")

    message.in_ack_transaction(bad)
    consumer.ack(message)
    assert broker._acks is not None and broker._acks.flush(5)
    assert _rows(broker, "SELECT v FROM notes") == []
    assert _rows(broker, "SELECT count(*) FROM broker_messages") == [(0,)]
    consumer.close()


def test_write_with_acks_returns_after_the_commit_and_isolates_failures(broker: SQLiteBroker) -> None:
    assert broker.write_with_acks(QUEUE, _note("one")) == "one"
    assert _rows(broker, "SELECT v FROM notes") == [("one",)]  # visible to another connection: committed
    with pytest.raises(sqlite3.IntegrityError):
        broker.write_with_acks(QUEUE, _note("one"))
    assert broker.write_with_acks(QUEUE, _note("two")) == "two"
    assert sorted(_rows(broker, "SELECT v FROM notes")) == [("one",), ("two",)]


def test_write_with_acks_after_the_writer_stopped_fails_at_once(broker: SQLiteBroker) -> None:
    broker.write_with_acks(QUEUE, _note("before"))
    assert broker._acks is not None
    broker._acks.stop(5)
    with pytest.raises(DatabaseUnavailable):
        broker.write_with_acks(QUEUE, _note("after"))


# -- batched writes: one function for the calls / hooks of one group commit ---------------------------
def _hold_the_writer(b: SQLiteBroker) -> tuple[threading.Event, threading.Thread]:
    """Block the ack writer inside a batch until the returned event is set, so that everything submitted
    meanwhile lands in its next batch together."""
    inside, release = threading.Event(), threading.Event()

    def blocking(conn: sqlite3.Connection) -> None:
        inside.set()
        release.wait(10)

    t = threading.Thread(target=b.write_with_acks, args=(QUEUE, blocking))
    t.start()
    assert inside.wait(5)
    return release, t


class _Batched:
    """A write run alone (``__call__``) or with the others of its batch (:meth:`batch`)."""

    sizes: list[int] = []
    fail_batches = False

    def __init__(self, value: str) -> None:
        self.value = value

    def __call__(self, conn: sqlite3.Connection) -> str:
        return _note(self.value)(conn) + " alone"

    @classmethod
    def batch(cls, conn: sqlite3.Connection, items: list[_Batched]) -> list[str]:
        cls.sizes.append(len(items))
        conn.executemany("INSERT INTO notes (v) VALUES (?)", [(i.value,) for i in items])
        if cls.fail_batches:
            raise RuntimeError("batch bug")
        return [i.value + " batched" for i in items]


@pytest.mark.parametrize("fail", [False, True], ids=["batched", "batch-fails-each-runs-alone"])
def test_calls_sharing_a_batch_function_run_together(broker: SQLiteBroker, fail: bool) -> None:
    _Batched.sizes, _Batched.fail_batches = [], fail
    release, holder = _hold_the_writer(broker)
    results: dict[str, str] = {}

    def call(value: str) -> None:
        results[value] = broker.write_with_acks(QUEUE, _Batched(value), batch=_Batched.batch)

    threads = [threading.Thread(target=call, args=(f"v{i}",)) for i in range(5)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while len(broker._acks._pending) < 5 and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.005)
    release.set()
    for t in [holder, *threads]:
        t.join(5)
    assert _Batched.sizes == [5]  # one call of the batch function for the five
    suffix = "alone" if fail else "batched"
    assert results == {f"v{i}": f"v{i} {suffix}" for i in range(5)}
    # a failed batch is rolled back before each runs alone: every value once
    assert sorted(_rows(broker, "SELECT v FROM notes")) == [(f"v{i}",) for i in range(5)]


@pytest.mark.parametrize("fail", [False, True], ids=["batched", "batch-fails-each-runs-alone"])
def test_ack_hooks_sharing_a_batch_function_run_together(broker: SQLiteBroker, fail: bool) -> None:
    for i in range(3):
        broker.enqueue(Message(queue_name=QUEUE, actor_name="act", args=(i,), kwargs={}, options={}))
    consumer = broker.consume(QUEUE, prefetch=3, timeout=1000)
    messages = [next(consumer) for _ in range(3)]
    assert all(m is not None for m in messages)
    after: list[str] = []
    seen: list[int] = []

    class Hook:
        def __init__(self, value: str) -> None:
            self.value = value

        def __call__(self, conn: sqlite3.Connection):  # type: ignore[no-untyped-def]
            _note(self.value)(conn)
            return lambda: after.append(self.value + " alone")

        @staticmethod
        def batch(conn: sqlite3.Connection, hooks: list[Hook]):  # type: ignore[no-untyped-def]
            seen.append(len(hooks))
            conn.executemany("INSERT INTO notes (v) VALUES (?)", [(h.value,) for h in hooks])
            if fail:
                raise RuntimeError("batch bug")
            return [(lambda v=h.value: after.append(v + " batched")) for h in hooks]

    release, holder = _hold_the_writer(broker)
    for i, m in enumerate(messages):
        m.in_ack_transaction(Hook(f"h{i}"))
        consumer.ack(m)
    release.set()
    holder.join(5)
    assert broker._acks is not None and broker._acks.flush(5)
    assert seen == [3]
    suffix = "alone" if fail else "batched"
    assert sorted(after) == [f"h{i} {suffix}" for i in range(3)]
    assert sorted(_rows(broker, "SELECT v FROM notes")) == [("h0",), ("h1",), ("h2",)]
    assert _rows(broker, "SELECT count(*) FROM broker_messages") == [(0,)]  # the acks committed either way
    consumer.close()


def test_fetches_ride_on_the_ack_writer_and_work_without_it(broker: SQLiteBroker) -> None:
    for i in range(4):
        broker.enqueue(Message(queue_name=QUEUE, actor_name="act", args=(i,), kwargs={}, options={}))
    consumer = broker.consume(QUEUE, prefetch=2, timeout=1000)
    release, holder = _hold_the_writer(broker)
    got: list[object] = []
    fetcher = threading.Thread(target=lambda: got.append(next(consumer)))
    fetcher.start()
    fetcher.join(0.3)
    assert fetcher.is_alive() and not got  # the fetch waits for the writer's next batch
    release.set()
    fetcher.join(5)
    holder.join(5)
    assert got and got[0] is not None
    consumer.ack(got[0])  # type: ignore[arg-type]
    assert broker._acks is not None and broker._acks.flush(5)
    broker._acks.stop(5)  # a stopped writer: consumers fetch in transactions of their own again
    second = next(consumer)
    assert second is not None and second.args in ((1,), (2,), (3,))
    consumer.close()
