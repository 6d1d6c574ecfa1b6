"""A Dramatiq app for the broker's real-process acceptance tests, configured from the environment.

``python -m dramatiq tests.acceptance.apps.broker_app`` with:
  TENURE_ACC_BROKER_DB  the broker's SQLite file
  TENURE_ACC_LEDGER_DB  a separate SQLite file where actors record what ran (see :func:`create_ledger`)
  TENURE_ACC_TTL_MS     the lease TTL (default 2000)
  TENURE_ACC_BUSY_MS    the broker's SQLite busy timeout (default 30000)
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import dramatiq

from broker import SQLiteBroker
from tests.acceptance.apps.ledger import QUEUE, ledger_connect

broker = SQLiteBroker(
    f"sqlite:///{os.environ['TENURE_ACC_BROKER_DB']}",
    lease_ttl_ms=int(os.environ.get("TENURE_ACC_TTL_MS", "2000")),
    busy_timeout_ms=int(os.environ.get("TENURE_ACC_BUSY_MS", "30000")),
)
dramatiq.set_broker(broker)

_local = threading.local()


def _ledger() -> sqlite3.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = ledger_connect(os.environ["TENURE_ACC_LEDGER_DB"])
    return conn


def _done(key: str) -> None:
    """Record one completed run of *key*; a second completion lands in ``dupes``."""
    try:
        _ledger().execute("INSERT INTO ledger (key, pid, at) VALUES (?, ?, ?)", (key, os.getpid(), time.time()))
    except sqlite3.IntegrityError:
        _ledger().execute("INSERT INTO dupes (key, pid, at) VALUES (?, ?, ?)", (key, os.getpid(), time.time()))


def _started(key: str) -> None:
    _ledger().execute("INSERT INTO starts (key, pid, at) VALUES (?, ?, ?)", (key, os.getpid(), time.time()))


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def record(key: str) -> None:
    _done(key)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def hold(key: str) -> None:
    """Start, then block until the test inserts ``release`` row *key*, ``key@<pid>`` or ``*``."""
    _started(key)
    mine = (key, f"{key}@{os.getpid()}", "*")
    while _ledger().execute("SELECT 1 FROM release WHERE key IN (?, ?, ?)", mine).fetchone() is None:
        time.sleep(0.01)
    _done(key)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def snooze(key: str, seconds: float) -> None:
    _started(key)
    time.sleep(seconds)
    _done(key)
