"""Chaos on the broker a deployment gets (``make_broker(url)``, no options): messages that SIGKILLed
workers had prefetched come back by themselves, on Redis and on RabbitMQ.

3,000 jobs, job lease TTL 2 s. A worker group (a ``dramatiq`` process and its two worker processes,
8 threads each, as the Procfile's worker) is SIGKILLed 1.5 s after it is up, eight times, a new group
starting after each kill. No group survives, so what the last victims held is what the last group
must get back. Every job must be terminal within 30 s of the last kill, each result transaction
committed once. Redis runs as a private server (Dramatiq's default namespace is then this test's
alone); RabbitMQ gets a fresh vhost.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.jobs.support import postgres_database

from . import procs
from .procs import client, deployment, redis_server, submit_chaos, wait_for

JOBS = 3000
KILLS = 8
#: Seconds a victim group runs (after it is ready) before its SIGKILL.
KILL_AFTER_S = 1.5
#: Every job terminal within this many seconds of the last kill.
SETTLE_S = 30
PROCESSES, THREADS = 2, 8
#: What the Redis broker logs when it puts dead consumers' messages back (broker.redis_heartbeat).
REQUEUED = re.compile(rb"Requeued (\d+) message")


@pytest.fixture(params=["redis", "rabbitmq"], ids=["postgres+redis", "postgres+rabbitmq"])
def server_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    if request.param == "rabbitmq":
        from tests.acceptance.operations.fleet import use_rabbitmq_for_job_acceptance

        with use_rabbitmq_for_job_acceptance(monkeypatch, request.module) as name:
            yield name
        return
    with redis_server(tmp_path) as redis_url:

        @contextmanager
        def database(backend: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
            with postgres_database() as url:
                yield url, redis_url

        monkeypatch.setattr(procs, "_database", database)
        yield "postgres"


@pytest.mark.slow
@pytest.mark.services
@pytest.mark.timeout(300)
def test_stranded_messages_come_back_on_the_default_broker(server_backend: str, tmp_path: Path) -> None:
    env = {"TENURE_JOB_LEASE_TTL_S": "2", "TENURE_TEST_DEFAULT_BROKER": "1"}
    with deployment(server_backend, tmp_path, **env) as d, client(d) as c:
        # Given: all jobs submitted
        submit_chaos(d, c, JOBS)
        # When: each worker group is SIGKILLed 1.5 s after it is up, eight times, the next one started after the kill
        d.start_relay()
        chaos_started = time.monotonic()
        victim = d.start_worker(processes=PROCESSES, threads=THREADS)
        for _ in range(KILLS):
            d.wait_ready(victim)
            time.sleep(KILL_AFTER_S)
            d.kill(victim)
            victim = d.start_worker(processes=PROCESSES, threads=THREADS)
        last_kill = time.monotonic()
        unfinished = "SELECT count(*) FROM jobs WHERE status NOT IN ('succeeded', 'failed', 'cancelled', 'interrupted')"
        left_at_last_kill = d.scalar(unfinished)
        # Then: every job terminal within 30 s of the last kill, each result committed once
        trace: dict[int, int] = {}  # whole seconds after the last kill → jobs unfinished then

        def all_terminal() -> bool:
            left = d.scalar(unfinished)
            trace.setdefault(int(time.monotonic() - last_kill), left)
            return left == 0

        try:
            wait_for("all jobs terminal", all_terminal, SETTLE_S, d)
        except AssertionError as e:
            raise AssertionError(f"unfinished per second after the last kill: {trace}\n{e}") from None
        settled_s = time.monotonic() - last_kill
        d.assert_every_job_succeeded_once("chaos_runs", JOBS)
        retried = d.scalar("SELECT count(*) FROM jobs WHERE attempt > 1")
        requeued = sum(int(m) for log in tmp_path.glob("*-worker.log") for m in REQUEUED.findall(log.read_bytes()))
        print(
            f"stranded chaos [{d.env['TENURE_BROKER_URL'].split(':', 1)[0]}]: {JOBS} jobs, {KILLS} SIGKILLs in "
            f"{last_kill - chaos_started:.1f} s; {left_at_last_kill} jobs unfinished at the last kill, all terminal "
            f"{settled_s:.1f} s after it; {retried} jobs needed more than one attempt; {requeued} messages of dead "
            f"consumers requeued by the broker's heartbeat; unfinished per second after the last kill: {trace}"
        )
