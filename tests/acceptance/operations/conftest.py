from __future__ import annotations

from collections.abc import Iterator

import pytest

from .fleet import Fleet, rabbitmq_postgres


@pytest.fixture(scope="session")
def rabbitmq_postgres_fleet() -> Iterator[Fleet]:
    """RabbitMQ (own vhost) + PostgreSQL (own database) for this test session."""
    with rabbitmq_postgres() as fleet:
        yield fleet
