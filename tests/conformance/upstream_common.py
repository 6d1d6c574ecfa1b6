"""common.py for Dramatiq's own test modules (the sdist ships the tests without it)."""

from __future__ import annotations

import platform
from contextlib import contextmanager

import pytest
from dramatiq import Worker

RABBITMQ_USERNAME = "guest"
RABBITMQ_PASSWORD = "guest"


def _credentials():
    import pika

    return pika.credentials.PlainCredentials(RABBITMQ_USERNAME, RABBITMQ_PASSWORD)


RABBITMQ_CREDENTIALS = _credentials()


@contextmanager
def worker(*args, **kwargs):
    try:
        worker = Worker(*args, **kwargs)
        worker.start()
        yield worker
    finally:
        worker.stop()


skip_in_ci = pytest.mark.skip(reason="flaky in CI")
skip_on_windows = pytest.mark.skipif(platform.system() == "Windows", reason="test skipped on Windows")
skip_on_pypy = pytest.mark.skipif(platform.python_implementation() == "PyPy", reason="Time limits not supported")
skip_with_gevent = pytest.mark.skip(reason="not run with gevent")
skip_without_gevent = pytest.mark.skip(reason="gevent is not used")
