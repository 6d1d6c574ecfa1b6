"""The writer queue across processes (broker/writer_queue.py): real processes holding a place, real flock."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker import writer_queue

ROOT = Path(__file__).resolve().parents[2]

#: A process that takes its place in the queue of argv[1], forks a child that outlives it when argv[2]
#: says so, says "held <child pid>", and lets go when a line arrives on stdin.
HOLDER = """
import os, sys, time
from broker.writer_queue import process_write_lock
queue = process_write_lock(sys.argv[1])
queue.acquire()
child = 0
if sys.argv[2] == "fork":
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
print("held", child, flush=True)
sys.stdin.readline()
queue.release()
print("released", flush=True)
"""


@contextmanager
def holder(database: Path, fork: bool = False) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(database), "fork" if fork else "-"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        assert proc.stdout is not None
        word, child_pid = proc.stdout.readline().split()
        assert word == "held"
        child = int(child_pid)
        yield proc, child
    finally:
        proc.kill()
        proc.wait()
        if child:
            os.kill(child, signal.SIGKILL)


def acquire_in_thread(queue: writer_queue.WriterQueue) -> tuple[threading.Thread, threading.Event]:
    got = threading.Event()

    def take() -> None:
        queue.acquire()
        got.set()
        queue.release()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, got


def file_is_locked(database: Path) -> bool:
    """Whether some process holds the queue's file lock (a fresh descriptor cannot take it)."""
    fd = os.open(str(database) + writer_queue.LOCK_FILE_SUFFIX, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_writer_waits_for_another_processs_place_and_takes_it_when_released(tmp_path: Path) -> None:
    database = tmp_path / "tenure.db"
    with holder(database) as (proc, _):
        assert file_is_locked(database)
        thread, got = acquire_in_thread(writer_queue.process_write_lock(str(database)))
        assert not got.wait(0.5)  # still the other process's turn
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        assert got.wait(writer_queue.QUEUE_WAIT_S / 2)  # at its release, not after the queue's wait ran out
        thread.join()
    assert not file_is_locked(database)


def test_a_child_forked_by_a_holder_does_not_keep_its_place_when_the_holder_is_killed(tmp_path: Path) -> None:
    database = tmp_path / "tenure.db"
    with holder(database, fork=True) as (proc, child):
        assert file_is_locked(database)
        proc.kill()  # the child still runs, with a copy of every descriptor its parent had
        proc.wait()
        assert Path(f"/proc/{child}").exists()
        queue = writer_queue.process_write_lock(str(database))
        with queue:
            assert file_is_locked(database)  # by this process now: the child closed its copy at the fork
        assert not file_is_locked(database)


def test_a_place_held_too_long_is_given_up_for_sqlites_own_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_queue, "QUEUE_WAIT_S", 0.2)
    database = tmp_path / "tenure.db"
    with holder(database):
        queue = writer_queue.process_write_lock(str(database))
        thread, got = acquire_in_thread(queue)
        assert got.wait(10)  # without the file lock: SQLite's busy handler decides from here
        thread.join()
        assert file_is_locked(database)  # the holder still has it
