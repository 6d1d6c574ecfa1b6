"""``tenure worker --metrics-port``: a worker host serves its own processes' metrics, and only those.

Real ``tenure worker`` commands (2 worker processes each, the monitoring ``workerapp`` on a SQLite
file) with ``PROMETHEUS_MULTIPROC_DIR`` set as ``make run`` sets it for the web: the exporter's
processes must write to the exporter's own directory, never to that one.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dramatiq
import pytest

from broker import SQLiteBroker
from monitoring.exposition import prepare_multiproc_dir
from monitoring.metrics import DB_METRICS

from .support import Processes, Samples, free_port, scrape, total, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = "tests.acceptance.monitoring.workerapp"


@dataclass
class Host:
    procs: Processes
    env: dict[str, str]
    broker: SQLiteBroker
    web_dir: Path

    def worker(self, name: str, port: int, *options: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tenure_cli", "worker", APP, "--processes", "2", "--threads", "2"]
        return self.procs.start(name, [*argv, "-Q", "work", "--metrics-port", str(port), *options], self.env)

    def send(self, n: int) -> None:
        for i in range(n):
            self.broker.enqueue(
                dramatiq.Message(queue_name="work", actor_name="work", args=(i,), kwargs={}, options={})
            )


@pytest.fixture()
def host(tmp_path: Path) -> Iterator[Host]:
    (tmp_path / "logs").mkdir()
    (tmp_path / "signals").mkdir()
    db_url = f"sqlite:///{tmp_path / 'tenure.db'}"
    web_dir = prepare_multiproc_dir(tmp_path / "web-multiproc")
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(web_dir),  # what the web of this host merges
        "TENURE_TEST_BROKER_URL": db_url,
        "TENURE_TEST_SIGNAL_DIR": str(tmp_path / "signals"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
    }
    broker = SQLiteBroker(db_url, middleware=[], lease_ttl_ms=3_000)
    broker.declare_queue("work")
    procs = Processes(tmp_path / "logs")
    try:
        yield Host(procs, env, broker, web_dir)
    finally:
        procs.stop_all()
        broker.close()


def wait_scrape(  # type: ignore[no-untyped-def]
    url: str, check, what: str, headers: dict[str, str] | None = None, *, log: Callable[[], str] = str
) -> Samples:
    """The first scrape of *url* that passes *check*. On time-out the failure says what the last scrape saw
    and ends with *log()*: the tail of the worker's log (one that could not start, or ran nothing)."""
    last: list[Samples] = [{}]
    seen = ["nothing scraped"]

    def ok() -> bool:
        try:
            last[0] = scrape(url, headers)
        except OSError as e:
            seen[0] = f"the scrape failed: {e}"
            return False
        processed = total(last[0], "tenure_messages_processed_total", outcome="ok")
        seen[0] = f"{processed:g} processed, {total(last[0], 'tenure_worker_processes'):g} worker processes"
        return bool(check(last[0]))

    try:
        wait_for(ok, what)
    except AssertionError as e:
        raise AssertionError(f"{e}; the last scrape: {seen[0]}\n{log()}") from None
    return last[0]


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_worker_serves_its_processes_metrics_with_a_token_and_nothing_else(host: Host, tmp_path: Path) -> None:
    # Given: a worker command with a metrics port and a token file
    port = free_port()
    (tmp_path / "token").write_text("s3cret-metrics-token\n")
    worker = host.worker("worker", port, "--metrics-token-file", str(tmp_path / "token"))
    url, auth = f"http://127.0.0.1:{port}/metrics", {"Authorization": "Bearer s3cret-metrics-token"}
    # When: 20 messages run
    host.send(20)
    # Then: its port counts them, with both worker processes
    samples = wait_scrape(
        url,
        lambda s: (
            total(s, "tenure_messages_processed_total", outcome="ok") == 20 and total(s, "tenure_worker_processes") == 2
        ),
        "20 messages processed by 2 worker processes",
        auth,
    )
    assert total(samples, "tenure_message_duration_seconds_count", actor="work") == 20
    # …and serves no database-derived gauge (those have one scrape target: the web's /metrics)
    assert {name for name, _ in samples} & set(DB_METRICS) == set()
    # …and nothing reached the web's directory of this host (no process is counted by two targets)
    assert os.listdir(host.web_dir) == []
    # Credentials and the path are checked
    assert status_of(url) == 401
    assert status_of(url, {"Authorization": "Bearer wrong"}) == 401
    assert status_of(f"http://127.0.0.1:{port}/other", auth) == 404
    # A second command on the same port is refused at start, with the reason
    second = host.worker("second", port)
    assert second.wait(30) == 2
    assert "cannot listen on 127.0.0.1:" in host.procs.log("second")
    assert worker.poll() is None


def test_a_host_restarted_after_a_crash_goes_on_from_its_counts(host: Host, tmp_path: Path) -> None:
    # Given: a worker command keeping its metrics directory; 10 messages ran
    port, metrics_dir = free_port(), tmp_path / "worker-metrics"
    url = f"http://127.0.0.1:{port}/metrics"
    del host.env["PROMETHEUS_MULTIPROC_DIR"]  # a worker host: no web, no shared directory
    first = host.worker("first", port, "--metrics-dir", str(metrics_dir))
    host.send(10)
    processed = "tenure_messages_processed_total"
    first_log = functools.partial(host.procs.log, "first")
    wait_scrape(url, lambda s: total(s, processed, outcome="ok") == 10, "10 processed", log=first_log)
    # When: the whole command is SIGKILLed (no hook runs anywhere) and started again on the same directory
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    wait_for(lambda: subprocess.run(["pgrep", "-g", str(first.pid)], capture_output=True).returncode == 1, "all gone")
    host.worker("again", port, "--metrics-dir", str(metrics_dir))
    # Then: its counts go on from the crashed run's; the dead processes' live gauges are gone
    again_log = functools.partial(host.procs.log, "again")
    samples = wait_scrape(url, lambda s: total(s, "tenure_worker_processes") == 2, "the new processes", log=again_log)
    assert total(samples, processed, outcome="ok") == 10
    assert total(samples, "tenure_messages_in_progress") == 0
    names = sorted(os.listdir(metrics_dir))
    assert "counter_archive.db" in names and "histogram_archive.db" in names
    assert not [n for n in names if n.startswith("folding")]
    host.send(5)
    wait_scrape(url, lambda s: total(s, processed, outcome="ok") == 15, "15 processed", log=again_log)
    # A second command on a directory in use is refused
    other = host.worker("other", free_port(), "--metrics-dir", str(metrics_dir))
    assert other.wait(30) == 2
    assert "another process exports the metrics directory" in host.procs.log("other")
