"""Real processes for the job acceptance tests: dramatiq workers, the outbox relay, submitters."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import jobs
from jobs.db import make_engine
from tests.acceptance.jobs.apps.limits import LIMITED
from tests.integration.jobs.support import PGBROKER, REDIS_URL, migrated_database

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.acceptance.jobs.apps.jobs_app"
T = TypeVar("T")


@dataclass
class Deployment:
    """A migrated database plus the environment every process of one test shares."""

    backend: str
    tmp_path: Path
    env: dict[str, str]
    engine: Engine
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    counter: int = 0
    #: ``pid → log file`` of every process started.
    log_paths: dict[int, Path] = field(default_factory=dict)
    #: ``pid → worker processes`` of every worker group started.
    worker_processes: dict[int, int] = field(default_factory=dict)

    def _log(self, name: str) -> Path:
        self.counter += 1
        return self.tmp_path / f"{self.counter:03d}-{name}.log"

    def start_worker(self, *, threads: int = 4, processes: int = 1) -> subprocess.Popen[bytes]:
        """``python -m dramatiq`` in its own process group (so SIGKILL reaches its worker processes)."""
        cmd = [sys.executable, "-m", "dramatiq", APP, "--processes", str(processes), "--threads", str(threads)]
        proc = self._start(cmd, "worker")
        self.worker_processes[proc.pid] = processes
        return proc

    def start_relay(self) -> subprocess.Popen[bytes] | None:
        if self.backend in ("sqlite", PGBROKER):  # messages are written in the job transactions: no outbox
            return None
        return self._start([sys.executable, "-m", "tenure_cli", "relay", "--app", APP], "relay")

    def ready(self, worker: subprocess.Popen[bytes]) -> bool:
        """Whether every worker process of *worker* logged that it consumes (Dramatiq's "ready for action")."""
        log, processes = self.log_paths[worker.pid], self.worker_processes[worker.pid]
        return log.read_bytes().count(b"Worker process is ready for action.") >= processes

    def wait_ready(self, worker: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
        """Wait until :meth:`ready`."""
        wait_for("worker ready", lambda: self.ready(worker), timeout_s, self)

    def _start(self, cmd: list[str], name: str) -> subprocess.Popen[bytes]:
        path = self._log(name)
        with open(path, "wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        self.log_paths[proc.pid] = path
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the process and every process it started."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(proc)

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.engine.connect() as conn:
            value = conn.execute(text(sql), params).scalar()
            conn.rollback()
        return value

    def rows(self, sql: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            rows = conn.execute(text(sql), params).fetchall()
            conn.rollback()
        return rows

    def execute(self, sql: str, **params: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(sql), params)

    def assert_every_job_succeeded_once(self, runs_table: str, jobs: int) -> None:
        """*jobs* jobs, all succeeded; one domain row in *runs_table* per job and per ``n``; one success event each."""
        assert self.scalar("SELECT count(*) FROM jobs") == jobs
        assert self.scalar("SELECT count(*) FROM jobs WHERE status = 'succeeded'") == jobs
        assert self.scalar(f"SELECT count(DISTINCT job_id) FROM {runs_table}") == jobs
        assert self.scalar(f"SELECT count(DISTINCT n) FROM {runs_table}") == jobs
        assert self.rows(f"SELECT job_id FROM {runs_table} GROUP BY job_id HAVING count(*) > 1") == []
        assert (
            self.rows(
                "SELECT job_id FROM job_events WHERE type = 'status' AND data LIKE '%\"succeeded\"%' "
                "GROUP BY job_id HAVING count(*) <> 1"
            )
            == []
        )

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.tmp_path.glob("*.log"))
        )


def wait_for(what: str, probe: Callable[[], T], timeout_s: float, deployment: Deployment | None = None) -> T:
    """Poll *probe* (a database read) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = deployment.logs() if deployment else ""
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{logs}")
        time.sleep(0.05)


#: Where :func:`deployment` gets a database at the head revision and its broker URL (the fleet tests put
#: their own broker's URL beside it).
_database = migrated_database


@contextmanager
def deployment(backend: str, tmp_path: Path, **env: str) -> Iterator[Deployment]:
    """Database (migrated) + environment for worker processes; stops every process it started."""
    with _database(backend, tmp_path) as (url, broker_url):
        process_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(ROOT),
            "TENURE_DATABASE_URL": url,
            "TENURE_BROKER_URL": broker_url,
            "TENURE_JOB_LEASE_TTL_S": "1.5",
            "TENURE_BROKER_LEASE_TTL_S": "1.5",
            "TENURE_RECOVERY_INTERVAL_S": "0.5",
            "TENURE_RELAY_INTERVAL_S": "0.02",
            "TENURE_OUTPUT_ROOT": str(tmp_path / "outputs"),
            "TENURE_TEST_REDIS_NAMESPACE": f"tenure-acc-{uuid.uuid4().hex[:8]}",
            **env,
        }
        engine = make_engine(url)
        d = Deployment(backend, tmp_path, process_env, engine)
        try:
            yield d
        finally:
            d.stop_all()
            engine.dispose()
            if broker_url.startswith("redis"):
                _flush_redis(process_env["TENURE_TEST_REDIS_NAMESPACE"])


@contextmanager
def redis_server(tmp_path: Path) -> Iterator[str]:
    """A private ``redis-server`` on a random loopback port; yields its URL (Dramatiq's default namespace is ours)."""
    for _ in range(20):
        port = random.randint(20000, 29999)
        log = tmp_path / f"redis-{port}.log"
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(tmp_path), "--logfile", str(log)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        if _answers_ping(proc, port):
            break
        proc.kill()  # the port was taken (it exited) or it hangs: try another
        proc.wait(10)
    else:
        raise AssertionError(f"redis-server did not start: {log.read_text(errors='replace')}")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def _answers_ping(proc: subprocess.Popen[bytes], port: int, timeout_s: float = 10) -> bool:
    import redis

    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                time.sleep(0.02)
        return False
    finally:
        client.close()


def _flush_redis(namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{namespace}*"))
    if keys:
        client.delete(*keys)
    client.close()


#: acc_chaos jobs submitted per transaction by :func:`submit_chaos`.
CHAOS_BATCH = 500


def submit_chaos(d: Deployment, c: Client, count: int) -> None:
    """Create ``chaos_runs`` (one row per acc_chaos result transaction) and submit *count* acc_chaos jobs."""
    d.execute("CREATE TABLE chaos_runs (job_id VARCHAR(32) NOT NULL, attempt INTEGER NOT NULL, n INTEGER)")
    for start in range(0, count, CHAOS_BATCH):
        with Session(d.engine) as session, session.begin():
            for n in range(start, min(count, start + CHAOS_BATCH)):
                jobs.submit(
                    session, owner_id="chaos", kind="acc_chaos", payload={"n": n}, max_attempts=20,
                    registry=c.registry, settings=c.settings,
                )  # fmt: skip


@dataclass
class Client:
    """The submitting side of a deployment, in the test process: same kinds, same queue."""

    settings: Any
    registry: Any
    broker: Any

    def submit(self, kind: str, **kwargs: Any) -> Any:
        import jobs

        kwargs.setdefault("owner_id", "u1")
        return jobs.submit(self.engine, kind=kind, registry=self.registry, settings=self.settings, **kwargs)

    engine: Any = None


@contextmanager
def client(d: Deployment) -> Iterator[Client]:
    from broker import SQLiteBroker
    from jobs.registry import Registry
    from settings.environment import Settings

    settings = Settings.from_env(d.env)
    if d.backend == "sqlite":
        broker: Any = SQLiteBroker(settings.broker_url, middleware=[])
    elif d.backend == PGBROKER:
        from broker.postgres import PostgresBroker

        broker = PostgresBroker(settings.broker_url, middleware=[])
    else:
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=settings.broker_url, namespace=d.env["TENURE_TEST_REDIS_NAMESPACE"], middleware=[])
    registry = Registry()
    queue = "jobs_acceptance"
    for name, safe in [
        ("acc_block_safe", True),
        ("acc_block_unsafe", False),
        ("acc_chaos", True),
        ("acc_echo", True),
        ("acc_stuck", True),
        ("acc_noop", True),
    ]:
        registry.kind(name, queue=queue, safe_to_rerun=safe, broker=broker)(_never_called)
    registry.kind("acc_limited", queue=queue, concurrency=LIMITED, broker=broker)(_never_called)
    # a kind the workers do not have: its jobs must end failed, not vanish
    registry.kind("acc_ghost", queue=queue, broker=broker)(_never_called)
    c = Client(settings, registry, broker, d.engine)
    # As every Tenure process's composition does: work a transaction does after commit on behalf of other jobs
    # (an admission recheck's refill) publishes through the global broker.
    import dramatiq.broker

    previous, dramatiq.broker.global_broker = dramatiq.broker.global_broker, broker
    try:
        yield c
    finally:
        dramatiq.broker.global_broker = previous
        broker.close()


def _never_called(ctx: Any, **payload: Any) -> None:
    raise AssertionError("client-side kinds never run")
