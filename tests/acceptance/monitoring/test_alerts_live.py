"""Every shipped alert rule against a real Prometheus scraping a real ``make run``-like deployment.

The deployment is ``scripts/run.sh``'s, without honcho (honcho stops every process when one exits,
and these tests stop processes one by one): ``tenure db upgrade``, ``tenure users ensure-admin``,
one multiprocess directory, and each Procfile command (web, worker, asr, scheduler) in a process
group of its own, on a temporary SQLite file. Prometheus (Debian package, scripts/install_prometheus.sh)
scrapes the web process every second and evaluates ``monitoring/prometheus/alerts.yml`` every second.

What the tests change, and why:

- **``for:`` windows.** Prometheus loads a copy of alerts.yml whose every ``for:`` is ``1s``
  (5 minutes of lag would otherwise take 5 minutes); :func:`rules_with_short_for` asserts that the
  copy differs from the shipped file in nothing else: expressions, range windows and thresholds are
  the shipped ones. The healthy phase then asserts that no rule is even *pending*, which is
  stronger than "none fires within the shipped ``for:``".
- **The broker lease TTL** is 2 s (``TENURE_BROKER_LEASE_TTL_S``), so expired and lost leases
  happen in seconds.
- **Time-based thresholds** (lag > 5 min, a tick overdue by 5 min) are met by the state the faults
  leave, written with the product's own APIs: the lag backlog carries an ``eta`` 6 minutes in the
  past (as a delayed message's does), and the schedule's history says the scheduler last fired the
  resync 7 minutes ago (its rows written with ``tasks.scheduling.store``, as that scheduler would
  have). Everything else is a real fault of a real process: an unknown actor's messages
  dead-lettered by the worker, a paused queue, a worker process stopped (SIGSTOP) past its lease
  while it holds a webhook delivery, the ASR worker stopped, every worker SIGKILLed, the web stopped.

One test runs the phases in order on one deployment (pytest would tear a module fixture down between
tests that xdist interleaves with other modules'): each phase starts from the state the previous
one left, and first asserts that the alert it is about is not active, so a phase can never pass on
what an earlier one caused.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import dramatiq
import pytest
import yaml

from broker import SQLiteBroker
from jobs import db
from jobs.db import make_engine
from jobs.schema import upgrade
from tasks.domain.notify.signing import new_secret
from tasks.maintenance import RESYNC_PERIOD_S
from tasks.scheduling import every
from tasks.scheduling import store as schedule_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[3]
ALERTS = ROOT / "monitoring" / "prometheus" / "alerts.yml"
BIN = Path(sys.executable).parent
#: Every ``for:`` of the rules Prometheus loads.
SHORT_FOR = "1s"
#: How long the healthy deployment is watched with no rule pending or firing, in seconds.
HEALTHY_WATCH_S = 4.0
#: ``fired_by`` of the fire row written for the scheduler that stopped before the tests.
BACKDATED_BY = "scheduler-before-the-tests"
WAIT_S = 30.0
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T], timeout_s: float = WAIT_S, logs: Callable[[], str] | None = None) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{logs() if logs else ''}")
        time.sleep(0.2)


def random_port() -> int:
    """A free port in 20000-29999 (the range this machine's test servers share)."""
    while True:
        port = random.randint(20000, 29999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def rules_with_short_for(original: dict[str, Any]) -> dict[str, Any]:
    """The shipped rules with every ``for:`` set to :data:`SHORT_FOR`, asserting nothing else changed."""
    copy = json.loads(json.dumps(original))
    for group in copy["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = SHORT_FOR

    def without_for(doc: dict[str, Any]) -> dict[str, Any]:
        stripped = json.loads(json.dumps(doc))
        for group in stripped["groups"]:
            for rule in group["rules"]:
                rule.pop("for", None)
        return stripped

    assert without_for(copy) == without_for(original)
    assert sum(1 for g in copy["groups"] for r in g["rules"] if r.get("for") == SHORT_FOR) >= 1
    return copy


# -- a webhook receiver that holds each delivery until released ---------------------------------------


@dataclass
class HoldingReceiver:
    """Answers each webhook POST with 204 once :attr:`release` is set (a worker holds its lease meanwhile)."""

    release: threading.Event = field(default_factory=threading.Event)
    arrivals: int = 0
    server: ThreadingHTTPServer | None = None

    def start(self) -> HoldingReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.arrivals += 1
                receiver.release.wait(20)
                try:
                    self.send_response(204)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker was killed

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", random_port()), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


# -- the deployment ---------------------------------------------------------------------------------------


def procfile() -> dict[str, str]:
    entries = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            entries[name.strip()] = command.strip()
    return entries


@dataclass
class Deployment:
    tmp: Path
    env: dict[str, str]
    db_path: Path
    web_port: int
    prometheus_url: str
    broker: SQLiteBroker
    receiver: HoldingReceiver
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    password: str = ""
    #: Seconds per phase (shown when a later phase fails, and with ``pytest -s``).
    phase_durations: dict[str, float] = field(default_factory=dict)

    # processes
    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs[name] = proc
        return proc

    def start_procfile(self, name: str) -> subprocess.Popen[bytes]:
        return self.start(name, ["bash", "-c", f"exec {procfile()[name]}"])

    def signal_group(self, name: str, sig: int) -> None:
        try:
            os.killpg(self.procs[name].pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, name: str) -> None:
        """SIGTERM the group (the worker drains, exit code 75), SIGKILL what is left after 15 s."""
        self.signal_group(name, signal.SIGTERM)
        try:
            self.procs[name].wait(15)
        except subprocess.TimeoutExpired:
            pass
        self.signal_group(name, signal.SIGKILL)
        self.procs[name].wait(10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.signal_group(name, signal.SIGTERM)
        for name in list(self.procs):
            self.stop(name)

    def logs(self) -> str:
        tails = [f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.tmp.glob("*.log"))]
        return "\n".join([f"phases done (s): {self.phase_durations}", *tails])

    # the deployment's database, read-only
    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10) as conn:
            return conn.execute(query, args).fetchall()

    # the web API, as the admin
    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.web_port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
        )
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", "Basic " + base64.b64encode(f"admin:{self.password}".encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            with e:
                return e.code, json.loads(e.read() or b"null")

    def job_status(self, job_id: str) -> str:
        status, job = self.api("GET", f"/api/v1/jobs/{job_id}")
        assert status == 200, job
        return str(job["status"])

    # Prometheus
    def prom(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus_url}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as resp:
            data = json.load(resp)
        assert data["status"] == "success", data
        return data["data"]

    def value(self, expr: str) -> float | None:
        result = self.prom("/api/v1/query", query=expr)["result"]
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> dict[str, set[str]]:
        """Active alerts: ``{"firing": {alertname…}, "pending": {…}}``."""
        out: dict[str, set[str]] = {"firing": set(), "pending": set()}
        for alert in self.prom("/api/v1/alerts")["alerts"]:
            out[alert["state"]].add(alert["labels"]["alertname"])
        return out

    def firing(self) -> set[str]:
        return self.alerts()["firing"]

    def wait_firing(self, *names: str, timeout_s: float = WAIT_S) -> None:
        wait_for(f"{names} firing (now {self.alerts()})", lambda: set(names) <= self.firing(), timeout_s, self.logs)

    def wait_inactive(self, *names: str) -> None:
        def inactive() -> bool:
            active = self.alerts()
            return not (set(names) & (active["firing"] | active["pending"]))

        wait_for(f"{names} neither pending nor firing (now {self.alerts()})", inactive, WAIT_S, self.logs)

    def last_evaluation(self) -> str:
        """When Prometheus last evaluated the rule group (every rule healthy)."""
        (group,) = self.prom("/api/v1/rules")["groups"]
        assert all(r["health"] == "ok" for r in group["rules"]), group["rules"]
        return str(group["lastEvaluation"])

    # the broker, through its own API (same file)
    def enqueue(self, queue: str, actor: str, *args: Any, eta_ms: int | None = None) -> None:
        options = {} if eta_ms is None else {"eta": eta_ms}
        self.broker.enqueue(dramatiq.Message(queue_name=queue, actor_name=actor, args=args, kwargs={}, options=options))

    def lease_holder(self, queue: str) -> tuple[int, str] | None:
        """(pid, lease owner) of the process holding a lease on *queue*, if one does."""
        rows = self.sql(
            "SELECT p.pid, m.lease_owner FROM broker_messages m JOIN broker_processes p ON p.owner = m.lease_owner "
            "WHERE m.state = 1 AND m.queue = ?",
            queue,
        )
        return (int(rows[0][0]), str(rows[0][1])) if rows else None


def backdate_resync_history(database_url: str) -> None:
    """The schedules' state of a deployment whose scheduler last fired the resync 7 minutes ago, then stopped.

    Written with the scheduler's own store functions, as that scheduler would have: the anchor, the
    fence moved to the tick, the fire row, and the next tick it planned (6.5 minutes ago now).
    """
    period_ms = RESYNC_PERIOD_S * 1000
    now = time.time_ns() // 1_000_000
    tick = (now // period_ms - 14) * period_ms
    engine = make_engine(database_url)
    try:
        with db.write(engine) as tx:
            schedule_store.schedule_ensure(
                tx.conn, "resync", tick - period_ms, every(seconds=RESYNC_PERIOD_S).describe()
            )
            assert schedule_store.schedule_claim_tick(tx.conn, "resync", tick, tick + 3)
            fire = schedule_store.FireRecord("resync", tick, "schedule", None, None, tick, BACKDATED_BY, tick + 3)
            assert schedule_store.fire_insert(tx.conn, fire)
            schedule_store.schedule_plan_next(tx.conn, "resync", tick + period_ms, tick + 3)
    finally:
        engine.dispose()


@pytest.fixture()
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (scripts/install_prometheus.sh)")
    tmp = tmp_path_factory.mktemp("alerts-live")
    db_path = tmp / "tenure.db"
    database_url = f"sqlite:///{db_path}"
    receiver = HoldingReceiver().start()
    channels = tmp / "channels.json"
    channels.write_text(json.dumps({"hook": {"type": "webhook", "url": receiver.url, "secret": new_secret().reveal()}}))
    channels.chmod(0o600)
    web_port = random_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PROMETHEUS_", "PYTHON"))}
    env.update(
        PATH=f"{BIN}:{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        PORT=str(web_port),
        TENURE_DATABASE_URL=database_url,
        TENURE_OUTPUT_ROOT=str(tmp / "outputs"),
        TENURE_NOTIFY_CHANNELS=str(channels),
        TENURE_BROKER_LEASE_TTL_S="2",
        TENURE_WEB_WORKERS="1",
        TENURE_WEB_METRICS_PUBLIC="true",  # Prometheus scrapes without a token (docs/monitoring.md)
        PROMETHEUS_MULTIPROC_DIR=str(tmp / "prometheus-multiproc"),
    )
    (tmp / "prometheus-multiproc").mkdir()

    # make run's preparation (`tenure db upgrade` runs this function), then the history of a scheduler
    # that stopped
    upgrade(database_url)
    backdate_resync_history(database_url)
    broker = SQLiteBroker(database_url, middleware=[])
    for queue in ("default", "asr", "maintenance"):
        broker.declare_queue(queue)

    rules = tmp / "alerts.yml"
    rules.write_text(yaml.safe_dump(rules_with_short_for(yaml.safe_load(ALERTS.read_text()))))
    prom_port = random_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "tenure", "static_configs": [{"targets": [f"127.0.0.1:{web_port}"]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    d = Deployment(tmp, env, db_path, web_port, f"http://127.0.0.1:{prom_port}", broker, receiver)
    try:
        admin = d.start("ensure-admin", [str(BIN / "tenure"), "users", "ensure-admin"])
        for name in ("web", "worker", "asr"):  # the scheduler stays stopped: the first test is about that
            d.start_procfile(name)
        d.start(
            "prometheus",
            [
                prometheus,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
        )
        admin.wait(120)
        d.password = re.search(r"with password: (\S+)", (tmp / "ensure-admin.log").read_text()).group(1)  # type: ignore[union-attr]

        def scraping() -> bool:
            try:
                return d.value('up{job="tenure"}') == 1
            except OSError:
                return False

        wait_for("Prometheus scraping the web process", scraping, 60, d.logs)
        yield d
    finally:
        d.stop_all()
        receiver.stop()
        broker.close()


# -- the phases, in order: each starts from the state the previous one left -------------------------------


def stopped_scheduler_fires_no_scheduler_fire_and_schedule_overdue(dep: Deployment) -> None:
    # Given web, worker and asr running, and the scheduler stopped since it fired 7 minutes ago
    dep.wait_firing("TenureNoSchedulerFire", "TenureScheduleOverdue")
    wait_for("3 worker processes", lambda: dep.value("sum(tenure_worker_processes)") == 3, 90, dep.logs)
    # Then those two fire, and nothing else is active once every worker is up
    wait_for(
        f"only the scheduler alerts active (now {dep.alerts()})",
        lambda: dep.alerts() == {"firing": {"TenureNoSchedulerFire", "TenureScheduleOverdue"}, "pending": set()},
    )
    assert dep.value('time() - tenure_schedule_next_fire_timestamp_seconds{schedule="resync"}') > 300


def healthy_deployment_fires_no_rule(dep: Deployment) -> None:
    # When the scheduler starts: it fires the latest missed resync tick at once (within its 30 s grace)
    dep.start_procfile("scheduler")
    wait_for(
        "the scheduler's first fire",
        lambda: dep.sql("SELECT 1 FROM schedule_fires WHERE schedule = 'resync' AND fired_by <> ?", BACKDATED_BY),
        60,
        dep.logs,
    )
    # …and Prometheus sees the fire as an increase (the counters were exported at 0 before it)
    wait_for(
        "the fire counted",
        lambda: (dep.value('sum(increase(tenure_schedule_fires_total{result="fired"}[5m]))') or 0) > 0,
    )
    dep.wait_inactive("TenureNoSchedulerFire", "TenureScheduleOverdue")
    # And with some traffic (webhook jobs, delivered at once)
    dep.receiver.release.set()
    for n in range(20):
        status, job = dep.api(
            "POST",
            "/api/v1/jobs",
            {"kind": "notify_webhook", "payload": {"channel": "hook", "event_type": "ping", "data": {"n": n}}},
        )
        assert status == 201, job
    # …and a job that fails on bad input (no such channel): a job outcome, not a failed delivery
    status, bad = dep.api(
        "POST", "/api/v1/jobs", {"kind": "notify_webhook", "payload": {"channel": "nope", "event_type": "ping"}}
    )
    assert status == 201, bad
    wait_for("the webhook job to succeed", lambda: dep.job_status(job["id"]) == "succeeded")
    wait_for("the bad job to fail", lambda: dep.job_status(bad["id"]) == "failed")
    # Then no rule is pending or firing, at any evaluation over the watch
    evaluations = set()
    deadline = time.monotonic() + HEALTHY_WATCH_S
    while time.monotonic() < deadline:
        assert dep.alerts() == {"firing": set(), "pending": set()}, dep.logs()
        evaluations.add(dep.last_evaluation())
        time.sleep(0.25)
    assert len(evaluations) >= HEALTHY_WATCH_S - 2, "Prometheus kept evaluating the rules"
    assert dep.value('sum(tenure_jobs_finished_total{kind="notify_webhook",outcome="succeeded"})') == 20
    assert dep.value('sum(tenure_jobs_finished_total{kind="notify_webhook",outcome="failed"})') == 1
    assert dep.value('sum(tenure_messages_processed_total{actor="notify_webhook",outcome="ok"})') == 21


def dead_letters_fire_dead_letters_growing_and_failure_rate(dep: Deployment) -> None:
    assert not {"TenureDeadLettersGrowing", "TenureFailureRateHigh"} & dep.firing()
    # When messages for an actor no worker declares arrive (a newer web app than its workers):
    # the workers dead-letter them. The first makes the outcome series exist; the others are increases.
    dep.enqueue("default", "ghost")
    wait_for(
        "the first dead letter seen",
        lambda: dep.value('sum(tenure_messages_processed_total{actor="ghost",outcome="dead_lettered"})') == 1,
    )
    for _ in range(4):
        dep.enqueue("default", "ghost")
    # Then
    dep.wait_firing("TenureDeadLettersGrowing", "TenureFailureRateHigh")
    assert dep.value('tenure_queue_messages{queue="default",state="dead"}') == 5


def paused_queue_backlog_fires_queue_lag(dep: Deployment) -> None:
    assert "TenureQueueLagHigh" not in dep.firing()
    # Given an operator paused "maintenance", and resync messages that fell due 6 minutes ago wait there
    status, body = dep.api("POST", "/api/v1/queues/maintenance/pause")
    assert status == 200 and body["paused"], body
    six_minutes_ago = time.time_ns() // 1_000_000 - 360_000
    for _ in range(3):
        dep.enqueue("maintenance", "resync", eta_ms=six_minutes_ago)
    # Then
    dep.wait_firing("TenureQueueLagHigh")
    assert "TenureQueueWithoutConsumers" not in dep.firing()  # the workers still consume it
    # And once resumed, the workers drain it and the alert ends
    status, body = dep.api("POST", "/api/v1/queues/maintenance/resume")
    assert status == 200 and not body["paused"], body
    dep.wait_inactive("TenureQueueLagHigh")


def worker_stalled_past_its_lease_fires_leases_lost(dep: Deployment) -> None:
    assert "TenureLeasesLost" not in dep.firing()
    # Given a worker process delivering a webhook to a receiver that holds the request
    dep.receiver.release.clear()
    arrivals = dep.receiver.arrivals
    status, job = dep.api(
        "POST", "/api/v1/jobs", {"kind": "notify_webhook", "payload": {"channel": "hook", "event_type": "stall"}}
    )
    assert status == 201, job
    wait_for("the webhook request", lambda: dep.receiver.arrivals > arrivals)
    pid, owner = wait_for("the notify lease", lambda: dep.lease_holder("notify"))
    # When that process stalls (SIGSTOP) past the 2 s lease TTL, and a live sibling reclaims the lease.
    # A process stopped inside a SQLite write transaction would hold the write lock and stall every
    # writer: then it is resumed a moment and stopped again.
    for _attempt in range(3):
        os.kill(pid, signal.SIGSTOP)
        try:
            reaped = wait_for("the lease reclaimed", lambda: dep.lease_holder("notify") != (pid, owner), 6.0)
        except AssertionError:
            reaped = False
        if reaped:
            break
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
    assert reaped, dep.logs()
    # …and then resumes and finishes the delivery: its ack finds the lease gone
    os.kill(pid, signal.SIGCONT)
    dep.receiver.release.set()
    # Then
    dep.wait_firing("TenureLeasesLost")
    assert (dep.value("sum(tenure_leases_lost_total)") or 0) >= 1


def stopped_asr_worker_fires_queue_without_consumers(dep: Deployment) -> None:
    assert "TenureQueueWithoutConsumers" not in dep.firing()
    # When the ASR worker process dies (with its parent: nothing restarts it) and a message waits on its queue
    dep.signal_group("asr", signal.SIGKILL)
    dep.procs["asr"].wait(10)
    dep.enqueue("asr", "transcribe")
    # Then
    dep.wait_firing("TenureQueueWithoutConsumers")
    assert dep.value('tenure_queue_consumers{queue="asr"}') == 0
    assert "TenureWorkersDown" not in dep.firing()  # the other worker processes still run


def killed_workers_fire_workers_down_and_leases_expiring(dep: Deployment) -> None:
    assert not {"TenureWorkersDown", "TenureLeasesExpiring"} & dep.firing()
    # Given a worker process holding a webhook delivery's lease
    dep.receiver.release.clear()
    arrivals = dep.receiver.arrivals
    status, job = dep.api(
        "POST", "/api/v1/jobs", {"kind": "notify_webhook", "payload": {"channel": "hook", "event_type": "kill"}}
    )
    assert status == 201, job
    wait_for("the webhook request", lambda: dep.receiver.arrivals > arrivals)
    wait_for("the notify lease", lambda: dep.lease_holder("notify"))
    # When every worker process is SIGKILLed (the whole group: nothing restarts them, nothing reaps)
    dep.signal_group("worker", signal.SIGKILL)
    dep.procs["worker"].wait(10)
    # Then
    dep.wait_firing("TenureWorkersDown", "TenureLeasesExpiring")
    assert dep.value('tenure_leases_expired_unreaped{queue="notify"}') == 1


def stopped_web_fires_metrics_down_not_workers_down(dep: Deployment) -> None:
    assert "TenureMetricsDown" not in dep.firing()
    assert "TenureWorkersDown" in dep.firing()  # left by the previous test
    # When the web process (the only /metrics) dies
    dep.signal_group("web", signal.SIGKILL)
    dep.procs["web"].wait(10)
    # Then TenureMetricsDown fires, and the rules that would read the silence as "no worker" or "no
    # scheduler" (absent()) say nothing while no Tenure target answers
    dep.wait_firing("TenureMetricsDown")
    dep.wait_inactive("TenureWorkersDown", "TenureNoSchedulerFire")


def test_every_alert_rule_on_a_live_deployment(dep: Deployment) -> None:
    for phase in (
        stopped_scheduler_fires_no_scheduler_fire_and_schedule_overdue,
        healthy_deployment_fires_no_rule,
        dead_letters_fire_dead_letters_growing_and_failure_rate,
        paused_queue_backlog_fires_queue_lag,
        worker_stalled_past_its_lease_fires_leases_lost,
        stopped_asr_worker_fires_queue_without_consumers,
        killed_workers_fire_workers_down_and_leases_expiring,
        stopped_web_fires_metrics_down_not_workers_down,
    ):
        started = time.monotonic()
        phase(dep)
        dep.phase_durations[phase.__name__] = round(time.monotonic() - started, 1)
    print(f"alert phases (s): {dep.phase_durations}")
