"""Shared, generic fixtures: where the test databases and services live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture()
def sqlite_path(tmp_path: Path) -> Path:
    """A fresh SQLite file path (not created yet) in the test's temporary directory."""
    return tmp_path / "broker.db"


@pytest.fixture()
def sqlite_url(sqlite_path: Path) -> str:
    """``sqlite:////abs/path`` URL of :func:`sqlite_path`."""
    return f"sqlite:///{sqlite_path}"


@pytest.fixture()
def redis_url() -> str:
    """The test Redis server; db 14 is reserved for tests (keys are namespaced per test anyway)."""
    return os.environ.get("TENURE_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")


@pytest.fixture()
def rabbitmq_url() -> str:
    """The test RabbitMQ server (tests use unique queue names and delete them afterwards)."""
    return os.environ.get("TENURE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")
