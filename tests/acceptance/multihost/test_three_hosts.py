"""A fleet on three hosts, scraped by a real Prometheus; one worker host is killed whole mid-run.

Hosts are network namespaces (:mod:`.network`): ``web`` runs gunicorn (the web app, whose
``/metrics`` is the one target of the database gauges) and the outbox relay; ``a`` and ``b`` each
run ``tenure worker`` (2 processes × 4 threads) with its own metrics port and ``--metrics-dir``.
PostgreSQL and Redis are the fleet's database and broker. Prometheus (Debian's) runs the shipped
``monitoring/prometheus/fleet-file-sd.yml``, its target files listing these hosts.

2,000 jobs of the chaos harness's kind (one domain row per job, written with the result) run over
both worker hosts. When about a third are done, every process of host ``a`` is SIGKILLed. Then:
every job is terminal, each result transaction happened once, host ``b``'s metrics keep flowing;
and once host ``a`` is back (``tenure worker`` again on its metrics directory, as after a reboot
with its disk) Prometheus's sum of completed jobs over both hosts is the 2,000 jobs run, and each
host's count is the number of jobs whose result that host committed.

Why the kill waits for a quiet instant: a job's counter is incremented right *after* its result
commits, in the same thread, microseconds later. A SIGKILL landing in between leaves a committed
job no counter ever saw (no metric can be part of the database transaction). So the test freezes
the host (SIGSTOP on all its processes), compares the host's counter files with the rows it
committed, and kills only when they agree — otherwise it thaws it and tries again a few ms later.
The kill still lands mid-run, with jobs claimed and running; those run again on host ``b``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy.orm import Session

import jobs
from monitoring.exposition import prepare_multiproc_dir
from tests.acceptance.jobs.procs import Deployment, client, deployment
from tests.acceptance.monitoring.support import ROOT, Processes, Prometheus, start_prometheus, wait_for

from .fleet_app import KIND, QUEUE
from .network import Host, Network, require_tools

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.timeout(240)]

JOBS = 2000
BATCH = 500
APP = "tests.acceptance.multihost.fleet_app"
WEB_PORT, METRICS_PORT = 8000, 9191  # each host has its own ports: fixed numbers cannot collide
FLEET_SD = ROOT / "monitoring" / "prometheus" / "fleet-file-sd.yml"


def finished(**labels: str) -> str:
    """The worker hosts' completed-job counters of the test's kind (optionally one instance's)."""
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f'tenure_jobs_finished_total{{job="tenure-worker",kind="{KIND}",outcome="succeeded"{extra}}}'


@dataclass
class Fleet:
    d: Deployment
    procs: Processes
    web: Host
    a: Host
    b: Host
    prometheus: Prometheus
    tmp: Path

    def env(self, host: Host) -> dict[str, str]:
        """The deployment's environment, with the services reached through the host's gateway."""
        env = {k: v.replace("127.0.0.1", host.gateway) if k.endswith("_URL") else v for k, v in self.d.env.items()}
        return {**env, "TENURE_TEST_HOST": host.name}

    def worker(self, host: Host) -> None:
        argv = [sys.executable, "-m", "tenure_cli", "worker", APP, "--processes", "2", "--threads", "4"]
        argv += ["--worker-shutdown-timeout", "1000", "--metrics-port", str(METRICS_PORT)]
        argv += ["--metrics-bind", host.address, "--metrics-dir", str(self.tmp / f"metrics-{host.name}")]
        self.d.procs.append(host.start("worker", argv, self.env(host)))

    def committed(self, host: Host) -> int:
        return int(self.d.scalar("SELECT count(*) FROM fleet_runs WHERE host = :h", h=host.name))

    def counted(self, host: Host) -> float:
        """The host's completed-job counter, read from its metrics directory (what its port serves)."""
        return sum(
            s.value
            for metric in MultiProcessCollector(None, path=str(self.tmp / f"metrics-{host.name}")).collect()
            for s in metric.samples
            if s.name == "tenure_jobs_finished_total" and s.labels == {"kind": KIND, "outcome": "succeeded"}
        )

    def per_instance(self, expr: str) -> dict[str, float]:
        return {m["instance"]: v for m, v in self.prometheus.query(expr)}


def prometheus_config(fleet_hosts: dict[str, Host], tmp: Path, token_file: Path) -> tuple[list, dict[str, str]]:
    """The shipped file-SD configuration, pointed at these hosts and scraping every second."""
    config = yaml.safe_load(FLEET_SD.read_text(encoding="utf-8"))
    web, a, b = fleet_hosts["web"], fleet_hosts["a"], fleet_hosts["b"]
    targets = {
        "targets/tenure-web.yml": [{"targets": [f"{web.address}:{WEB_PORT}"]}],
        "targets/tenure-workers.yml": [{"targets": [f"{a.address}:{METRICS_PORT}", f"{b.address}:{METRICS_PORT}"]}],
        "targets/tenure-relay.yml": [{"targets": [f"{web.address}:{METRICS_PORT}"]}],
        "targets/tenure-scheduler.yml": [],
    }
    (tmp / "targets").mkdir()
    files = {name: yaml.safe_dump(groups) for name, groups in targets.items()}
    for job in config["scrape_configs"]:
        job.pop("scrape_timeout", None)  # 1 s scrapes here
        for sd in job["file_sd_configs"]:
            sd["files"] = [str(tmp / f) for f in sd["files"]]
            sd["refresh_interval"] = "1s"
        if "authorization" in job:
            job["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    return config["scrape_configs"], files


#: The one rule a healthy fleet of this test holds true: it runs no scheduler (``tenure-scheduler`` lists no
#: target), so no schedule fires. Pending only: it fires after its ``for:`` of 5 minutes.
NO_SCHEDULER = "TenureNoSchedulerFire"
#: How long the healthy fleet is watched, in rule evaluations (one a second).
HEALTHY_EVALUATIONS = 3


def assert_no_alert_but_the_schedulers(prom: Prometheus) -> None:
    """With the shipped rules (their ``for:`` windows too) evaluated every second on the running fleet: no
    rule fires, ever, and once the workers' gauges are in, the only rule even pending is :data:`NO_SCHEDULER`,
    over :data:`HEALTHY_EVALUATIONS` evaluations."""
    evaluations: set[tuple[str, ...]] = set()
    seen: list[dict[str, set[str]]] = []

    def settled() -> bool:
        seen.append(prom.alerts())
        assert seen[-1]["firing"] == set(), seen[-1]
        if seen[-1]["pending"] != {NO_SCHEDULER}:
            evaluations.clear()
            return False
        evaluations.add(prom.rule_evaluations())
        return len(evaluations) > HEALTHY_EVALUATIONS

    try:
        wait_for(settled, "no rule pending but the scheduler's, over several evaluations", 30)
    except AssertionError as e:
        raise AssertionError(f"{e}; active alerts, last seen: {seen[-3:]}") from None


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    require_tools()
    (tmp_path / "logs").mkdir()
    procs = Processes(tmp_path / "logs")
    network = Network(procs)
    with deployment("postgres", tmp_path) as d:
        try:
            hosts = {name: network.add_host(name) for name in ("web", "a", "b")}
            for host in hosts.values():
                for port in (5432, 6379):
                    network.forward(host, port)
            for host in hosts.values():
                for port in (5432, 6379):
                    network.wait_forwarded(host, port)
            import accounts

            admin, _ = accounts.create_user(d.engine, "prometheus", "prometheus-password", role="admin")
            _, token = accounts.create_token(d.engine, admin.id, "prometheus")
            (tmp_path / "web.token").write_text(token)
            scrape_configs, files = prometheus_config(hosts, tmp_path, tmp_path / "web.token")
            prometheus = start_prometheus(
                procs, tmp_path, scrape_configs, rule_files=[FLEET_SD.parent / "alerts.yml"], extra_files=files
            )
            f = Fleet(d, procs, hosts["web"], hosts["a"], hosts["b"], prometheus, tmp_path)
            yield f
        finally:
            network.close()  # the hosts first: their processes use the forwarders
            procs.stop_all()


def test_a_worker_host_killed_whole_leaves_every_job_done_once_and_the_counts_whole(fleet: Fleet) -> None:
    d, web, a, b, prom = fleet.d, fleet.web, fleet.a, fleet.b, fleet.prometheus
    t0 = time.monotonic()
    d.execute("CREATE TABLE fleet_runs (job_id VARCHAR(32) NOT NULL, attempt INTEGER, n INTEGER, host VARCHAR(8))")
    # Given: the web host (gunicorn + relay) and two worker hosts, each with a metrics port
    web_env = {
        **fleet.env(web),
        "PROMETHEUS_MULTIPROC_DIR": str(prepare_multiproc_dir(fleet.tmp / "metrics-web")),
        "TENURE_WEB_TASKS_APP": APP,
        "TENURE_WEB_BIND": f"{web.address}:{WEB_PORT}",
        "TENURE_WEB_WORKERS": "1",
        "TENURE_WEB_THREADS": "8",
        "TENURE_SECRET_KEY": "fleet-secret",
    }
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    d.procs.append(web.start("gunicorn", [gunicorn, "-c", "gunicorn.conf.py", "webapp:create_app()"], web_env))
    relay = [sys.executable, "-m", "tenure_cli", "relay", "--app", APP, "--metrics-port", str(METRICS_PORT)]
    d.procs.append(web.start("relay", [*relay, "--metrics-bind", web.address], fleet.env(web)))
    fleet.worker(a)
    fleet.worker(b)
    prom.wait_value('count(up{job=~"tenure|tenure-worker|tenure-relay"} == 1)', lambda v: v == 4, "4 targets up", 60)
    # …healthy in the eyes of the shipped alert rules
    assert_no_alert_but_the_schedulers(prom)
    phases = {"up": time.monotonic() - t0}
    # …and 2,000 jobs submitted (the relay publishes them as it comes up)
    with client(d) as c:
        c.registry.kind(KIND, queue=QUEUE, broker=c.broker)(lambda ctx, **_: None)
        for start in range(0, JOBS, BATCH):
            with Session(d.engine) as session, session.begin():
                for n in range(start, start + BATCH):
                    jobs.submit(
                        session, owner_id="fleet", kind=KIND, payload={"n": n}, max_attempts=20,
                        registry=c.registry, settings=c.settings,
                    )  # fmt: skip

    # When: about a third of the jobs are done, host a — every one of its processes — is killed
    def a_third_done_by_both() -> bool:
        on_a, on_b = fleet.committed(a), fleet.committed(b)
        return on_a + on_b >= JOBS // 3 and min(on_a, on_b) >= 100

    wait_for(a_third_done_by_both, "a third of the jobs done, by both hosts", 90)
    # (busy, it is as healthy: no rule fires, none but the scheduler's is pending at the last evaluation)
    assert prom.alerts() == {"firing": set(), "pending": {NO_SCHEDULER}}
    seen: list[tuple[float, int]] = []
    for attempt in range(200):
        frozen = a.freeze()
        time.sleep(0.05)  # a COMMIT already sent completes on the server meanwhile
        seen.append((fleet.counted(a), fleet.committed(a)))
        if seen[-1][0] == seen[-1][1]:
            break
        a.thaw(frozen)  # a job is between its commit and its counter: try again a moment later
        time.sleep(0.01 + 0.003 * attempt)
    else:
        raise AssertionError(f"host a never had its counter and its commits in agreement: {seen[-5:]}")
    running_on_a = d.scalar("SELECT count(*) FROM jobs WHERE status = 'running'")
    a.kill()
    killed_at = time.monotonic()
    phases["kill"] = killed_at - t0
    a_jobs = fleet.committed(a)
    a_counted = fleet.counted(a)
    b_instance = f"{b.address}:{METRICS_PORT}"
    b_at_kill = prom.value(f"sum({finished(instance=b_instance)})") or 0

    # Then: every job ends, each result committed once, none lost
    try:
        wait_for(
            lambda: d.scalar("SELECT count(*) FROM jobs WHERE status = 'succeeded'") == JOBS, "every job succeeded", 120
        )
    except AssertionError as exc:
        left = d.rows(
            "SELECT status, held, attempt, lease_expires_at IS NOT NULL AS leased, count(*) FROM jobs "
            "WHERE status <> 'succeeded' GROUP BY status, held, attempt, lease_expires_at IS NOT NULL"
        )
        raise AssertionError(f"{exc}: not succeeded (status, held, attempt, leased, jobs): {left}") from None
    phases["done"] = time.monotonic() - t0
    d.assert_every_job_succeeded_once("fleet_runs", JOBS)
    assert d.scalar("SELECT count(*) FROM fleet_runs") == JOBS
    b_jobs = fleet.committed(b)
    assert a_jobs + b_jobs == JOBS and fleet.committed(a) == a_jobs  # nothing ran on a after its death

    # …host b's metrics kept flowing: scraped all along since the kill, its count grew to its commits
    prom.wait_value(f"sum({finished(instance=b_instance)})", lambda v: v == b_jobs, "b's count")
    assert b_jobs > b_at_kill
    window = max(2, int(time.monotonic() - killed_at))
    assert prom.value(f'min_over_time(up{{instance="{b_instance}"}}[{window}s])') == 1
    assert prom.value(f'up{{instance="{a.address}:{METRICS_PORT}"}}') == 0

    # When: host a comes back (its disk, hence its metrics directory, survived)
    fleet.worker(a)
    # Then: Prometheus's sum over both worker hosts is the jobs run, each host counting its own
    total = prom.wait_value(f"sum({finished()})", lambda v: v == JOBS, "the fleet's sum", 60)
    phases["back"] = time.monotonic() - t0
    per_host = fleet.per_instance(finished())
    assert per_host == {f"{a.address}:{METRICS_PORT}": a_jobs, b_instance: b_jobs}, per_host
    assert a_counted == a_jobs
    # the database gauges come from the web's job only, once
    assert prom.value('count(tenure_jobs{status="succeeded"})') == 1
    prom.wait_value('sum(tenure_jobs{job="tenure",status="succeeded"})', lambda v: v == JOBS)
    assert prom.query('{__name__=~"tenure_(jobs|queue_.+|outbox_.+)", job!="tenure"}') == []
    prom.wait_value(f'sum(tenure_queue_messages{{job="tenure",queue="{QUEUE}",state="ready"}})', lambda v: v == 0)
    # the relay's port counts what it published; no worker process is counted by the web's target
    assert prom.value('sum(tenure_messages_enqueued_total{job="tenure-relay"})') >= JOBS
    assert (prom.value('sum(tenure_worker_processes{job="tenure"})') or 0) == 0
    prom.wait_value('sum(tenure_worker_processes{job="tenure-worker"})', lambda v: v == 4, "a's and b's processes")
    retried = d.scalar("SELECT count(*) FROM jobs WHERE attempt > 1")
    print(
        f"fleet: {JOBS} jobs, host a {a_jobs} (killed with {running_on_a} running fleet-wide, {attempt + 1} "
        f"freeze(s)), host b {b_jobs}, {retried} needed another attempt, Prometheus sum {total:.0f}, "
        f"{time.monotonic() - t0:.1f} s ({', '.join(f'{k} at {v:.1f}' for k, v in phases.items())})"
    )
