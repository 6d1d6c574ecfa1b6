"""A worker app for the operations tests: ``tenure worker tests.acceptance.operations.apps.ops_app``.

Configured from the environment:
  OPS_BROKER_DB   the broker's SQLite file
  OPS_LEDGER_DB   a separate SQLite file where the actor records what started and what completed
  OPS_TTL_MS      the broker's lease TTL (default 10000)
  OPS_BOOT_DELAY_S  if set, importing the app records a ``boots`` row, then sleeps this long (a slow start-up)
  OPS_CRASH_FLAG  if set and that file exists, importing the app records a ``boots`` row and ends the
                  process with ``os._exit(1)`` (a worker process that crashes at boot)
  OPS_LOADED_DIR  if set, importing the app writes a file named for the process's pid there, holding
                  ``jobs`` if the job layer was already loaded (this app never imports it)
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

if os.environ.get("OPS_LOADED_DIR"):
    Path(os.environ["OPS_LOADED_DIR"], str(os.getpid())).write_text("jobs" if "jobs" in sys.modules else "")

import dramatiq

from broker import SQLiteBroker
from tests.acceptance.operations.apps.ledger import QUEUE, ledger_connect

broker = SQLiteBroker(
    f"sqlite:///{os.environ['OPS_BROKER_DB']}", lease_ttl_ms=int(os.environ.get("OPS_TTL_MS", "10000"))
)
dramatiq.set_broker(broker)

if os.environ.get("OPS_CRASH_FLAG") and os.path.exists(os.environ["OPS_CRASH_FLAG"]):
    _boot = ledger_connect(os.environ["OPS_LEDGER_DB"])
    _boot.execute("INSERT INTO boots (pid, at) VALUES (?, ?)", (os.getpid(), time.time()))
    _boot.close()
    os._exit(1)

if os.environ.get("OPS_BOOT_DELAY_S"):
    _boot = ledger_connect(os.environ["OPS_LEDGER_DB"])
    _boot.execute("INSERT INTO boots (pid, at) VALUES (?, ?)", (os.getpid(), time.time()))
    _boot.close()
    time.sleep(float(os.environ["OPS_BOOT_DELAY_S"]))

_local = threading.local()


def _ledger() -> sqlite3.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = ledger_connect(os.environ["OPS_LEDGER_DB"])
    return conn


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def hold(key: str) -> None:
    """Record the start, block until the test inserts ``release`` row *key* (or ``*``), record the completion.

    ``done`` has a UNIQUE key: a second completion of *key* lands in ``dupes``.
    """
    db = _ledger()
    db.execute("INSERT INTO starts (key, pid, at) VALUES (?, ?, ?)", (key, os.getpid(), time.time()))
    while db.execute("SELECT 1 FROM release WHERE key IN (?, '*')", (key,)).fetchone() is None:
        time.sleep(0.01)
    try:
        db.execute("INSERT INTO done (key, pid, at) VALUES (?, ?, ?)", (key, os.getpid(), time.time()))
    except sqlite3.IntegrityError:
        db.execute("INSERT INTO dupes (key, pid, at) VALUES (?, ?, ?)", (key, os.getpid(), time.time()))
