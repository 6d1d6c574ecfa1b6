"""conftest.py for Dramatiq's own test modules, run against Tenure's SQLiteBroker.

Copied next to the upstream test files (fetched from the pinned sdist at test time) as
``conftest.py``. The ``stub_broker`` fixture returns a SQLite broker on a fresh file; result and
rate-limiter backends are parametrized over Tenure's SQLite backends and Dramatiq's stub ones.
"""

from __future__ import annotations

import logging
import os

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.encoder import PickleEncoder
from dramatiq.rate_limits.backends import StubBackend as StubRateLimiterBackend
from dramatiq.results.backends import RedisBackend, StubBackend

from tests.conformance.facade import SQLiteTestBroker

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


@pytest.fixture()
def stub_broker(tmp_path):
    broker = SQLiteTestBroker(f"sqlite:///{tmp_path}/conformance.db", lease_ttl_ms=10_000)
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
