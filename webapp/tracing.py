"""Tracing the web process: the process's provider (:func:`monitoring.tracing.configure_tracing`) and a
server span per request (OpenTelemetry's Flask instrumentation), which a submit's span is a child of.

Off unless ``TENURE_TRACING`` is on. Health probes, ``/metrics``, static files and the live feed (one
connection lasts minutes) make no spans unless ``OTEL_PYTHON_FLASK_EXCLUDED_URLS`` says otherwise.
"""

from __future__ import annotations

import os

from flask import Flask

from monitoring.tracing import configure_tracing
from settings.environment import Settings

#: URL patterns (comma-separated regular expressions) whose requests make no span.
EXCLUDED_URLS = "/api/health,/metrics,/static/,/api/v1/live"


def trace_requests(app: Flask, settings: Settings) -> bool:
    """Install tracing in this process and give *app* a span per request, if ``settings.tracing``.

    Call it before the app makes its engine (the SQLAlchemy instrumentation wraps engine creation).

    Returns:
      Whether requests are traced.
    """
    if not configure_tracing(settings):
        return False
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    excluded = None if os.environ.get("OTEL_PYTHON_FLASK_EXCLUDED_URLS") else EXCLUDED_URLS
    FlaskInstrumentor().instrument_app(app, excluded_urls=excluded, enable_commenter=False)
    return True
