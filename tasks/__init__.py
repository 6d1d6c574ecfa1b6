"""Tenure's actors. ``dramatiq tasks`` imports this module: it sets the broker, then declares actors."""

from __future__ import annotations

import os

import dramatiq

from broker import DEFAULT_URL, make_broker

# The broker is chosen once, when the worker process imports its actors (Dramatiq's model).
broker = make_broker(os.environ.get("TENURE_BROKER_URL", DEFAULT_URL))
dramatiq.set_broker(broker)

from . import demo  # noqa: E402,F401  (actors must be declared after the broker is set)
