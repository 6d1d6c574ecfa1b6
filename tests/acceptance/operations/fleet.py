"""The fleet set-up for real-process tests: RabbitMQ (a private vhost) + PostgreSQL (a private database).

Both are created for one test session and dropped afterwards, so queue names (``default``,
``render``…) and tables never meet another run's.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from tests.integration.jobs.support import postgres_database

RABBITMQ_URL = os.environ.get("TENURE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")
#: Its management API (``make services`` enables the plugin); the broker URL's user is used.
RABBITMQ_MANAGEMENT_URL = os.environ.get("TENURE_TEST_RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672")


@dataclass(frozen=True)
class Fleet:
    broker_url: str
    database_url: str


def _rabbitmqctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stderr or done.stdout}")
    return done.stdout


@contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """A fresh vhost the test URL's user may use; yields the broker URL pointing at it."""
    vhost = f"tenure-test-{uuid.uuid4().hex[:10]}"
    user = urlsplit(RABBITMQ_URL).username or "guest"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield f"{RABBITMQ_URL.rstrip('/')}/{quote(vhost, safe='')}"
    finally:
        _rabbitmqctl("delete_vhost", vhost)


def rabbitmq_unacked(broker_url: str) -> dict[str, int]:
    """``queue → unacknowledged messages`` for every queue of the URL's vhost that has any."""
    vhost = urlsplit(broker_url).path.lstrip("/") or "/"
    out = _rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", "name", "messages_unacknowledged")
    rows = (line.split() for line in out.splitlines() if line.strip())
    return {name: int(n) for name, n in rows if int(n)}


@contextmanager
def rabbitmq_postgres() -> Iterator[Fleet]:
    with rabbitmq_vhost() as broker_url, postgres_database() as database_url:
        yield Fleet(broker_url, database_url)


JOBS_APP = "tests.acceptance.operations.apps.jobs_app_rabbitmq"
JOBS_SUBMITTER = "tests.acceptance.operations.apps.submit_once_rabbitmq"


@contextmanager
def use_rabbitmq_for_job_acceptance(monkeypatch: pytest.MonkeyPatch, test_module: Any) -> Iterator[str]:
    """Point ``tests/acceptance/jobs`` at RabbitMQ (a fresh vhost) + PostgreSQL for one test.

    The suite's helpers are used as they are: its database factory yields the vhost's URL, its
    worker, relay and submitter processes load shims of its apps, and its Redis broker constructor
    builds a ``RabbitmqBroker`` for ``amqp://`` URLs. Yields the backend name the suite knows
    (``postgres``: jobs in PostgreSQL, messages through the outbox and the relay).
    """
    import dramatiq.brokers.redis

    from tests.acceptance.jobs import procs
    from tests.acceptance.operations.apps import rabbitmq_shim

    with rabbitmq_vhost() as broker_url:

        @contextmanager
        def database(backend: str, tmp_path: Any) -> Iterator[tuple[str, str]]:
            with postgres_database(migrated=True) as url:
                yield url, broker_url

        shim = rabbitmq_shim.redis_or_rabbitmq(dramatiq.brokers.redis.RedisBroker)
        monkeypatch.setattr(dramatiq.brokers.redis, "RedisBroker", shim)
        monkeypatch.setattr(procs, "_database", database)
        monkeypatch.setattr(procs, "APP", JOBS_APP)
        if hasattr(test_module, "SUBMITTER"):
            monkeypatch.setattr(test_module, "SUBMITTER", JOBS_SUBMITTER)
        yield "postgres"
