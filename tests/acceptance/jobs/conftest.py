from __future__ import annotations

from collections.abc import Iterator

import pytest

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres+redis", marks=pytest.mark.services),
    # the same tests, apps and helpers on RabbitMQ (a fresh vhost) + PostgreSQL: tests/acceptance/operations/fleet.py
    pytest.param("postgres+rabbitmq", id="postgres+rabbitmq", marks=pytest.mark.services),
    # jobs and messages in one PostgreSQL database (broker.postgres), no outbox, no relay
    pytest.param("postgres+pgbroker", id="postgres+pgbroker", marks=pytest.mark.services),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "postgres+rabbitmq":
        from tests.acceptance.operations.fleet import use_rabbitmq_for_job_acceptance

        with use_rabbitmq_for_job_acceptance(monkeypatch, request.module) as name:
            yield name
        return
    yield request.param
