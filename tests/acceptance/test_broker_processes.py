"""SQLiteBroker under real ``python -m dramatiq`` processes: drains, crashes, shutdowns, lock storms.

Every wait polls the ledger or broker rows with a deadline; every process a test starts is killed
(by process group) when the test ends, whatever happened.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dramatiq.message import Message

from broker import SQLiteBroker
from tests.acceptance.apps.ledger import QUEUE, create_ledger, ledger_connect

REPO = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.apps.broker_app"
TTL_MS = 2000


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    worker_pid: int = 0
    owner: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Cluster:
    """The test's broker file, ledger and dramatiq processes."""

    tmp: Path
    broker_db: Path
    ledger_db: Path
    procs: list[Proc] = field(default_factory=list)
    producer: SQLiteBroker | None = None

    # -- processes ------------------------------------------------------------------------------------
    def start(self, name: str, *, threads: int = 8, ttl_ms: int = TTL_MS, busy_ms: int = 30_000) -> Proc:
        """Start ``python -m dramatiq`` (1 worker process) and wait until its consumer is registered."""
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            TENURE_ACC_BROKER_DB=str(self.broker_db),
            TENURE_ACC_LEDGER_DB=str(self.ledger_db),
            TENURE_ACC_TTL_MS=str(ttl_ms),
            TENURE_ACC_BUSY_MS=str(busy_ms),
        )
        log = self.tmp / f"{name}.log"
        cmd = [
            sys.executable,
            "-m",
            "dramatiq",
            APP,
            "-p",
            "1",
            "-t",
            str(threads),
            "--worker-shutdown-timeout",
            "60000",
        ]
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        proc.worker_pid = self.wait(lambda: _child_pid(popen.pid), 30, f"{name}'s worker process", proc)
        proc.owner = self.wait(
            lambda: self.broker_one("SELECT owner FROM broker_processes WHERE pid = ?", proc.worker_pid),
            30,
            f"{name}'s consumer to register",
            proc,
        )
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                try:
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.popen.wait(timeout=30)
            if proc.worker_pid:
                try:
                    os.kill(proc.worker_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.producer is not None:
            self.producer.close()

    # -- databases ------------------------------------------------------------------------------------
    def broker(self) -> SQLiteBroker:
        if self.producer is None:
            self.producer = SQLiteBroker(f"sqlite:///{self.broker_db}", lease_ttl_ms=TTL_MS)
            self.producer.declare_queue(QUEUE)
            self.producer.stats()  # creates the schema before any worker starts
        return self.producer

    def send(self, actor: str, *args: Any) -> Message:
        return self.broker().enqueue(Message(queue_name=QUEUE, actor_name=actor, args=args, kwargs={}, options={}))

    def ledger(self, sql: str, *params: Any) -> list[tuple]:
        conn = ledger_connect(str(self.ledger_db))
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def ledger_one(self, sql: str, *params: Any) -> Any:
        rows = self.ledger(sql, *params)
        return rows[0][0] if rows else None

    def broker_rows(self, sql: str, *params: Any) -> list[tuple]:
        conn = sqlite3.connect(self.broker_db, isolation_level=None, timeout=60)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def broker_one(self, sql: str, *params: Any) -> Any:
        rows = self.broker_rows(sql, *params)
        return rows[0][0] if rows else None

    def release(self, key: str) -> None:
        conn = ledger_connect(str(self.ledger_db))
        conn.execute("INSERT OR IGNORE INTO release (key) VALUES (?)", (key,))
        conn.close()

    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str, *watch: Proc) -> Any:
        """Poll *predicate* until truthy; fail with the processes' logs after *timeout_s*."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            for proc in watch:
                if proc.popen.poll() is not None:
                    raise AssertionError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.output()[-4000:]}")
            if time.monotonic() >= deadline:
                logs = "\n".join(f"--- {p.name}\n{p.output()[-3000:]}" for p in self.procs)
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{logs}")
            time.sleep(0.01)

    def pending(self) -> int:
        return self.broker_one("SELECT count(*) FROM broker_messages")


def _child_pid(pid: int) -> int:
    """The dramatiq worker process forked by the CLI process *pid* (0 until it exists)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    return int(children[0]) if children else 0


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, tmp_path / "broker.db", tmp_path / "ledger.db")
    create_ledger(str(c.ledger_db))
    c.broker()
    try:
        yield c
    finally:
        c.stop_all()


# -- tests ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_processes_drain_10k_messages_each_exactly_once(cluster: Cluster) -> None:
    n = 10_000
    a, b = cluster.start("a"), cluster.start("b")

    for i in range(n):
        cluster.send("record", f"k{i}")

    cluster.wait(lambda: cluster.ledger_one("SELECT count(*) FROM ledger") == n, 180, f"{n} ledger rows", a, b)
    cluster.wait(lambda: cluster.pending() == 0, 30, "the broker to be empty", a, b)
    assert cluster.ledger_one("SELECT count(*) FROM dupes") == 0
    by_pid = dict(cluster.ledger("SELECT pid, count(*) FROM ledger GROUP BY pid"))
    assert set(by_pid) == {a.worker_pid, b.worker_pid}, by_pid


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_message_of_a_killed_process_runs_again_elsewhere_after_the_ttl(cluster: Cluster) -> None:
    # Given process A running a message (blocked), and an idle process B
    a = cluster.start("a", threads=2)
    sent = cluster.send("hold", "victim")
    cluster.wait(lambda: cluster.ledger_one("SELECT pid FROM starts WHERE key = 'victim'") == a.worker_pid, 30, "A", a)
    b = cluster.start("b", threads=2)

    # When A's worker process is SIGKILLed mid-task
    killed_at = time.time()
    os.kill(a.worker_pid, signal.SIGKILL)

    # Then after the lease TTL, B runs it again as its second delivery
    rerun_at = cluster.wait(
        lambda: cluster.ledger_one("SELECT at FROM starts WHERE key = 'victim' AND pid = ?", b.worker_pid),
        30,
        "B to rerun the message",
        b,
    )
    leased = cluster.broker_rows(
        "SELECT lease_owner, deliveries FROM broker_messages WHERE message_id = ?", sent.message_id
    )
    assert leased == [(b.owner, 2)]
    assert TTL_MS / 1000 * 2 / 3 - 0.05 <= rerun_at - killed_at <= TTL_MS / 1000 + 3.0

    cluster.release("victim")
    cluster.wait(lambda: cluster.pending() == 0, 30, "the rerun to be acked", b)
    assert cluster.ledger("SELECT key, pid FROM ledger") == [("victim", b.worker_pid)]


@pytest.mark.timeout(90)
def test_sigterm_hands_prefetched_unstarted_messages_to_another_process_within_a_second(cluster: Cluster) -> None:
    # Given A with 8 threads busy on long tasks and 8 more messages prefetched but not started
    a = cluster.start("a", threads=8)
    keys = [f"h{i}" for i in range(16)]
    for key in keys:
        cluster.send("hold", key)
    cluster.wait(lambda: cluster.ledger_one("SELECT count(*) FROM starts") == 8, 30, "8 running tasks in A", a)
    cluster.wait(
        lambda: cluster.broker_one("SELECT count(*) FROM broker_messages WHERE lease_owner = ?", a.owner) == 16,
        30,
        "A to hold 16 leases",
        a,
    )
    running = {k for (k,) in cluster.ledger("SELECT key FROM starts")}
    prefetched = set(keys) - running
    b = cluster.start("b", threads=8)

    # When A is asked to stop
    sigterm_at = time.time()
    os.kill(a.popen.pid, signal.SIGTERM)

    # Then B starts every prefetched message within a second
    cluster.wait(
        lambda: cluster.ledger_one("SELECT count(*) FROM starts WHERE pid = ?", b.worker_pid) == 8,
        30,
        "B to start the 8 prefetched messages",
        b,
    )
    started = dict(cluster.ledger("SELECT key, at FROM starts WHERE pid = ?", b.worker_pid))
    assert set(started) == prefetched
    latest = max(started.values()) - sigterm_at
    print(f"prefetched messages started {min(started.values()) - sigterm_at:.3f}-{latest:.3f}s after SIGTERM")
    assert latest <= 1.0, f"the last prefetched message started {latest:.3f}s after SIGTERM"

    # And A finishes its running tasks and exits cleanly; nothing runs twice
    cluster.release("*")
    assert a.popen.wait(timeout=60) == 0, a.output()[-3000:]
    cluster.wait(lambda: cluster.pending() == 0, 30, "everything to be acked", b)
    assert cluster.ledger_one("SELECT count(*) FROM ledger") == 16
    assert cluster.ledger_one("SELECT count(*) FROM dupes") == 0


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_task_running_three_times_the_ttl_is_not_redelivered(cluster: Cluster) -> None:
    a, b = cluster.start("a", threads=2), cluster.start("b", threads=2)

    cluster.send("snooze", "long", 3 * TTL_MS / 1000)

    cluster.wait(lambda: cluster.ledger_one("SELECT count(*) FROM ledger WHERE key = 'long'"), 60, "the run", a, b)
    cluster.wait(lambda: cluster.pending() == 0, 30, "the ack", a, b)
    assert cluster.ledger_one("SELECT count(*) FROM starts WHERE key = 'long'") == 1
    assert cluster.ledger_one("SELECT count(*) FROM dupes") == 0


@pytest.mark.timeout(90)
def test_a_stale_owners_late_ack_deletes_nothing(cluster: Cluster) -> None:
    # Given A (1 thread, so prefetch 2) running "stale" with "filler" prefetched: A has no free slot,
    # so once "stale"'s lease expires and is reclaimed, only B can claim it
    a = cluster.start("a", threads=1)
    sent = cluster.send("hold", "stale")
    cluster.send("hold", "filler")
    cluster.wait(lambda: cluster.ledger_one("SELECT pid FROM starts WHERE key = 'stale'") == a.worker_pid, 30, "A", a)
    cluster.wait(
        lambda: cluster.broker_one("SELECT count(*) FROM broker_messages WHERE lease_owner = ?", a.owner) == 2,
        30,
        "A to hold both leases",
        a,
    )
    b = cluster.start("b", threads=2)
    while True:  # A's heartbeat may renew the lease between the UPDATE and the reap: age it again
        cluster.broker_rows("UPDATE broker_messages SET lease_expires = 0 WHERE message_id = ?", sent.message_id)
        if cluster.broker().reap() == 1:
            break
    cluster.wait(
        lambda: cluster.ledger_one("SELECT pid FROM starts WHERE key = 'stale' AND pid = ?", b.worker_pid),
        30,
        "B to run it again",
        b,
    )

    # When A finishes and acks late
    cluster.release(f"stale@{a.worker_pid}")

    # Then A reports the lost lease and the row is still B's
    cluster.wait(lambda: "Lease lost for message " + sent.message_id in a.output(), 30, "A's lost-lease report", a)
    rows = cluster.broker_rows(
        "SELECT state, lease_owner, deliveries FROM broker_messages WHERE message_id = ?", sent.message_id
    )
    assert rows == [(1, b.owner, 2)]

    cluster.release(f"stale@{b.worker_pid}")
    cluster.release("filler")
    cluster.wait(lambda: cluster.pending() == 0, 30, "B's ack", a, b)
    assert cluster.ledger("SELECT key, pid FROM ledger ORDER BY key") == [
        ("filler", a.worker_pid),
        ("stale", a.worker_pid),
    ]
    assert cluster.ledger("SELECT key, pid FROM dupes") == [("stale", b.worker_pid)]  # at least once: it ran twice


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_database_is_locked_storm_loses_no_ack_across_processes(cluster: Cluster) -> None:
    # Given two processes whose SQLite gives up on the write lock after 300 ms (TTL well above the storm),
    # busy with 2,000 messages of 20 ms each: ~2.5 s of work for their 16 threads, so the storm below
    # starts with most of it left, however loaded the machine is
    n = 2000
    a = cluster.start("a", ttl_ms=10_000, busy_ms=300)
    b = cluster.start("b", ttl_ms=10_000, busy_ms=300)
    for i in range(n):
        cluster.send("snooze", f"s{i}", 0.02)
    cluster.wait(lambda: cluster.ledger_one("SELECT count(*) FROM ledger") >= 200, 60, "processing to start", a, b)

    # When another connection holds the broker's write lock for 2 s
    holder = sqlite3.connect(cluster.broker_db, isolation_level=None, timeout=60)
    try:
        holder.execute("BEGIN IMMEDIATE")
        done_at_storm = cluster.ledger_one("SELECT count(*) FROM ledger")
        time.sleep(2.0)  # the storm itself
        holder.execute("COMMIT")
    finally:
        holder.close()
    assert done_at_storm < n, "the work was over before the storm began"

    # Then everything is processed exactly once and every ack lands
    cluster.wait(lambda: cluster.ledger_one("SELECT count(*) FROM ledger") == n, 90, f"{n} ledger rows", a, b)
    cluster.wait(lambda: cluster.pending() == 0, 30, "every ack", a, b)
    assert cluster.ledger_one("SELECT count(*) FROM dupes") == 0
    assert "database is locked" in a.output() + b.output()  # the storm did hit the workers
