"""Errors of the SQLite broker, rooted in Dramatiq's error tree.

SQLite's transient failures ("database is locked", disk I/O) become :class:`DatabaseUnavailable`, a
:class:`dramatiq.errors.ConnectionClosed`, because only that family makes Dramatiq's Worker restart a
consumer and retry acks instead of dropping them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from dramatiq.errors import BrokerError, ConnectionClosed


class DatabaseUnavailable(ConnectionClosed):
    """The SQLite database is temporarily unavailable (locked, busy or I/O error)."""


class UnsupportedDatabase(BrokerError):
    """The SQLite library, file location or schema version cannot be used by this broker."""


@contextmanager
def translate_errors() -> Iterator[None]:
    """Turn SQLite operational errors into :class:`DatabaseUnavailable`.

    Integrity and programming errors are bugs, not outages, so they pass through unchanged.
    """
    try:
        yield
    except sqlite3.OperationalError as e:
        raise DatabaseUnavailable(f"SQLite: {e}") from e
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.IntegrityError | sqlite3.ProgrammingError):
            raise
        raise DatabaseUnavailable(f"SQLite: {e}") from e
