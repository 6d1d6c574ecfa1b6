"""Graceful stop of real ``tenure worker`` processes on the SQLite broker.

- SIGTERM drain: prefetched-but-unstarted messages go to another worker at once; in-flight ones
  finish where they run, once.
- Grace: past ``--worker-shutdown-timeout`` a running message is left to its lease (it runs again on
  another worker after the TTL) and ``tenure worker`` exits 75.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dramatiq.message import Message

from broker import SQLiteBroker
from tenure_cli import EXIT_WORK_LEFT_TO_LEASES
from tests.acceptance.operations.apps.ledger import QUEUE, create_ledger, ledger_connect

from .support import ROOT, Proc, Procs, processes, wait_for

APP = "tests.acceptance.operations.apps.ops_app"


@dataclass
class Rig:
    procs: Procs
    broker_db: Path
    ledger_db: Path
    producer: SQLiteBroker

    def worker(
        self, name: str, *, threads: int, shutdown_ms: int, ttl_ms: int, prefetch: int = 0, **extra_env: str
    ) -> Proc:
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            OPS_BROKER_DB=str(self.broker_db),
            OPS_LEDGER_DB=str(self.ledger_db),
            OPS_TTL_MS=str(ttl_ms),
            **extra_env,
        )
        if prefetch:
            env["dramatiq_queue_prefetch"] = str(prefetch)
        argv = [sys.executable, "-m", "tenure_cli", "worker", APP, "-p", "1", "-t", str(threads)]
        argv += ["--queues", QUEUE, "--worker-shutdown-timeout", str(shutdown_ms)]
        return self.procs.start(name, argv, env)

    def send(self, keys: list[str]) -> None:
        for key in keys:
            self.producer.enqueue(Message(queue_name=QUEUE, actor_name="hold", args=(key,), kwargs={}, options={}))

    def ledger(self, sql: str, *params: object) -> list[tuple]:
        conn = ledger_connect(str(self.ledger_db))
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def release(self, keys: list[str]) -> None:
        conn = ledger_connect(str(self.ledger_db))
        conn.executemany("INSERT OR IGNORE INTO release (key) VALUES (?)", [(k,) for k in keys])
        conn.close()

    def broker_rows(self, sql: str, *params: object) -> list[tuple]:
        conn = sqlite3.connect(self.broker_db, timeout=30)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def worker_pid(self, proc: Proc) -> int:
        """The pid of the (single) worker process under a ``tenure worker`` main process."""
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        return int(children[0])

    def registered(self, proc: Proc) -> bool:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        return bool(children) and bool(
            self.broker_rows("SELECT 1 FROM broker_processes WHERE pid = ?", int(children[0]))
        )


@pytest.fixture()
def rig(tmp_path: Path) -> Iterator[Rig]:
    create_ledger(str(tmp_path / "ledger.db"))
    producer = SQLiteBroker(f"sqlite:///{tmp_path / 'broker.db'}", middleware=[])
    producer.declare_queue(QUEUE)
    producer.ensure_schema()
    with processes(tmp_path) as procs:
        try:
            yield Rig(procs, tmp_path / "broker.db", tmp_path / "ledger.db", producer)
        finally:
            procs.stop_all()
            producer.close()


@pytest.mark.timeout(90)
def test_sigterm_hands_50_prefetched_to_another_worker_at_once_and_finishes_8_in_flight_once(rig: Rig) -> None:
    # Given worker A (8 threads, prefetch 58) running 8 blocking messages with 50 more prefetched, and an
    # idle worker B; the lease TTL (30 s) is far longer than the test, so no hand-off can come from expiry
    a = rig.worker("a", threads=8, shutdown_ms=60_000, ttl_ms=30_000, prefetch=58)
    keys = [f"m{i:02d}" for i in range(58)]
    wait_for("worker A to register", lambda: rig.registered(a), 30, rig.procs)
    rig.send(keys)
    a_pid = rig.worker_pid(a)
    wait_for("8 messages started on A", lambda: len(rig.ledger("SELECT key FROM starts")) == 8, 30, rig.procs)
    wait_for(
        "A to lease all 58",
        lambda: rig.broker_rows("SELECT count(*) FROM broker_messages WHERE state = 1")[0][0] == 58,
        10,
        rig.procs,
    )
    in_flight = sorted(k for (k,) in rig.ledger("SELECT key FROM starts WHERE pid = ?", a_pid))
    prefetched = sorted(set(keys) - set(in_flight))
    assert len(in_flight) == 8 and len(prefetched) == 50
    rig.release(prefetched)  # they finish at once wherever they start; the 8 in flight keep blocking
    b = rig.worker("b", threads=8, shutdown_ms=60_000, ttl_ms=30_000)
    wait_for("worker B to register", lambda: rig.registered(b), 30, rig.procs)
    b_pid = rig.worker_pid(b)

    # When A's process group receives SIGTERM (as honcho sends it)
    sigterm_at = time.time()
    rig.procs.signal(a, signal.SIGTERM, group=True)

    # Then B starts every prefetched message within 2 s
    wait_for(
        "B to start the 50 prefetched messages",
        lambda: len(rig.ledger("SELECT DISTINCT key FROM starts WHERE pid = ?", b_pid)) == 50,
        10,
        rig.procs,
    )
    started_b = dict(rig.ledger("SELECT key, min(at) FROM starts WHERE pid = ? GROUP BY key", b_pid))
    assert sorted(started_b) == prefetched
    first, last = min(started_b.values()) - sigterm_at, max(started_b.values()) - sigterm_at
    print(f"\nprefetched messages started on B {first:.3f}-{last:.3f} s after SIGTERM to A")
    assert last <= 2.0, f"the last prefetched message started on B {last:.3f} s after SIGTERM"
    # ... while the 8 in flight are still running on A, which B never started
    assert not set(in_flight) & {k for (k,) in rig.ledger("SELECT key FROM starts WHERE pid = ?", b_pid)}
    assert a.popen.poll() is None

    # When the in-flight messages finish (inside A's grace)
    rig.release(in_flight)

    # Then A exits 0, each of the 58 completed exactly once (8 on A, 50 on B), nothing is left leased
    assert a.popen.wait(30) == 0, rig.procs.logs()
    done = dict(rig.ledger("SELECT key, pid FROM done"))
    assert sorted(done) == keys
    assert sorted(k for k, pid in done.items() if pid == a_pid) == in_flight
    assert rig.ledger("SELECT count(*) FROM dupes")[0][0] == 0
    assert len(rig.ledger("SELECT key FROM starts")) == 58  # nothing ran twice, not even partly
    wait_for("the queue to be empty", lambda: not rig.broker_rows("SELECT id FROM broker_messages"), 10, rig.procs)
    assert "Released 50 prefetched messages" in a.output()
    assert not rig.broker_rows("SELECT owner FROM broker_processes WHERE pid = ?", a_pid)  # closed cleanly


@pytest.mark.timeout(90)
def test_past_the_grace_the_running_message_is_left_to_its_lease_and_the_exit_code_says_so(rig: Rig) -> None:
    # Given worker A (grace 1 s, lease TTL 3 s) running a message that takes longer than the grace
    a = rig.worker("a", threads=2, shutdown_ms=1000, ttl_ms=3000)
    wait_for("worker A to register", lambda: rig.registered(a), 30, rig.procs)
    a_pid = rig.worker_pid(a)
    rig.send(["slow"])
    wait_for("the message to start on A", lambda: rig.ledger("SELECT pid FROM starts"), 30, rig.procs)
    b = rig.worker("b", threads=2, shutdown_ms=60_000, ttl_ms=3000)
    wait_for("worker B to register", lambda: rig.registered(b), 30, rig.procs)
    b_pid = rig.worker_pid(b)

    # When A receives SIGTERM and the grace runs out
    rig.procs.signal(a, signal.SIGTERM, group=True)
    code = a.popen.wait(30)
    exited_at = time.time()

    # Then A's exit code says work was left to its lease, and its log names the message
    assert code == EXIT_WORK_LEFT_TO_LEASES, rig.procs.logs()
    assert "1 message(s) still running after the shutdown timeout are left to their leases: hold" in a.output()
    assert "were left to their leases and will run again on another worker" in a.output()
    # ... the message is still leased (not released: A might still have been running it)
    owners = rig.broker_rows("SELECT lease_owner FROM broker_messages WHERE state = 1")
    assert len(owners) == 1 and f":{a_pid}:" in owners[0][0]
    # ... and B runs it once the lease has expired
    wait_for("B to start the message", lambda: rig.ledger("SELECT at FROM starts WHERE pid = ?", b_pid), 15, rig.procs)
    (started_b,) = rig.ledger("SELECT at FROM starts WHERE pid = ?", b_pid)[0]
    print(f"\nthe abandoned message started on B {started_b - exited_at:.2f} s after A exited (TTL 3 s)")
    rig.release(["slow"])
    wait_for("the message to complete", lambda: rig.ledger("SELECT pid FROM done"), 15, rig.procs)
    assert rig.ledger("SELECT key, pid FROM done") == [("slow", b_pid)]
    assert rig.ledger("SELECT count(*) FROM dupes")[0][0] == 0
    # A closed its broker (no unclean exit recorded): it stopped, it did not crash
    assert not rig.broker_rows("SELECT owner FROM broker_processes WHERE pid = ?", a_pid)


@pytest.mark.timeout(60)
def test_a_group_sigterm_during_start_up_is_one_graceful_stop(rig: Rig) -> None:
    # Given a worker whose worker process is still importing the app (a slow start-up)
    a = rig.worker("a", threads=2, shutdown_ms=3000, ttl_ms=3000, OPS_BOOT_DELAY_S="1.5")
    wait_for("the app import to begin", lambda: rig.ledger("SELECT pid FROM boots"), 30, rig.procs, poll_s=0.005)

    # When the process group receives SIGTERM (the worker process gets it now, and again when
    # Dramatiq's main process forwards it after the boot)
    rig.procs.signal(a, signal.SIGTERM, group=True)

    # Then it is one graceful stop: the Worker stops, the broker closes, exit 0
    assert a.popen.wait(30) == 0, rig.procs.logs()
    assert "Killing worker process" not in a.output()
    assert "Worker has been shut down." in a.output()
    assert not rig.broker_rows("SELECT owner FROM broker_processes")
