"""``tests.acceptance.jobs.apps.jobs_app`` with ``amqp://`` broker URLs served by RabbitMQ (see rabbitmq_shim)."""

from __future__ import annotations

from tests.acceptance.operations.apps import rabbitmq_shim

rabbitmq_shim.install()

from tests.acceptance.jobs.apps.jobs_app import *  # noqa: E402,F403
