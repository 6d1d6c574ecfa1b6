"""Opening SQLite connections the way the broker needs them.

Every connection is in autocommit mode (``isolation_level=None``) so that write transactions are
opened explicitly with ``BEGIN IMMEDIATE``: a deferred transaction that reads and then writes gets
SQLITE_BUSY without waiting when another writer got in between. WAL lets readers run beside the one
writer; it needs every process on the same host and a local filesystem.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from .errors import UnsupportedDatabase

#: Oldest SQLite library the broker runs on (``UPDATE … RETURNING`` arrived in 3.35).
MIN_SQLITE_VERSION = (3, 35, 0)
#: How long a connection waits for the write lock before giving up, in milliseconds.
DEFAULT_BUSY_TIMEOUT_MS = 30_000
#: WAL file size SQLite truncates to after a checkpoint, in bytes.
JOURNAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
#: Filesystems whose locking SQLite's WAL mode cannot rely on.
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "afs", "ceph"})

SYNCHRONOUS_MODES = ("NORMAL", "FULL")


@dataclass(frozen=True)
class SQLiteTarget:
    """Where and how to open the database."""

    path: str
    synchronous: str = "NORMAL"
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS


def parse_sqlite_url(url: str) -> str:
    """Return the filesystem path of a ``sqlite:///relative`` or ``sqlite:////absolute`` URL.

    A bare path is accepted too. ``:memory:`` is refused: a broker needs a file other processes see.
    """
    if url.startswith("sqlite:"):
        parts = urlsplit(url)
        path = parts.path
        if url.startswith("sqlite:///"):
            path = url[len("sqlite:///") :].split("?", 1)[0]
        if parse_qs(parts.query).get("mode") == ["memory"] or path in ("", ":memory:"):
            raise UnsupportedDatabase("an in-memory SQLite database cannot be shared by processes")
        return path
    if url in ("", ":memory:"):
        raise UnsupportedDatabase("an in-memory SQLite database cannot be shared by processes")
    return url


def check_sqlite_version() -> None:
    if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        raise UnsupportedDatabase(
            f"SQLite {sqlite3.sqlite_version} is too old; the broker needs "
            f"{'.'.join(map(str, MIN_SQLITE_VERSION))} or newer"
        )


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem holding *path*, from /proc/mounts (None where unknown)."""
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for fields in mounts:
        if len(fields) < 3:
            continue
        mount_point = fields[1].replace("\\040", " ")
        if (target == mount_point or target.startswith(mount_point.rstrip("/") + "/")) and len(mount_point) >= len(
            best
        ):
            best, best_type = mount_point, fields[2]
    return best_type


def check_location(path: str) -> None:
    """Refuse network filesystems: WAL needs shared memory and reliable locks on one host."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    fstype = filesystem_type(directory)
    if fstype in NETWORK_FILESYSTEMS:
        raise UnsupportedDatabase(
            f"{path} is on a network filesystem ({fstype}); SQLite WAL needs a local disk shared by "
            "processes on one host. Move the file or use TENURE_BROKER_URL=redis://… / amqp://…"
        )


def connect(target: SQLiteTarget) -> sqlite3.Connection:
    """Open one connection configured for the broker (WAL, busy timeout, explicit transactions)."""
    Path(target.path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        target.path,
        timeout=target.busy_timeout_ms / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.execute(f"PRAGMA busy_timeout = {int(target.busy_timeout_ms)}")
    try:
        _ensure_wal(conn, target)
    except BaseException:
        conn.close()
        raise
    conn.execute(f"PRAGMA synchronous = {target.synchronous}")
    conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _ensure_wal(conn: sqlite3.Connection, target: SQLiteTarget) -> None:
    """Switch the file to WAL once. Switching takes an exclusive lock without consulting the busy
    handler, so connections racing to open a brand-new file retry instead of failing."""
    deadline = time.monotonic() + target.busy_timeout_ms / 1000
    delay = 0.001
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if mode.lower() != "wal":
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            continue
        if mode.lower() != "wal":
            raise UnsupportedDatabase(f"could not switch {target.path} to WAL mode (got {mode!r})")
        return
