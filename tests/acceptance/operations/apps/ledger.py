"""The ledger the operations app's actor writes to (its own SQLite file): what started, what completed."""

from __future__ import annotations

import sqlite3

QUEUE = "ops"

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS starts (key TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS done (key TEXT PRIMARY KEY, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS dupes (key TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS release (key TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS boots (pid INTEGER NOT NULL, at REAL NOT NULL);
"""


def ledger_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    conn.execute("PRAGMA journal_mode = WAL")
    return conn


def create_ledger(path: str) -> None:
    conn = ledger_connect(path)
    conn.executescript(LEDGER_DDL)
    conn.close()
