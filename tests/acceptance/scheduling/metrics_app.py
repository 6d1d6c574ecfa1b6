"""The schedule acceptance app with Tenure's metrics middleware (for ``tenure scheduler … --metrics-port``)."""

from __future__ import annotations

from monitoring.middleware import MetricsMiddleware
from tests.acceptance.scheduling.app import broker

broker.add_middleware(MetricsMiddleware())

__all__ = ["broker"]
