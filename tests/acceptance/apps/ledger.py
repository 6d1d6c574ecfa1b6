"""The ledger the acceptance app's actors write to: what started and what completed, in its own SQLite file."""

from __future__ import annotations

import sqlite3

QUEUE = "acceptance"

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS ledger (key TEXT PRIMARY KEY, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS dupes (key TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS starts (key TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS release (key TEXT PRIMARY KEY);
"""


def ledger_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def create_ledger(path: str) -> None:
    conn = ledger_connect(path)
    conn.executescript(LEDGER_DDL)
    conn.close()
