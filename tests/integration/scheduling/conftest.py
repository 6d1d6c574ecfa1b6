"""A real SQLite file with the broker's and the schedule tables, a broker and an injectable clock."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker import SQLiteBroker
from jobs.db import make_engine
from jobs.schema import upgrade
from tasks.scheduling import configure, install


@dataclass
class Clock:
    """Epoch-ms clock the test moves by hand."""

    now: int

    def __call__(self) -> int:
        return self.now


@pytest.fixture()
def clock() -> Clock:
    return Clock(now=1_714_564_837_000)  # 2024-05-01T12:00:37Z


@pytest.fixture()
def sched_broker(sqlite_url: str) -> Iterator[SQLiteBroker]:
    upgrade(sqlite_url)  # every table, as `tenure db upgrade` makes them
    broker = SQLiteBroker(sqlite_url, middleware=[])
    install(broker)
    yield broker
    broker.close()


@pytest.fixture()
def scheduler(sched_broker: SQLiteBroker, sqlite_url: str, clock: Clock):  # type: ignore[no-untyped-def]
    s = configure(sched_broker, engine=make_engine(sqlite_url), clock=clock)
    yield s
    s.engine.dispose()


def messages(path: Path, actor: str) -> list[tuple[str, int]]:
    """(message_id, eta) of the broker rows of *actor*."""
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT message_id, eta FROM broker_messages WHERE actor = ? ORDER BY id", (actor,)
        ).fetchall()
