"""The services a web process holds: built once by :func:`webapp.create_app`, kept in
``app.extensions["tenure"]`` and reached from views through :func:`services`."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import current_app
from sqlalchemy import Engine

from .jobs_adapter import JobLayerGateway
from .live_limits import FeedLimits


@dataclass
class Services:
    """Everything a request may need; views reach it via :func:`services`."""

    engine: Engine
    broker: Any
    settings: Any
    jobs: JobLayerGateway
    feed_limits: FeedLimits
    output_root: Path
    #: Built on the first scrape (monitoring.collectors sources).
    metrics_sources: Any = None
    #: token sha256 → last time its ``last_used_at`` was written (throttles those writes).
    token_touches: dict[str, float] = field(default_factory=dict)

    def should_touch_token(self, key: str, *, every_s: float = 60.0) -> bool:
        now = time.monotonic()
        if now - self.token_touches.get(key, -every_s) < every_s:
            return False
        if len(self.token_touches) > 10_000:
            self.token_touches.clear()  # bounded memory; worst case a few extra writes
        self.token_touches[key] = now
        return True

    # -- readiness ------------------------------------------------------------------------------
    def readiness(self) -> Any:
        """Run the readiness checks of :mod:`monitoring.health` (each bounded by its timeout)."""
        from monitoring import health

        try:
            self.output_root.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # the output_dir check reports it
        checks = health.standard_checks(
            broker=self.broker,
            database=self._database_at_head,
            output_dir=self.output_root,
            # The write gate's state, shared by every worker.
            output_roots=self._degraded_output_roots,
            # Only the SQLite broker keeps the unclean-exit marker (server brokers have no such record).
            unclean_exits=getattr(self.broker, "unclean_exits", None),
        )
        return health.ready(checks)

    def _degraded_output_roots(self) -> dict[str, str]:
        from monitoring.store import degraded_output_roots

        return degraded_output_roots(self.engine)

    def worker_slots(self) -> list[Any]:
        """The slots of every live supervisor (``monitoring.store.worker_slots_live``), by role and host."""
        from monitoring.store import worker_slots_live

        return worker_slots_live(self.engine, int(time.time() * 1000))

    def _database_at_head(self) -> str:
        from jobs.schema import check_database_at_head

        return f"at revision {check_database_at_head(self.engine)}"


def services() -> Services:
    """This app's :class:`Services`."""
    return current_app.extensions["tenure"]


def secret_key_from(env: dict[str, str] | os._Environ, var_dir: Path) -> str:
    """``TENURE_SECRET_KEY``, or a random key persisted in ``var/secret_key`` (mode 0600).

    Persisted, not per process: gunicorn's workers must all accept the same session cookies.
    """
    key = env.get("TENURE_SECRET_KEY")
    if key:
        return key
    path = var_dir / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    import secrets

    var_dir.mkdir(parents=True, exist_ok=True)
    candidate = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()  # another worker won the race
    with os.fdopen(fd, "w") as handle:
        handle.write(candidate)
    return candidate
