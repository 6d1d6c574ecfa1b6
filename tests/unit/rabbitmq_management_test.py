"""The RabbitMQ broker a deployment builds and its management API client: where the API is, with which
credentials, and that neither the log-safe name nor the request URL carries them (no server needed:
pika connects lazily; requests are in tests/integration/test_broker_depth.py)."""

from __future__ import annotations

import pytest

from broker.rabbitmq import TimestampedRabbitmqBroker
from broker.rabbitmq_management import ManagementApi
from settings.environment import Settings
from tasks import build_broker


def test_a_deployment_with_a_management_url_gets_the_api_on_its_vhost_with_its_credentials() -> None:
    settings = Settings.from_env(
        {
            "TENURE_DATABASE_URL": "postgresql://u@h/db",
            "TENURE_BROKER_URL": "amqp://app:amqp-pass@rabbit:5672/tenure%2Fprod",
            "TENURE_RABBITMQ_MANAGEMENT_URL": "http://rabbit:15672/",
        }
    )
    broker = build_broker(settings)
    assert isinstance(broker, TimestampedRabbitmqBroker) and broker.management is not None
    api = broker.management
    assert (api.base, api.where, api.vhost, api._auth) == (
        "http://rabbit:15672",
        "http://rabbit:15672",
        "tenure/prod",
        ("app", "amqp-pass"),
    )
    unset = {"TENURE_DATABASE_URL": settings.database_url, "TENURE_BROKER_URL": settings.broker_url}
    without = build_broker(Settings.from_env(unset))
    assert isinstance(without, TimestampedRabbitmqBroker) and without.management is None


def test_the_management_urls_own_credentials_win_and_stay_out_of_every_url() -> None:
    api = ManagementApi("https://ops%40corp:p%3Ass@rabbit.internal:443/rabbitmq/", username="app", password="x")
    assert api._auth == ("ops@corp", "p:ss")
    assert api.base == "https://rabbit.internal:443/rabbitmq" and api.where == "https://rabbit.internal:443"
    assert ManagementApi("http://[::1]:15672")._auth is None
    with pytest.raises(ValueError, match="http"):
        ManagementApi("amqp://rabbit:5672")
