"""conftest.py for Dramatiq's own test modules, run against Tenure's brokers.

Copied next to the upstream test files (fetched from the pinned sdist at test time) as
``conftest.py``. The ``stub_broker`` fixture returns the broker ``TENURE_CONFORMANCE_BROKER`` names:
``sqlite`` (default), a SQLite broker on a fresh file; ``postgres``, a PostgreSQL broker on a database of
this test process's own (created by the first test, emptied before each test, dropped at the end), under
the server ``TENURE_CONFORMANCE_POSTGRES_URL`` names. Result and rate-limiter backends are parametrized
over Tenure's SQLite backends and Dramatiq's stub ones.
"""

from __future__ import annotations

import logging
import os
import uuid

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.encoder import PickleEncoder
from dramatiq.rate_limits.backends import StubBackend as StubRateLimiterBackend
from dramatiq.results.backends import RedisBackend, StubBackend

from tests.conformance.facade import PostgresTestBroker, SQLiteTestBroker

logfmt = "[%(asctime)s] [%(threadName)s] [%(name)s] [%(levelname)s] %(message)s"
logging.basicConfig(level=logging.INFO, format=logfmt)
logging.getLogger("pika").setLevel(logging.WARN)

BACKEND_KINDS = [k for k in os.environ.get("TENURE_CONFORMANCE_BACKENDS", "sqlite,stub").split(",") if k]


def _sqlite_backends():
    try:
        from broker import SQLiteRateLimiterBackend, SQLiteResultBackend
    except ImportError:
        return None, None
    return SQLiteResultBackend, SQLiteRateLimiterBackend


BROKER = os.environ.get("TENURE_CONFORMANCE_BROKER", "sqlite")
POSTGRES_URL = os.environ.get("TENURE_CONFORMANCE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def postgres_broker_url():
    import psycopg

    name = f"tenure_conformance_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _new_broker(tmp_path, request):
    if BROKER == "postgres":
        url = request.getfixturevalue("postgres_broker_url")
        broker = PostgresTestBroker(url, lease_ttl_ms=10_000)
        broker.ensure_schema()
        with broker._transaction() as conn:
            conn.execute("TRUNCATE pgbroker_messages")
        return broker
    return SQLiteTestBroker(f"sqlite:///{tmp_path}/conformance.db", lease_ttl_ms=10_000)


# Autouse: a test that never asks for it (``test_queue_item_order`` declares actors on the global broker) still
# gets a broker of its own, whichever tests ran before it in the same process.
@pytest.fixture(autouse=True)
def stub_broker(tmp_path, request):
    broker = _new_broker(tmp_path, request)
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture()
def stub_worker(stub_broker):
    worker = Worker(stub_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture(params=BACKEND_KINDS)
def result_backend(request, tmp_path):
    if request.param == "stub":
        return StubBackend()
    result_cls, _ = _sqlite_backends()
    if result_cls is None:
        pytest.skip("SQLiteResultBackend not available")
    return result_cls(url=f"sqlite:///{tmp_path}/conformance.db")


@pytest.fixture(params=BACKEND_KINDS)
def rate_limiter_backend(request, tmp_path):
    if request.param == "stub":
        return StubRateLimiterBackend()
    _, limiter_cls = _sqlite_backends()
    if limiter_cls is None:
        pytest.skip("SQLiteRateLimiterBackend not available")
    return limiter_cls(url=f"sqlite:///{tmp_path}/conformance.db")


@pytest.fixture()
def redis_result_backend():
    backend = RedisBackend(url=os.environ.get("TENURE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
    backend.client.flushdb()
    return backend


@pytest.fixture()
def pickle_encoder():
    old_encoder = dramatiq.get_encoder()
    new_encoder = PickleEncoder()
    dramatiq.set_encoder(new_encoder)
    yield new_encoder
    dramatiq.set_encoder(old_encoder)


@pytest.fixture()
def info_logging():
    logger = logging.getLogger()
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(logging.WARNING)
