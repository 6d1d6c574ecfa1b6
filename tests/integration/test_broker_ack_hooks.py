"""Writes that ride on the broker's ack group commit: ``SQLiteMessageProxy.in_ack_transaction`` hooks and
``SQLiteBroker.write_with_acks`` calls, on a real SQLite file."""

from __future__ import annotations

import sqlite3
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
