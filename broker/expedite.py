"""Make delayed messages due now, inside a caller's transaction on the broker's own file.

A producer that delayed a message (a retry's backoff) may later learn it need not wait: the cause
of the delay is gone. :func:`expedite_delayed` moves such messages from DELAYED to READY with
``eta = now`` in the caller's open transaction, so the change commits (or rolls back) with the
caller's own rows. Messages are picked by a message *option* (any Dramatiq option the producer set),
so the broker stays ignorant of what the option means.

    with engine.begin() as conn:           # a connection to the broker's SQLite file
        due = expedite_delayed(broker, conn, "render", option="my_key", values=["k1", "k2"])
    if due:
        broker.wake(["render"])            # after the commit: idle consumers claim them at once
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dramatiq.common import current_millis, q_name

from .sqlite import SQLiteBroker, _raw_sqlite_connection


def expedite_delayed(
    broker: SQLiteBroker, connection: Any, queue_name: str, *, option: str, values: Sequence[str]
) -> list[str]:
    """Make the delayed messages of *queue_name* whose ``options[option]`` is in *values* due now.

    Nothing is committed here; call ``broker.wake([queue_name])`` after the caller's commit so that
    idle consumers (which sleep until the old eta) claim them at once.

    Parameters:
      broker: The broker whose file *connection* is on.
      connection: An open ``sqlite3.Connection`` or SQLAlchemy ``Connection`` to that file, inside
        the transaction to join.
      queue_name: The queue (a ``.DQ`` name counts as its canonical queue).
      option: A message option name (letters, digits and underscores).
      values: The option values to match.

    Raises:
      UnsupportedDatabase: *connection* is not a SQLite connection to the broker's file.

    Returns:
      The option value of every message made due (a value twice when two messages matched).
    """
    raw = _raw_sqlite_connection(connection)
    broker._check_same_database(raw)
    broker._ready(raw)  # on the caller's connection: its transaction may hold the write lock already
    return broker.store.message_expedite(raw, q_name(queue_name), option, list(values), current_millis())
