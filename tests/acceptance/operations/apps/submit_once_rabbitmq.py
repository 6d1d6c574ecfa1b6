"""``tests.acceptance.jobs.apps.submit_once`` with ``amqp://`` broker URLs served by RabbitMQ (see rabbitmq_shim)."""

from __future__ import annotations

from tests.acceptance.operations.apps import rabbitmq_shim

rabbitmq_shim.install()

from tests.acceptance.jobs.apps.submit_once import main  # noqa: E402

if __name__ == "__main__":
    main()
