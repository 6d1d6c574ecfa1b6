"""Shared, generic fixtures: where the test databases and services live."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


#: The test RabbitMQ server's management API (``make services`` enables the plugin); the URL's user is used.
RABBITMQ_MANAGEMENT_URL = os.environ.get("TENURE_TEST_RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672")


@pytest.fixture()
def rabbitmq_management_url() -> str:
    return RABBITMQ_MANAGEMENT_URL


# -- running in parallel (pytest-xdist: ``make test`` runs ``-n 2 --dist loadgroup -m "not exclusive"``) --------
#: Tests that share names on a service: the RabbitMQ-backed acceptance runs declare the apps' fixed
#: queue names (RabbitMQ has no namespaces) and the fleet Procfile run uses Dramatiq's default Redis
#: namespace, so two of them at once would consume each other's messages. Everything else isolates
#: itself (a temporary SQLite file, a fresh PostgreSQL database, a random Redis namespace, unique
#: queue names) and may run beside anything.
SHARED_SERVICE_MARKERS = ("rabbitmq", "fleet")
#: Tests that share a session-scoped live deployment (gunicorn + worker): one xdist worker runs them all,
#: so the deployment starts once.
E2E_DIR = "tests/e2e/"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(E2E_DIR):
            item.add_marker(pytest.mark.xdist_group("e2e"))
        elif item.nodeid.startswith("tests/acceptance/") and any(m in item.nodeid for m in SHARED_SERVICE_MARKERS):
            item.add_marker(pytest.mark.xdist_group("shared-services"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Refuse to run when ``--dist loadgroup`` would silently ignore the groups above: pytest-xdist marks a
    test's group in its node id, which pytest 9.2 no longer lets a plugin change (pytest-xdist#1386). Then the
    RabbitMQ runs consume each other's queues and every e2e test module starts its deployment again."""
    ungrouped = [i for i in ids if i.startswith(E2E_DIR) and "@" not in i]
    if ungrouped and node.config.getoption("dist") == "loadgroup":
        pytest.exit(
            f"--dist loadgroup ignores the xdist_group of {ungrouped[0]}: this pytest and pytest-xdist do not "
            "work together (pytest-xdist#1386; pyproject.toml pins pytest below 9.2)",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
