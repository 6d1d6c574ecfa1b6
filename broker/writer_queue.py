"""The queue for one SQLite file's write lock: this process's threads, then every process on the host.

SQLite has one writer. A writer that finds the lock taken waits in SQLite's busy handler, which sleeps
1, 2, 5, 10 … 100 ms between looks, so under load a waiting writer can sleep through many short
transactions of another process and lose the lock to it again and again (a web submit behind two busy
worker processes waited over a second at p99). So writers queue before ``BEGIN IMMEDIATE``:

- the threads of one process on a re-entrant Python lock (nested helpers may write), and
- the processes on an ``flock`` of a file beside the database (``<database>-writer.lock``), taken by
  the thread that holds the Python lock. A waiting process looks every millisecond at most, so it
  takes the lock within a millisecond of its release; the lock file holds no data.

Only the first few seconds are spent in this queue (:data:`QUEUE_WAIT_S`): a writer that cannot get
in by then (a stopped process holding the file lock) goes on to SQLite's own busy handler, which keeps
the configured busy timeout and its "database is locked" error. A process that dies releases its
place with its file descriptor; a forked child closes the descriptors it inherited, so a parent killed
while queued never leaves its place held by a child.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

#: How long a writer waits for another process's place before going on to SQLite's busy handler.
QUEUE_WAIT_S = 5.0
#: The longest pause between two looks at the file lock.
MAX_POLL_S = 0.001
LOCK_FILE_SUFFIX = "-writer.lock"


class WriterQueue:
    """A place in the queue for one database file's write lock (a context manager, re-entrant per thread)."""

    def __init__(self, database_path: str) -> None:
        self.lock_path = database_path + LOCK_FILE_SUFFIX
        self._lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None
        self._file_locked = False

    def owned(self) -> bool:
        """Whether the calling thread holds this place."""
        return bool(self._lock._is_owned())  # type: ignore[attr-defined]

    def acquire(self) -> bool:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._file_locked = self._lock_file()
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._file_locked:
            self._file_locked = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)  # type: ignore[arg-type]
        self._lock.release()

    def __enter__(self) -> WriterQueue:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _lock_file(self) -> bool:
        fd = self._open()
        if fd is None:
            return False
        deadline = time.monotonic() + QUEUE_WAIT_S
        pause = MAX_POLL_S / 8
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(pause)
                pause = min(pause * 2, MAX_POLL_S)

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                # Read-only is enough for flock, so any user who may read the database may queue.
                self._fd = os.open(self.lock_path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                logger.warning(
                    "No cross-process writer queue for %s (%s): writers meet in SQLite's busy handler",
                    self.lock_path,
                    exc,
                )
                self._fd = -1
        return None if self._fd == -1 else self._fd

    def _close_inherited(self) -> None:
        if self._fd is not None and self._fd != -1:
            os.close(self._fd)


_queues: dict[str, WriterQueue] = {}
_queues_guard = threading.Lock()


def process_write_lock(path: str) -> WriterQueue:
    """This process's place in the writer queue of the SQLite file at *path* (one per file)."""
    queue = _queues.get(path)  # fast path: the spelling callers use, no realpath() per transaction
    if queue is not None:
        return queue
    key = os.path.realpath(path)
    with _queues_guard:
        queue = _queues.get(key)
        if queue is None:
            queue = _queues[key] = WriterQueue(key)
        _queues[path] = queue
    return queue


def _reset_after_fork() -> None:
    global _queues_guard
    for queue in set(_queues.values()):
        queue._close_inherited()
    _queues.clear()
    _queues_guard = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
