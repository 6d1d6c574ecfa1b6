"""A stand-in for the web app's ``/metrics`` until it exists: one WSGI callable served by gunicorn."""

from __future__ import annotations

import os

from broker import SQLiteBroker
from monitoring.collectors import default_sources
from monitoring.exposition import make_wsgi_app


def _sources() -> list:
    # Built on the first request, i.e. in each gunicorn worker after the fork.
    return default_sources(SQLiteBroker(os.environ["TENURE_TEST_BROKER_URL"], middleware=[]))


app = make_wsgi_app(_sources)
