"""Supervision with real processes: ``tenure worker`` replaces a SIGKILLed worker process while its sibling
runs on, gives a slot up after 10 crashes in a row (log, metrics, the Workers page and its API), and
``tenure scheduler`` and ``tenure relay`` replace a SIGKILLed child.

Every supervisor writes its slots to the test's job database (``worker_slots``), which is how these tests
find the child pids; metrics come from the test's ``PROMETHEUS_MULTIPROC_DIR``.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dramatiq.message import Message
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

import accounts
import jobs
from broker import SQLiteBroker
from jobs import schema
from jobs.db import make_engine
from jobs.registry import Registry
from settings.environment import Settings
from tests.acceptance.operations.apps.ledger import QUEUE, create_ledger, ledger_connect

from .support import ROOT, Proc, Procs, processes, wait_for
from .web import Http, free_port, live

APP = "tests.acceptance.operations.apps.ops_app"
ADMIN_PASSWORD = "supervision-admin-password"


@dataclass
class Rig:
    procs: Procs
    tmp: Path
    db: Path
    ledger_db: Path
    prom: Path

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PROMETHEUS_", "OPS_"))}
        env.update(
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            TENURE_DATABASE_URL=self.url,
            PROMETHEUS_MULTIPROC_DIR=str(self.prom),
            OPS_BROKER_DB=str(self.db),
            OPS_LEDGER_DB=str(self.ledger_db),
            OPS_TTL_MS="3000",
        )
        env.update(extra)
        return env

    def worker(self, name: str, *, processes: int, supervision: tuple[str, ...] = (), **env: str) -> Proc:
        argv = [sys.executable, "-m", "tenure_cli", "worker", APP, "-p", str(processes), "-t", "2"]
        argv += ["--queues", QUEUE, "--worker-shutdown-timeout", "2000", *supervision]
        return self.procs.start(name, argv, self.env(**env))

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            return conn.execute(query, params).fetchall()
        finally:
            conn.close()

    def slots(self, role: str) -> dict[int, dict[str, Any]]:
        """``slot → worker_slots row`` of the live supervisor of *role*."""
        conn = sqlite3.connect(self.db, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute("SELECT * FROM worker_slots WHERE role = ?", (role,)).fetchall()
        finally:
            conn.close()
        return {r["slot"]: dict(r) for r in rows}

    def registered(self, pid: int | None) -> bool:
        """Whether worker process *pid* has booted: its consumer is in the broker's process registry."""
        return pid is not None and bool(self.sql("SELECT 1 FROM broker_processes WHERE pid = ?", pid))

    def ledger(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = ledger_connect(str(self.ledger_db))
        try:
            return conn.execute(query, params).fetchall()
        finally:
            conn.close()

    def send_and_release(self, keys: list[str]) -> None:
        producer = SQLiteBroker(self.url, middleware=[])
        try:
            producer.declare_queue(QUEUE)
            for key in keys:
                producer.enqueue(Message(queue_name=QUEUE, actor_name="hold", args=(key,), kwargs={}, options={}))
        finally:
            producer.close()
        conn = ledger_connect(str(self.ledger_db))
        conn.executemany("INSERT OR IGNORE INTO release (key) VALUES (?)", [(k,) for k in keys])
        conn.close()

    def metric(self, name: str, **labels: str) -> float | None:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.prom))
        return registry.get_sample_value(name, labels)


@pytest.fixture()
def rig(tmp_path: Path) -> Iterator[Rig]:
    db = tmp_path / "tenure.db"
    schema.upgrade(f"sqlite:///{db}")
    create_ledger(str(tmp_path / "ledger.db"))
    (tmp_path / "prom").mkdir()
    with processes(tmp_path) as procs:
        yield Rig(procs, tmp_path, db, tmp_path / "ledger.db", tmp_path / "prom")


def _both_running(rig: Rig) -> dict[int, dict[str, Any]] | None:
    slots = rig.slots("worker")
    ready = len(slots) == 2 and all(s["state"] == "running" and rig.registered(s["pid"]) for s in slots.values())
    return slots if ready else None


@pytest.mark.timeout(120)
def test_a_sigkilled_worker_process_is_replaced_within_seconds_and_its_sibling_runs_on(rig: Rig) -> None:
    # Given tenure worker with two worker processes, both booted
    loaded = rig.tmp / "loaded"
    loaded.mkdir()
    sup = rig.worker("worker", processes=2, OPS_LOADED_DIR=str(loaded))
    before = wait_for("both worker processes to boot", lambda: _both_running(rig), 60, rig.procs)
    victim, sibling = before[0]["pid"], before[1]["pid"]

    # When worker process 0 is SIGKILLed (what an OOM kill looks like)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)

    # Then its slot gets a new process within seconds, and nothing else changed
    after = wait_for("slot 0 to be restarted", lambda: (s := rig.slots("worker"))[0]["restarts"] == 1 and s, 30)
    restarted_s = time.monotonic() - killed_at
    replaced = after[0]["pid"]
    wait_for("the replacement to boot", lambda: rig.registered(replaced), 60, rig.procs)
    booted_s = time.monotonic() - killed_at
    print(f"\nslot 0 restarted {restarted_s:.2f} s after the SIGKILL, its new process booted after {booted_s:.2f} s")
    assert restarted_s < 5, restarted_s  # the first restart waits 0.5 s
    assert replaced not in (victim, sibling)
    assert (after[0]["state"], after[0]["crashes"], after[0]["last_exit"]) == ("running", 1, "killed by SIGKILL")
    assert (after[1]["pid"], after[1]["restarts"], after[1]["crashes"]) == (sibling, 0, 0)
    assert sup.popen.poll() is None
    os.kill(sibling, 0)  # still the same process
    log = sup.output()
    assert (
        f"worker process 0 (PID {victim}) exited unexpectedly (killed by SIGKILL, perhaps out of memory); "
        "restarting it in 0.50 s (crash 1 in a row; given up at 10)." in log
    ), log
    assert f"worker process 0 restarted as PID {replaced} (restart 1)." in log
    # Every worker process, the replacement too, was forked with the job layer loaded (the supervisor
    # imports it once), before it imported the app
    assert {p.name: p.read_text() for p in loaded.iterdir()} == {
        str(pid): "jobs" for pid in (victim, sibling, replaced)
    }
    assert rig.metric("tenure_worker_restarts_total", role="worker", slot="0") == 1
    assert rig.metric("tenure_worker_restarts_total", role="worker", slot="1") == 0
    assert rig.metric("tenure_worker_slots_given_up", role="worker") == 0

    # ... and both processes take work
    keys = [f"k{i}" for i in range(8)]
    rig.send_and_release(keys)
    wait_for("every message to complete", lambda: len(rig.ledger("SELECT key FROM done")) == 8, 30, rig.procs)
    assert {pid for (pid,) in rig.ledger("SELECT DISTINCT pid FROM done")} <= {replaced, sibling}

    # When the supervisor's group gets SIGTERM, it stops as before: exit 0, its slots unregistered
    rig.procs.signal(sup, signal.SIGTERM, group=True)
    assert sup.popen.wait(30) == 0, sup.output()
    assert rig.slots("worker") == {}


def _web(rig: Rig) -> tuple[Proc, Http]:
    """A web process (gunicorn, the real app) on the rig's job database, and an admin's client of it."""
    engine = make_engine(rig.url)
    accounts.create_user(engine, "admin", ADMIN_PASSWORD, role="admin")
    engine.dispose()
    port = free_port()
    argv = [str(Path(sys.executable).parent / "gunicorn"), "-c", "gunicorn.conf.py", "webapp:create_app()"]
    web = rig.procs.start("web", argv, rig.env(PORT=str(port), TENURE_WEB_WORKERS="1"))
    wait_for("the web process to answer", lambda: live(port), 60, rig.procs, poll_s=0.2)
    return web, Http(port, "admin", ADMIN_PASSWORD)


def _scrape(http: Http) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    req = urllib.request.Request(http.base + "/metrics", headers={"Authorization": http.auth})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.timeout(180)
def test_a_slot_that_crashes_10_times_in_a_row_is_given_up_reported_and_the_other_runs_on(rig: Rig) -> None:
    # Given tenure worker with two booted worker processes and short restart backoffs (20 ms doubling to 160 ms)
    flag = rig.tmp / "crash-at-boot"
    backoff = ("--restart-backoff-ms", "20", "--restart-backoff-max-ms", "160")
    sup = rig.worker("worker", processes=2, supervision=backoff, OPS_CRASH_FLAG=str(flag))
    before = wait_for("both worker processes to boot", lambda: _both_running(rig), 60, rig.procs)
    survivor = before[1]["pid"]
    web, http = _web(rig)

    # When worker process 0 is SIGKILLed and every process started in its place dies at boot (os._exit(1))
    flag.touch()
    os.kill(before[0]["pid"], signal.SIGKILL)

    # Then after 10 crashes in a row (the SIGKILL and 9 boots) the slot is given up: not restarted any more
    slots = wait_for("slot 0 to be given up", lambda: (s := rig.slots("worker"))[0]["state"] == "given_up" and s, 90)
    assert (slots[0]["crashes"], slots[0]["restarts"], slots[0]["pid"]) == (10, 9, None)
    assert slots[0]["last_exit"] == "exited with code 1"
    assert (slots[1]["state"], slots[1]["pid"], slots[1]["restarts"]) == ("running", survivor, 0)
    boots = [at for (at,) in rig.ledger("SELECT at FROM boots ORDER BY at")]
    assert len(boots) == 9
    # ... after a backoff that doubled between the tries, up to its maximum
    log = sup.output()
    crash_line = r"worker process 0 \(PID \d+\) exited unexpectedly .*?restarting it in ([\d.]+) s"
    delays = [float(d) for d in re.findall(crash_line, log)]
    assert delays == [0.02, 0.04, 0.08, 0.16, 0.16, 0.16, 0.16, 0.16, 0.16], log
    gaps = [b - a for a, b in zip(boots, boots[1:], strict=False)]
    assert all(gap >= delay for gap, delay in zip(gaps, delays[1:], strict=True)), (gaps, delays)
    # ... reported: the log line, the metrics, the Workers page and its API
    assert "exited unexpectedly (exited with code 1): 10 crashes in a row, so the slot is given up" in log, log
    metrics = _scrape(http)
    assert metrics[("tenure_worker_restarts_total", (("role", "worker"), ("slot", "0")))] == 9
    assert metrics[("tenure_worker_restarts_total", (("role", "worker"), ("slot", "1")))] == 0
    assert metrics[("tenure_worker_slots_given_up", (("role", "worker"),))] == 1
    status, api = http.call("GET", "/api/v1/workers/slots")
    assert status == 200, api
    by_slot = {s["slot"]: s for s in api if s["role"] == "worker"}
    assert (by_slot[0]["state"], by_slot[0]["restarts"], by_slot[0]["crashes"]) == ("given_up", 9, 10)
    assert by_slot[0]["last_exit"] == "exited with code 1" and by_slot[0]["pid"] is None
    assert (by_slot[1]["state"], by_slot[1]["pid"]) == ("running", survivor)
    page = http.page("/ops/workers")
    assert "9 restart(s)" in page and "1 slot(s) given up" in page, page
    row = re.search(r'<tr id="slot-worker-[^"]*-0">(.*?)</tr>', page, re.S)
    assert row and "given up" in row.group(1) and "exited with code 1" in row.group(1), page

    # ... and the other slot keeps processing jobs, alone (no process is started in slot 0 any more)
    keys = [f"k{i}" for i in range(5)]
    rig.send_and_release(keys)
    wait_for("the messages to complete", lambda: len(rig.ledger("SELECT key FROM done")) == 5, 30, rig.procs)
    assert rig.ledger("SELECT DISTINCT pid FROM done") == [(survivor,)]
    assert len(rig.ledger("SELECT at FROM boots")) == 9 and rig.slots("worker")[0]["state"] == "given_up"

    # When it is stopped, tenure worker exits 1: a slot was given up
    rig.procs.signal(sup, signal.SIGTERM, group=True)
    assert sup.popen.wait(30) == 1, sup.output()
    rig.procs.signal(web, signal.SIGQUIT, group=True)  # not under test: gunicorn's quick stop, no 6 s drain


@pytest.mark.timeout(90)
def test_sighup_restarts_every_worker_process_in_place(rig: Rig) -> None:
    # Given tenure worker with one booted worker process
    sup = rig.worker("worker", processes=1)
    first = wait_for("the worker process to boot", lambda: _booted(rig), 60, rig.procs)

    # When the supervisor gets SIGHUP (Dramatiq's reload)
    rig.procs.signal(sup, signal.SIGHUP)

    # Then the worker process stops gracefully and the same supervisor pid starts a new one
    def reloaded() -> dict[int, dict[str, Any]] | None:
        s = rig.slots("worker")
        return s if s and s[0]["pid"] != first[0]["pid"] and rig.registered(s[0]["pid"]) else None

    after = wait_for("a new worker process", reloaded, 60, rig.procs)
    assert after[0]["supervisor_pid"] == sup.pid and after[0]["restarts"] == 0
    assert "Worker has been shut down." in sup.output()
    assert sup.popen.poll() is None


def _booted(rig: Rig) -> dict[int, dict[str, Any]] | None:
    slots = rig.slots("worker")
    return slots if slots and rig.registered(slots[0]["pid"]) else None


def _child_pid(rig: Rig, role: str, *, other_than: int | None = None) -> int | None:
    slots = rig.slots(role)
    pid = slots[0]["pid"] if slots else None
    return pid if pid is not None and pid != other_than else None


@pytest.mark.timeout(120)
def test_the_scheduler_replaces_a_sigkilled_periodiq_and_keeps_firing(rig: Rig) -> None:
    # Given tenure scheduler on the schedule tests' app, firing its one-second `tick` schedule
    (rig.tmp / "log.db").touch()
    env = rig.env(SCHED_TEST_DB=str(rig.db), SCHED_TEST_LOG=str(rig.tmp / "log.db"), SCHED_TEST_SCHEDULES="tick")
    argv = [sys.executable, "-m", "tenure_cli", "scheduler", "tests.acceptance.scheduling.app"]
    sup = rig.procs.start("scheduler", [*argv, "--restart-backoff-ms", "100"], env)
    child = wait_for("the scheduler's child", lambda: _child_pid(rig, "scheduler"), 60, rig.procs)

    def fired_by(pid: int) -> int:
        return len(rig.sql("SELECT 1 FROM schedule_fires WHERE schedule = 'tick' AND fired_by LIKE ?", f"%:{pid}"))

    wait_for("a tick fired by periodiq", lambda: fired_by(child), 60, rig.procs)

    # When periodiq's process is SIGKILLed
    os.kill(child, signal.SIGKILL)

    # Then the supervisor starts another, which fires the next ticks
    replaced = wait_for("a new scheduler child", lambda: _child_pid(rig, "scheduler", other_than=child), 30, rig.procs)
    wait_for("a tick fired by the new child", lambda: fired_by(replaced), 60, rig.procs)
    row = rig.slots("scheduler")[0]
    assert (row["restarts"], row["last_exit"]) == (1, "killed by SIGKILL")
    assert f"scheduler process 0 restarted as PID {replaced} (restart 1)." in sup.output()
    assert rig.metric("tenure_worker_restarts_total", role="scheduler", slot="0") == 1

    # When it is stopped (SIGTERM to its group, as honcho does), it exits 0
    rig.procs.signal(sup, signal.SIGTERM, group=True)
    assert sup.popen.wait(30) == 0, sup.output()


@pytest.mark.timeout(120)
def test_the_relay_replaces_its_sigkilled_loop_and_publishes_what_comes_next(rig: Rig) -> None:
    # Given job records in the rig's database and messages in another SQLite file (so: outbox + relay)
    broker_url = f"sqlite:///{rig.tmp / 'broker.db'}"
    argv = [sys.executable, "-m", "tenure_cli", "relay", "--restart-backoff-ms", "100"]
    sup = rig.procs.start("relay", argv, rig.env(TENURE_BROKER_URL=broker_url))
    child = wait_for("the relay's child", lambda: _child_pid(rig, "relay"), 60, rig.procs)
    wait_for("the relay loop to start", lambda: "Outbox relay started." in sup.output(), 60, rig.procs)

    # When the relay loop's process is SIGKILLed
    os.kill(child, signal.SIGKILL)

    # Then the supervisor starts another, which publishes a job submitted after the kill
    replaced = wait_for("a new relay child", lambda: _child_pid(rig, "relay", other_than=child), 30, rig.procs)
    engine = make_engine(rig.url)
    broker = SQLiteBroker(broker_url, middleware=[])
    try:
        registry = Registry()
        registry.kind("echo", broker=broker)(lambda ctx, **p: p)
        settings = Settings(database_url=rig.url, broker_url=broker_url, output_root=str(rig.tmp / "out"))
        job = jobs.submit(engine, owner_id="u1", kind="echo", payload={}, registry=registry, settings=settings)
        published = "SELECT published_at FROM outbox WHERE job_id = ? AND published_at IS NOT NULL"
        wait_for("the outbox row to be published", lambda: rig.sql(published, job.id), 30, rig.procs)
    finally:
        broker.close()
        engine.dispose()
    row = rig.slots("relay")[0]
    assert (row["pid"], row["restarts"], row["last_exit"]) == (replaced, 1, "killed by SIGKILL")
    assert rig.metric("tenure_worker_restarts_total", role="relay", slot="0") == 1

    rig.procs.signal(sup, signal.SIGTERM, group=True)
    assert sup.popen.wait(30) == 0, sup.output()


@pytest.mark.timeout(60)
def test_what_no_restart_mends_is_refused_at_once(rig: Rig, tmp_path: Path) -> None:
    # The relay on a database that is not at this code's schema revision: exit 1 before any child
    unmigrated = f"sqlite:///{tmp_path / 'unmigrated.db'}"
    relay = subprocess.run(
        [sys.executable, "-m", "tenure_cli", "relay"],
        cwd=ROOT,
        env=rig.env(TENURE_DATABASE_URL=unmigrated),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert relay.returncode == 1 and "tenure db upgrade" in relay.stderr, relay.stderr
    assert "Supervising" not in relay.stderr
    # Dramatiq's options tenure worker does not support: exit 2 with the reason
    for option in (["--watch", str(tmp_path)], ["--fork-function", "x:y"], ["--use-spawn"]):
        worker = subprocess.run(
            [sys.executable, "-m", "tenure_cli", "worker", APP, *option],
            cwd=ROOT,
            env=rig.env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert worker.returncode == 2, worker.stderr
        assert f"{option[0]} is not supported by tenure worker (run `dramatiq` for it)" in worker.stderr
