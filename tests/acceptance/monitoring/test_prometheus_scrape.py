"""A real Prometheus scrapes a running Tenure: gunicorn (2 workers) serving /metrics + 2 dramatiq CLIs.

Until the web app exists, gunicorn serves ``metrics_app:app`` (``monitoring.exposition``); the
workers run ``workerapp`` (SQLiteBroker + MetricsMiddleware). Every process shares one
``PROMETHEUS_MULTIPROC_DIR``. Prometheus (Debian package, ``scripts/install_prometheus.sh``) binds
to 127.0.0.1, keeps its data in the test's temporary directory and scrapes every second.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dramatiq
import pytest
import yaml

from broker import SQLiteBroker
from monitoring.exposition import live_gauge_pids, pid_alive, prepare_multiproc_dir

from .support import ROOT, Processes, Prometheus, Samples, scrape, start_prometheus, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MONITORING = ROOT / "monitoring"


# -- the running stack ----------------------------------------------------------------------------------


@dataclass
class Stack:
    procs: Processes
    env: dict[str, str]
    prom_dir: Path
    signals: Path
    broker: SQLiteBroker
    metrics_url: str
    prometheus: Prometheus
    gunicorn: subprocess.Popen[bytes]

    def start_worker(self, name: str, queues: list[str]) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "dramatiq", "tests.acceptance.monitoring.workerapp"]
        return self.procs.start(name, [*args, "--processes", "1", "--threads", "2", "-Q", *queues], self.env)

    def consumers(self, queue: str) -> int:
        return sum(1 for p in self.broker.processes() if queue in p["queues"].split(","))

    def scrape(self) -> Samples:
        return scrape(self.metrics_url)

    @property
    def prometheus_url(self) -> str:
        return self.prometheus.url

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        return self.prometheus.query(expr)

    def value(self, expr: str) -> float | None:
        return self.prometheus.value(expr)

    def wait_value(self, expr: str, check: Callable[[float], bool], what: str = "") -> float:
        return self.prometheus.wait_value(expr, check, what)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("tenure-prom")
    (tmp / "logs").mkdir()
    procs = Processes(tmp / "logs")
    prom_dir = prepare_multiproc_dir(tmp / "multiproc")
    signals = tmp / "signals"
    signals.mkdir()
    db_url = f"sqlite:///{tmp / 'tenure.db'}"
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(prom_dir),
        "TENURE_TEST_BROKER_URL": db_url,
        "TENURE_TEST_SIGNAL_DIR": str(signals),
        "PYTHONPATH": str(ROOT),
    }
    broker = SQLiteBroker(db_url, middleware=[], lease_ttl_ms=3_000)
    for queue in ("work", "hold_a", "hold_b"):
        broker.declare_queue(queue)
    try:
        # /metrics: gunicorn with 2 workers on a socket we bound (no port race), child_exit → mark_dead
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.set_inheritable(True)
        port = listener.getsockname()[1]
        gunicorn = procs.start(
            "gunicorn",
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                str(Path(__file__).with_name("gunicorn_conf.py")),
                "-b",
                f"fd://{listener.fileno()}",
                "tests.acceptance.monitoring.metrics_app:app",
            ],
            env,
            pass_fds=(listener.fileno(),),
        )
        listener.close()
        metrics_url = f"http://127.0.0.1:{port}/metrics"

        # Prometheus: 1 s scrapes, Tenure's alert rules loaded, data in tmp
        prometheus = start_prometheus(
            procs,
            tmp,
            [{"job_name": "tenure", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
            rule_files=[MONITORING / "prometheus" / "alerts.yml"],
        )
        s = Stack(procs, env, prom_dir, signals, broker, metrics_url, prometheus, gunicorn)

        def prometheus_sees_tenure() -> bool:
            try:
                return s.value('up{job="tenure"}') == 1
            except OSError:
                return False

        try:
            wait_for(prometheus_sees_tenure, "Prometheus scraping gunicorn", timeout=60)
        except AssertionError:
            raise AssertionError(procs.log("prometheus") + procs.log("gunicorn")) from None
        yield s
    finally:
        procs.stop_all()
        broker.close()


def send(broker: SQLiteBroker, queue: str, actor: str, *args: object) -> None:
    broker.enqueue(dramatiq.Message(queue_name=queue, actor_name=actor, args=args, kwargs={}, options={}))


# -- tests --------------------------------------------------------------------------------------------------


def test_prometheus_sees_throughput_lag_failures_and_a_killed_worker(stack: Stack) -> None:
    # Given: 40 messages (and one that always fails) waiting, no worker running
    n = 40
    for i in range(n):
        send(stack.broker, "work", "work", i)
    send(stack.broker, "work", "fail")

    # Then: the lag Prometheus records rises while nobody works
    lag = 'tenure_queue_oldest_ready_age_seconds{queue="work"}'
    first = stack.wait_value(lag, lambda v: v >= 1.0, "lag reaching 1 s")
    stack.wait_value(lag, lambda v: v >= first + 1.0, "lag rising by another second")
    assert stack.value('tenure_queue_messages{queue="work",state="ready"}') == n + 1

    # When: two worker processes start (separate dramatiq CLIs)
    worker_a = stack.start_worker("worker-a", ["work", "hold_a"])
    worker_b = stack.start_worker("worker-b", ["work", "hold_b"])
    wait_for(lambda: stack.consumers("work") == 2, "both workers consuming")

    # Then: every message is counted once, by outcome, and the lag falls back to 0
    stack.wait_value('sum(tenure_messages_processed_total{actor="work",outcome="ok"})', lambda v: v == n)
    stack.wait_value('sum(tenure_messages_processed_total{actor="fail",outcome="dead_lettered"})', lambda v: v == 1)
    stack.wait_value(lag, lambda v: v == 0, "lag back to 0")
    assert stack.value('sum(tenure_messages_processed_total{actor="work"})') == n
    assert stack.value('sum(tenure_messages_processed_total{actor="fail",outcome="retried"})') == 1
    stack.wait_value('tenure_queue_messages{queue="work",state="dead"}', lambda v: v == 1)
    stack.wait_value('sum(tenure_message_duration_seconds_count{actor="work"})', lambda v: v == n)
    stack.wait_value('sum(tenure_message_queue_wait_seconds_count{actor="work"})', lambda v: v == n)
    stack.wait_value("sum(tenure_worker_processes)", lambda v: v == 2)
    stack.wait_value('tenure_queue_consumers{queue="work"}', lambda v: v == 2)

    # Given: each worker holds one running message
    send(stack.broker, "hold_a", "hold_a", "a")
    send(stack.broker, "hold_b", "hold_b", "b")
    started_a, started_b = stack.signals / "started-a", stack.signals / "started-b"
    wait_for(lambda: started_a.exists() and started_b.exists(), "both hold actors running")
    pid_a, pid_b = int(started_a.read_text()), int(started_b.read_text())
    assert pid_a != pid_b
    stack.wait_value("sum(tenure_messages_in_progress)", lambda v: v == 2)
    stack.wait_value("sum(tenure_lease_renewals_total)", lambda v: v > 0, "a lease renewal exported")
    before = stack.scrape()
    processed_before = sum(v for (name, _), v in before.items() if name == "tenure_messages_processed_total")
    assert processed_before == n + 2
    assert pid_a in live_gauge_pids(stack.prom_dir)

    # When: worker A's process is SIGKILLed mid-message (no hook runs in it)
    os.kill(pid_a, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid_a), "the killed worker to be reaped by its parent")

    # Then: /metrics drops its in-progress gauge at once; counters keep their totals
    after = stack.scrape()
    in_progress = {dict(k)["queue"]: v for (name, k), v in after.items() if name == "tenure_messages_in_progress"}
    assert in_progress.get("hold_a", 0) == 0
    assert in_progress["hold_b"] == 1
    assert sum(v for (name, _), v in after.items() if name == "tenure_messages_processed_total") == processed_before
    assert pid_a not in live_gauge_pids(stack.prom_dir)
    assert any(f"_{pid_a}.db" in p.name for p in stack.prom_dir.iterdir()), "the dead pid's counter files stay"
    # …and Prometheus agrees
    stack.wait_value("sum(tenure_messages_in_progress)", lambda v: v == 1)
    stack.wait_value("sum(tenure_worker_processes)", lambda v: v == 1)
    assert stack.value("sum(tenure_messages_processed_total)") == processed_before

    # When: B's message is released
    (stack.signals / "release-b").write_text("")
    # Then
    stack.wait_value('sum(tenure_messages_processed_total{actor="hold_b",outcome="ok"})', lambda v: v == 1)
    stack.wait_value("sum(tenure_messages_in_progress)", lambda v: v == 0)
    stack.procs.stop(worker_b)
    stack.procs.stop(worker_a)
    stack.wait_value("sum(tenure_worker_processes)", lambda v: v == 0, "graceful stop removes the worker gauge")


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_gunicorn_child_exit_forgets_a_killed_web_worker(stack: Stack) -> None:
    web_pids = children(stack.gunicorn.pid)
    assert len(web_pids) == 2
    wait_for(lambda: set(web_pids) <= set(live_gauge_pids(stack.prom_dir)), "web workers' gauge files")
    stack.wait_value("sum(tenure_web_workers)", lambda v: v == 2)
    os.kill(web_pids[0], signal.SIGKILL)
    # gunicorn's master calls child_exit → mark_dead, then forks a replacement
    marker = f"tenure: live gauges of worker {web_pids[0]} removed"
    wait_for(lambda: marker in stack.procs.log("gunicorn"), "gunicorn's child_exit hook")
    assert web_pids[0] not in live_gauge_pids(stack.prom_dir)
    stack.wait_value('up{job="tenure"}', lambda v: v == 1)
    wait_for(lambda: len(children(stack.gunicorn.pid)) == 2, "gunicorn replacing the worker")
    stack.wait_value("sum(tenure_web_workers)", lambda v: v == 2, "the replacement counted, the dead one not")


def test_every_dashboard_and_alert_query_runs_on_prometheus(stack: Stack) -> None:
    dashboard = json.loads((MONITORING / "grafana" / "tenure.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    rules = yaml.safe_load((MONITORING / "prometheus" / "alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for expr in exprs:
        expr = expr.replace("$__rate_interval", "1m").replace("$queue", ".*")
        stack.query(expr)  # asserts status == success (the query parses and evaluates)

    # and Prometheus loaded and evaluates every alerting rule without error
    with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/rules", timeout=10) as resp:
        loaded = [r for g in json.load(resp)["data"]["groups"] for r in g["rules"]]
    assert len(loaded) == sum(len(g["rules"]) for g in rules["groups"])

    def evaluated() -> bool:
        with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/rules", timeout=10) as resp:
            current = [r for g in json.load(resp)["data"]["groups"] for r in g["rules"]]
        return all(r["health"] == "ok" for r in current)

    wait_for(evaluated, "every rule evaluated with health ok")
