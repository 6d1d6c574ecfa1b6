"""``expedite_delayed``: delayed messages picked by a message option become due in the caller's transaction,
and a consumer sleeping until their old eta takes them as soon as it is woken."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dramatiq.message import Message

from broker import SQLiteBroker, UnsupportedDatabase, expedite_delayed

QUEUE = "work"
HOUR_MS = 3_600_000


def msg(key: str, **options: Any) -> Message:
    return Message(queue_name=QUEUE, actor_name="act", args=(key,), kwargs={}, options={"my_key": key, **options})


def states(path: Path) -> dict[str, tuple[int, int]]:
    """args[0] → (state, eta) of every message row."""
    import json

    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT body, state, eta FROM broker_messages").fetchall()
    conn.close()
    return {json.loads(body)["args"][0]: (state, eta) for body, state, eta in rows}


@pytest.fixture()
def sqlite_broker(sqlite_url: str) -> Iterator[SQLiteBroker]:
    b = SQLiteBroker(sqlite_url, middleware=[])
    b.declare_queue(QUEUE)
    yield b
    b.close()


def test_expedited_messages_are_due_at_once_and_only_they(sqlite_broker: SQLiteBroker, sqlite_path: Path) -> None:
    for key in ("a", "b", "c"):
        sqlite_broker.enqueue(msg(key), delay=HOUR_MS)
    consumer = sqlite_broker.consume(QUEUE, prefetch=2, timeout=10_000)

    # A consumer that found nothing due sleeps until the old eta (an hour), or its timeout, unless woken
    taken: list[Any] = []
    sleeper = threading.Thread(target=lambda: taken.extend([next(consumer), next(consumer)]))
    sleeper.start()
    time.sleep(0.2)  # let it go to sleep (nothing is due)
    assert taken == []
    started = time.monotonic()
    with sqlite3.connect(sqlite_path, isolation_level=None) as conn:
        conn.execute("BEGIN IMMEDIATE")
        due = expedite_delayed(sqlite_broker, conn, QUEUE, option="my_key", values=["a", "c", "zz"])
        assert sorted(due) == ["a", "c"]
        conn.execute("COMMIT")
    conn.close()
    sqlite_broker.wake([QUEUE])
    sleeper.join(10)
    assert sorted(m.args[0] for m in taken) == ["a", "c"] and time.monotonic() - started < 2
    rows = states(sqlite_path)
    assert rows["b"][0] == 3 and rows["b"][1] > time.time() * 1000 + HOUR_MS / 2  # untouched
    for m in taken:
        consumer.ack(m)
    consumer.close()


def test_a_rolled_back_expedite_changes_nothing_and_another_file_is_refused(
    sqlite_broker: SQLiteBroker, sqlite_path: Path, tmp_path: Path
) -> None:
    sqlite_broker.enqueue(msg("a"), delay=HOUR_MS)
    with sqlite3.connect(sqlite_path, isolation_level=None) as conn:
        conn.execute("BEGIN IMMEDIATE")
        assert expedite_delayed(sqlite_broker, conn, QUEUE, option="my_key", values=["a"]) == ["a"]
        conn.execute("ROLLBACK")
    conn.close()
    assert states(sqlite_path)["a"][0] == 3
    other = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(UnsupportedDatabase):
        expedite_delayed(sqlite_broker, other, QUEUE, option="my_key", values=["a"])
    other.close()
    assert expedite_delayed(sqlite_broker, sqlite3.connect(sqlite_path), QUEUE, option="bad key", values=["a"]) == []
